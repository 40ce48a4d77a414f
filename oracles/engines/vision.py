"""What vision-language engines share at the numpy boundary: the model's vision facts, the per-picture
taps of a forward, and the checks every VL adapter applies to a prompt before it runs. Numpy only.

A VL prompt (:class:`oracles.engines.base.Prompt`) carries its ids already expanded, as a processor
writes them: per image ``<|vision_start|>`` + ``n`` image pads + ``<|vision_end|>``; per video, per
temporal group, a text timestamp then ``<|vision_start|>`` + ``n`` video pads + ``<|vision_end|>``.
The engine runs its own processor on the pixels; the pads of each picture must match the grid that
processor chooses (:func:`check_pads`), or the forward is refused naming the picture and both counts.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Step


@dataclass(frozen=True)
class VisionSpec:
    """A VL snapshot's vision facts, from its ``config.json`` (top level and ``vision_config``).

    ``patch``: patch side in pixels; ``merge``: spatial merge (a text token covers ``merge x merge``
    patches); ``temporal``: frames per temporal patch; the special token ids; ``fps``: frames per
    second the video processor assumes for pre-sampled frames (its config's ``fps``)."""

    patch: int
    merge: int
    temporal: int
    image_id: int
    video_id: int
    start_id: int
    end_id: int
    fps: float = 2.0

    @classmethod
    def from_config(cls, config: dict[str, Any], video_processor: dict[str, Any] | None = None) -> VisionSpec:
        """Read a transformers VL ``config.json`` (and ``video_preprocessor_config.json``'s ``fps``).

        Raises:
            KeyError: a field is missing (its name).
        """
        v = config["vision_config"]
        return cls(patch=int(v["patch_size"]), merge=int(v["spatial_merge_size"]), temporal=int(v["temporal_patch_size"]),
                   image_id=int(config["image_token_id"]), video_id=int(config["video_token_id"]),
                   start_id=int(config["vision_start_token_id"]), end_id=int(config["vision_end_token_id"]),
                   fps=float((video_processor or {}).get("fps", 2.0)))

    def tokens(self, grid: Sequence[int]) -> int:
        """Text tokens a picture of patch grid ``(t, h, w)`` takes: ``t * h * w / merge^2``."""
        t, h, w = (int(v) for v in grid)
        return t * h * w // (self.merge * self.merge)


@dataclass(frozen=True)
class MediaRun:
    """One picture as a forward consumed it.

    ``kind``: ``"image"`` or ``"video"``; ``grid``: the processor's patch grid ``(t, h, w)``;
    ``tower``: ``[t * h * w / merge^2, D]`` float32, the vision tower's output rows for it (after the
    merger: what is scattered over its pads); ``pixels``: the processor's float32 pixel rows for it
    (``[t * h * w, C * temporal * patch^2]``)."""

    kind: str
    grid: tuple[int, int, int]
    tower: np.ndarray
    pixels: np.ndarray


@dataclass
class VisionStep(Step):
    """A :class:`~oracles.engines.base.Step` of a VL engine, with the vision taps.

    ``media``: one :class:`MediaRun` per picture of the prompt (images first, then videos, each in
    placeholder order; empty for text); ``down_in_absmax``: ``[L]`` float32, max |x| of each decoder
    layer's MLP down-projection input over this forward, where the engine taps it (else None)."""

    media: tuple[MediaRun, ...] = ()
    down_in_absmax: np.ndarray | None = None


def pixel_digest(rows: Any) -> dict[str, Any]:
    """``{"shape", "sha256"}`` of pixel rows as little-endian float32 (not a fingerprint: no
    finiteness refusal is needed for normalised pixels)."""
    a = np.ascontiguousarray(np.asarray(rows, dtype="<f4"))
    return {"shape": list(a.shape), "sha256": hashlib.sha256(a.tobytes()).hexdigest()}


def mm_token_types(ids: Sequence[int], spec: VisionSpec) -> np.ndarray:
    """``[T]`` int64: 0 text, 1 image pad, 2 video pad: transformers'
    ``ProcessorMixin.create_mm_token_type_ids`` rule (5.24), which ``get_rope_index`` groups by."""
    a = np.asarray(ids, dtype=np.int64)
    return np.where(a == spec.image_id, 1, np.where(a == spec.video_id, 2, 0)).astype(np.int64)


def check_pads(ids: Sequence[int], spec: VisionSpec, image_grids: Sequence[Sequence[int]],
               video_grids: Sequence[Sequence[int]], engine: str) -> None:
    """Refuse a prompt whose pads do not match the processor's grids: the image pads must number
    ``sum(tokens(grid))`` over the image grids, the video pads likewise (per picture the closed-form
    check later tells which block differs).

    Raises:
        ValueError: naming the engine, the kind, both counts and the grids.
    """
    a = np.asarray(ids, dtype=np.int64)
    for kind, pad, grids in (("image", spec.image_id, image_grids), ("video", spec.video_id, video_grids)):
        want = sum(spec.tokens(g) for g in grids)
        have = int((a == pad).sum())
        if want != have:
            raise ValueError(f"{engine}: the prompt has {have} {kind} pads but its processor gridded the {kind}s as "
                             f"{[list(map(int, g)) for g in grids]} = {want} tokens (merge {spec.merge})")


def split_rows(rows: np.ndarray, grids: Sequence[Sequence[int]], spec: VisionSpec) -> list[np.ndarray]:
    """Split a tower output ``[sum n_i, D]`` into one ``[n_i, D]`` block per grid, in order.

    Raises:
        ValueError: the row count is not the sum of the grids' token counts.
    """
    sizes = [spec.tokens(g) for g in grids]
    if rows.shape[0] != sum(sizes):
        raise ValueError(f"vision tower gave {rows.shape[0]} rows for grids {[list(g) for g in grids]} ({sum(sizes)} tokens)")
    return list(np.split(rows, np.cumsum(sizes)[:-1])) if sizes else []


__all__ = ["MediaRun", "VisionSpec", "VisionStep", "check_pads", "mm_token_types", "pixel_digest", "split_rows"]
