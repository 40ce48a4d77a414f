"""The M-RoPE position planes of a Qwen3.5 vision-language prompt in closed form. Pure numpy, no pytest.

Source: transformers 5.24.0, ``transformers/models/qwen3_5/modeling_qwen3_5.py``,
``Qwen3_5Model.get_rope_index`` and ``Qwen3_5Model.get_vision_position_ids`` (the pinned version of
this project; the conventions below changed across versions and models, see the end).

Notation. ``ids`` has ``T`` tokens. Each *vision block* is a maximal run of image-pad (or video-pad)
tokens; block ``b`` covers indices ``a_b .. a_b + n_b - 1`` and carries a merged grid ``H'_b x W'_b``
(the processor's patch grid ``h x w`` divided by the spatial merge ``m``), with ``n_b = H'_b * W'_b``.
An image of grid ``(1, h, w)`` is one block. A video of grid ``(t, h, w)`` is ``t`` blocks, one per
temporal patch group, each of grid ``(1, h, w)``: Qwen3.5 splits ``video_grid_thw`` with
``repeat_interleave`` and its processor writes a text timestamp ``<s seconds>`` between the groups,
so each group is its own run of pads. Let ``S(i)`` be the *shift* before index ``i``: the sum over the
blocks that end before ``i`` of ``n_b - max(H'_b, W'_b)``. Then, on the three planes (temporal,
height, width):

* a text token at index ``i`` (every token that is not a pad, vision start/end included) is at
  ``(i - S(i), i - S(i), i - S(i))``;
* the ``k``-th token of block ``b`` (``k = 0 .. n_b - 1``, row-major over ``H'_b x W'_b``), with the
  block's start ``s_b = a_b - S(a_b)``, is at ``(s_b, s_b + k // W'_b, s_b + k % W'_b)``;

so text after a block resumes at ``s_b + max(H'_b, W'_b)``, and the rope delta a decode step adds to
its cache length on all three planes is ``delta = max over all planes and positions + 1 - T`` (that is
``-S(T)`` when the prompt ends in text). A text-only prompt gives ``(i, i, i)`` and delta 0.

Not covered, refused with :class:`ClosedFormGap` (never a silent pass): an image grid with ``t != 1``;
a grid whose ``h`` or ``w`` is not a multiple of the merge size; runs of pads that do not match the
grids in count or length (two groups written back to back without text between them form one run);
a prompt mixing image and video pads inside one run.

Other versions: Qwen2-VL / Qwen2.5-VL (``Qwen2VLModel.get_rope_index``, transformers 4.x) find a
block by the token after ``<|vision_start|>`` and keep a video as one block whose temporal plane
advances inside it (Qwen2.5-VL by ``second_per_grid_t * tokens_per_second`` per group); Qwen3-VL and
Qwen3.5 instead write one block per group with a timestamp between, temporal plane constant inside a
block. For ``t = 1`` grids both give the planes above.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


class ClosedFormGap(ValueError):
    """The prompt or a grid lies outside what the closed form covers (the message says which)."""


@dataclass(frozen=True)
class Media:
    """One picture as the processor gridded it: ``kind`` ``"image"`` or ``"video"``, and its patch
    grid ``(t, h, w)`` (``image_grid_thw`` / ``video_grid_thw`` row) before the spatial merge."""

    kind: str
    grid: tuple[int, int, int]


@dataclass(frozen=True)
class Block:
    """A run of pads: indices ``start .. start + length - 1``, merged grid ``rows x cols``, and which
    media item (index into the media list) and temporal group it belongs to."""

    start: int
    length: int
    rows: int
    cols: int
    media: int
    group: int


def pad_runs(ids: Sequence[int], pad_ids: Sequence[int]) -> list[tuple[int, int, int]]:
    """Maximal runs of pad tokens as ``(start, length, pad id)``, in order.

    Raises:
        ClosedFormGap: a run mixes two pad ids (image and video pads with nothing between them).
    """
    a = np.asarray(ids, dtype=np.int64)
    is_pad = np.isin(a, np.asarray(pad_ids, dtype=np.int64))
    runs: list[tuple[int, int, int]] = []
    i, n = 0, len(a)
    while i < n:
        if not is_pad[i]:
            i += 1
            continue
        j = i
        while j < n and is_pad[j]:
            j += 1
        kinds = {int(v) for v in a[i:j]}
        if len(kinds) > 1:
            raise ClosedFormGap(f"closed form does not cover a run of pads mixing ids {sorted(kinds)} at {i}..{j - 1}")
        runs.append((i, j - i, int(a[i])))
        i = j
    return runs


def blocks(ids: Sequence[int], media: Sequence[Media], image_id: int, video_id: int, merge: int) -> list[Block]:
    """Match the pad runs of ``ids`` to ``media`` (in placeholder order, images and videos each in
    their own order, as the libraries consume ``image_grid_thw`` and ``video_grid_thw``).

    Raises:
        ClosedFormGap: see the module docstring (the media item, its grid and the runs named).
    """
    expected: dict[int, list[tuple[int, int, int, int]]] = {image_id: [], video_id: []}
    for m, item in enumerate(media):
        t, h, w = (int(v) for v in item.grid)
        if item.kind not in ("image", "video"):
            raise ClosedFormGap(f"media {m}: kind {item.kind!r} is neither image nor video")
        if h % merge or w % merge or min(t, h, w) < 1:
            raise ClosedFormGap(f"closed form does not cover media {m} ({item.kind}) grid {[t, h, w]}: h and w must "
                                f"be positive multiples of the spatial merge {merge}")
        if item.kind == "image" and t != 1:
            raise ClosedFormGap(f"closed form does not cover media {m}: an image grid with t = {t} (an image has t = 1)")
        pad = image_id if item.kind == "image" else video_id
        expected[pad].extend((m, g, h // merge, w // merge) for g in range(t))
    runs = pad_runs(ids, (image_id, video_id))
    out: list[Block] = []
    taken = {image_id: 0, video_id: 0}
    for start, length, pad in runs:
        queue = expected[pad]
        if taken[pad] >= len(queue):
            raise ClosedFormGap(f"closed form does not cover the run of {length} pads (id {pad}) at {start}: the media "
                                f"list has only {len(queue)} {'image' if pad == image_id else 'video'} block(s)")
        m, g, rows, cols = queue[taken[pad]]
        taken[pad] += 1
        if length != rows * cols:
            raise ClosedFormGap(f"closed form does not cover the run of {length} pads at {start}: media {m} group {g} "
                                f"has a merged grid {rows} x {cols} = {rows * cols} tokens")
        out.append(Block(start, length, rows, cols, m, g))
    for pad, queue in expected.items():
        if taken[pad] != len(queue):
            m, g = queue[taken[pad]][:2]
            raise ClosedFormGap(f"closed form does not cover media {m} group {g}: no run of pads left for it "
                                f"({taken[pad]} of {len(queue)} blocks of pad id {pad} found in the ids)")
    return out


def mrope_planes(ids: Sequence[int], media: Sequence[Media], image_id: int, video_id: int,
                 merge: int) -> np.ndarray:
    """The position planes ``[3, T]`` int64 (temporal, height, width) of the module docstring.

    Raises:
        ClosedFormGap: the prompt is outside the closed form (see :func:`blocks`).
    """
    T = len(ids)
    pos = np.broadcast_to(np.arange(T, dtype=np.int64), (3, T)).copy()
    shift = 0
    cursor = 0
    for b in blocks(ids, media, image_id, video_id, merge):
        pos[:, cursor:b.start] = np.arange(cursor, b.start, dtype=np.int64) - shift
        s = b.start - shift
        k = np.arange(b.length, dtype=np.int64)
        pos[0, b.start:b.start + b.length] = s
        pos[1, b.start:b.start + b.length] = s + k // b.cols
        pos[2, b.start:b.start + b.length] = s + k % b.cols
        shift += b.length - max(b.rows, b.cols)
        cursor = b.start + b.length
    pos[:, cursor:] = np.arange(cursor, T, dtype=np.int64) - shift
    return pos


def rope_delta(planes: np.ndarray) -> int:
    """``max(planes) + 1 - T``: what a decode step adds to its cache length on all three planes
    (``mrope_position_deltas`` of ``get_rope_index``)."""
    p = np.asarray(planes)
    return int(p.max()) + 1 - int(p.shape[-1])


def decode_planes(cache_length: int, new: int, delta: int) -> np.ndarray:
    """Planes ``[3, new]`` of ``new`` tokens decoded after a prefix of ``cache_length`` positions:
    ``cache_length + j + delta`` on every plane (``Qwen3_5Model.compute_3d_position_ids`` with a cache)."""
    row = np.arange(cache_length, cache_length + new, dtype=np.int64) + int(delta)
    return np.broadcast_to(row, (3, new)).copy()


def first_mismatches(actual: np.ndarray, expected: np.ndarray, limit: int = 6) -> str:
    """The first ``limit`` positions where two ``[3, T]`` plane arrays differ, each as
    ``i: (t, h, w) vs (t, h, w)``, plus the count; ``""`` when equal.

    Raises:
        ValueError: the shapes differ.
    """
    a, e = np.asarray(actual), np.asarray(expected)
    if a.shape != e.shape:
        raise ValueError(f"position planes of shape {list(a.shape)} vs {list(e.shape)}")
    cols = np.flatnonzero((a != e).any(axis=0))
    if cols.size == 0:
        return ""
    shown = "; ".join(f"{int(i)}: {tuple(int(v) for v in a[:, i])} vs {tuple(int(v) for v in e[:, i])}"
                      for i in cols[:limit])
    return f"{cols.size} of {a.shape[-1]} positions differ; first: {shown}"


__all__ = ["Block", "ClosedFormGap", "Media", "blocks", "decode_planes", "first_mismatches", "mrope_planes",
           "pad_runs", "rope_delta"]
