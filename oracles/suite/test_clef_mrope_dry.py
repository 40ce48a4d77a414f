"""The M-RoPE closed form (:mod:`oracles.checks.mrope`) without weights.

``dry``: planes written out by hand for small prompts (text only, one image, two images of other grids,
a two-group video), the rope delta and decode planes, every case the closed form refuses, and the
positive control that a one-position change is reported. Not dry (they import torch and mlx, no
weights): the closed form against the libraries' own position functions, transformers'
``Qwen3_5Model.get_rope_index`` (5.24) and mlx-vlm's ``LanguageModel.get_rope_index`` (0.7.10), on a
sweep of synthetic grids, each called unbound on a stub holding only the config fields it reads.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from oracles.checks.mrope import ClosedFormGap, Media, decode_planes, first_mismatches, mrope_planes, rope_delta

VS, VE, IMG, VID = 3, 4, 5, 6
MERGE = 2


def _block(pad: int, n: int) -> list[int]:
    return [VS, *[pad] * n, VE]


# -- dry: by hand --------------------------------------------------------------------------------
@pytest.mark.dry
@pytest.mark.clef
def test_text_only_is_arange() -> None:
    assert mrope_planes([9, 10, 11, 12], [], IMG, VID, MERGE).tolist() == [[0, 1, 2, 3]] * 3


@pytest.mark.dry
@pytest.mark.clef
def test_one_image_by_hand() -> None:
    """Grid (1, 4, 6): merged 2 x 3 = 6 pads starting at index 3; text resumes at 3 + max(2, 3) = 6."""
    ids = [20, 21, *_block(IMG, 6), 22]
    want = [[0, 1, 2, 3, 3, 3, 3, 3, 3, 6, 7],
            [0, 1, 2, 3, 3, 3, 4, 4, 4, 6, 7],
            [0, 1, 2, 3, 4, 5, 3, 4, 5, 6, 7]]
    planes = mrope_planes(ids, [Media("image", (1, 4, 6))], IMG, VID, MERGE)
    assert planes.tolist() == want
    assert rope_delta(planes) == 8 - 11  # max 7 + 1 - T
    assert decode_planes(11, 2, -3).tolist() == [[8, 9]] * 3


@pytest.mark.dry
@pytest.mark.clef
def test_two_images_other_grids_by_hand() -> None:
    """(1, 4, 6) -> 2 x 3 pads at index 2 (shift 6 - 3 = 3), then (1, 6, 2) -> 3 x 1 pads at index 11,
    placed from 11 - 3 = 8."""
    ids = [20, *_block(IMG, 6), 21, *_block(IMG, 3)]
    want = [[0, 1, 2, 2, 2, 2, 2, 2, 5, 6, 7, 8, 8, 8, 11],
            [0, 1, 2, 2, 2, 3, 3, 3, 5, 6, 7, 8, 9, 10, 11],
            [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 8, 8, 11]]
    media = [Media("image", (1, 4, 6)), Media("image", (1, 6, 2))]
    assert mrope_planes(ids, media, IMG, VID, MERGE).tolist() == want


@pytest.mark.dry
@pytest.mark.clef
def test_video_two_groups_by_hand() -> None:
    """(2, 2, 4): two groups of 1 x 2 pads, a one-token timestamp before each; temporal plane constant
    inside a group (Qwen3.5 splits the video grid per group)."""
    ids = [20, 30, *_block(VID, 2), 31, *_block(VID, 2), 21]
    want = [[0, 1, 2, 3, 3, 5, 6, 7, 8, 8, 10, 11],
            [0, 1, 2, 3, 3, 5, 6, 7, 8, 8, 10, 11],
            [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]]
    assert mrope_planes(ids, [Media("video", (2, 2, 4))], IMG, VID, MERGE).tolist() == want


@pytest.mark.dry
@pytest.mark.clef
@pytest.mark.parametrize("ids, media, says", [
    ([20, *_block(IMG, 4)], [Media("image", (2, 4, 4))], "t = 2"),
    ([20, *_block(IMG, 3)], [Media("image", (1, 3, 4))], "multiples of the spatial merge"),
    ([20, *_block(IMG, 5)], [Media("image", (1, 4, 4))], "= 4 tokens"),
    ([20, *_block(IMG, 4), *_block(IMG, 4)], [Media("image", (1, 4, 4))], "only 1 image block"),
    ([20, *_block(IMG, 4)], [Media("image", (1, 4, 4)), Media("image", (1, 4, 4))], "no run of pads left"),
    ([20, VS, VID, VID, VID, VID, VID, VID, VID, VID, VE], [Media("video", (2, 4, 4))], "8 pads"),
    ([20, VS, IMG, VID, VE], [Media("image", (1, 2, 2))], "mixing"),
    ([20, *_block(IMG, 4)], [Media("audio", (1, 4, 4))], "neither image nor video"),
], ids=["image-t2", "odd-h", "run-length", "extra-run", "missing-run", "groups-back-to-back", "mixed-run", "kind"])
def test_uncovered_grids_fail_saying_so(ids: list[int], media: list[Media], says: str) -> None:
    with pytest.raises(ClosedFormGap, match="closed form does not cover|neither image nor video") as exc:
        mrope_planes(ids, media, IMG, VID, MERGE)
    assert says in str(exc.value), str(exc.value)


@pytest.mark.dry
@pytest.mark.clef
def test_one_changed_position_is_reported() -> None:
    """Positive control: a plane off by one at one position fails with that position and both triples."""
    ids = [20, 21, *_block(IMG, 6), 22]
    want = mrope_planes(ids, [Media("image", (1, 4, 6))], IMG, VID, MERGE)
    got = want.copy()
    got[2, 5] += 1
    assert first_mismatches(want, want) == ""
    assert first_mismatches(got, want) == "1 of 11 positions differ; first: 5: (3, 3, 6) vs (3, 3, 5)"


# -- the libraries' own functions on synthetic grids (imports torch and mlx; no weights) ------------
#: (text before, [(kind, grid), ...], text after): single images across aspect ratios, two images,
#: videos of 1 to 3 groups, an image before a video, and a prompt without pictures.
SWEEP = [
    (3, [("image", (1, 2, 2))], 2), (1, [("image", (1, 4, 6))], 5), (4, [("image", (1, 6, 4))], 1),
    (2, [("image", (1, 8, 8))], 3), (2, [("image", (1, 2, 10))], 2), (2, [("image", (1, 10, 2))], 4),
    (5, [("image", (1, 4, 4)), ("image", (1, 8, 4))], 3), (1, [("image", (1, 6, 10)), ("image", (1, 2, 2))], 1),
    (2, [("video", (1, 4, 6))], 2), (3, [("video", (2, 4, 6))], 2), (1, [("video", (3, 2, 8))], 6),
    (2, [("image", (1, 4, 4)), ("video", (2, 2, 4))], 2), (6, [], 0),
]


def _prompt(before: int, media: list[tuple[str, tuple[int, int, int]]], after: int) -> list[int]:
    ids = list(range(100, 100 + before))
    for kind, (t, h, w) in media:
        n = h * w // MERGE ** 2
        for g in range(t):
            ids += ([200 + g] if kind == "video" else []) + _block(IMG if kind == "image" else VID, n)
        ids.append(150)
    return ids + list(range(300, 300 + after))


def _grids(media: list[tuple[str, tuple[int, int, int]]], kind: str) -> Any:
    rows = [list(g) for k, g in media if k == kind]
    return rows or None


@pytest.mark.clef
@pytest.mark.parametrize("case", SWEEP, ids=[f"case{i}" for i in range(len(SWEEP))])
def test_closed_form_equals_transformers_get_rope_index(case: Any) -> None:
    torch = pytest.importorskip("torch")
    from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5Model

    before, media, after = case
    ids = _prompt(before, media, after)
    # the methods read only the config and each other: a namespace stands in for the model
    stub: Any = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE)))
    stub.get_vision_position_ids = functools.partial(Qwen3_5Model.get_vision_position_ids, stub)
    types = torch.tensor([[1 if i == IMG else 2 if i == VID else 0 for i in ids]])
    grid = {k: (torch.tensor(g) if g else None) for k, g in (("image", _grids(media, "image")),
                                                            ("video", _grids(media, "video")))}
    lib, delta = Qwen3_5Model.get_rope_index(stub, torch.tensor([ids]), types, grid["image"], grid["video"])
    want = mrope_planes(ids, [Media(k, g) for k, g in media], IMG, VID, MERGE)
    got = lib[:, 0].numpy()
    assert not first_mismatches(got, want), f"transformers vs closed form: {first_mismatches(got, want)}"
    assert int(delta[0, 0]) == rope_delta(want)


@pytest.mark.clef
@pytest.mark.parametrize("case", SWEEP, ids=[f"case{i}" for i in range(len(SWEEP))])
def test_closed_form_equals_mlx_vlm_get_rope_index(case: Any) -> None:
    pytest.importorskip("mlx_vlm", reason="mlx-vlm is not installed")
    import mlx.core as mx
    from mlx_vlm.models.qwen3_5.language import LanguageModel

    before, media, after = case
    ids = _prompt(before, media, after)
    stub: Any = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(spatial_merge_size=MERGE),
                                                       image_token_id=IMG, video_token_id=VID, vision_start_token_id=VS))
    grid = {k: (mx.array(g) if g else None) for k, g in (("image", _grids(media, "image")), ("video", _grids(media, "video")))}
    lib, delta = LanguageModel.get_rope_index(stub, mx.array([ids]), grid["image"], grid["video"])
    lib = np.array(lib)
    lib = lib[:, 0] if lib.ndim == 3 else np.broadcast_to(lib[0], (3, lib.shape[-1]))
    want = mrope_planes(ids, [Media(k, g) for k, g in media], IMG, VID, MERGE)
    assert not first_mismatches(lib, want), f"mlx-vlm vs closed form: {first_mismatches(lib, want)}"
    assert int(np.array(delta).reshape(-1)[0]) == rope_delta(want)
