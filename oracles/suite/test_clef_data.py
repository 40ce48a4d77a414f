"""clef's data: records, arms and placeholder text without weights or pictures decoded (dry); the
committed pictures against their drawing script (PIL); the twin built twice to its pin's bytes (slow)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.errors import FixtureError
from oracles.families.clef import records as clef
from oracles.families.clef.run import all_rows

pytestmark = pytest.mark.clef

MANIFEST = clef.load_manifest()
DOC = json.loads(clef.REQUESTS.read_text())
TOKENS = clef.Tokens("<S>", "<E>", "<I>", "<V>")


def _rec(rid: str) -> dict[str, Any]:
    return copy.deepcopy(next(r for r in DOC["records"] if r["id"] == rid))


@pytest.mark.dry
def test_records_cover_every_kind_and_arm() -> None:
    """Text, one image, two images of different native grids, videos of 2 and 4 frames; every arm."""
    records = {r.id: r for r in clef.load_records()}
    kinds = {(r.kind, len(r.media), len(r.media[0].files) if r.media else 0) for r in records.values()}
    assert {("text", 0, 0), ("image", 1, 1), ("image", 2, 1), ("video", 1, 2), ("video", 1, 4)} <= kinds
    pair = next(r for r in records.values() if len(r.media) == 2)
    assert len({clef.expected_grid(p, "native", 16, 2, 2) for p in pair.media}) == 2
    arms = {row.arm for row in all_rows(list(records.values()))}
    assert arms == {"text", "g64", "g128", "native", "video"}


@pytest.mark.dry
@pytest.mark.parametrize("picture, arm, grid", [
    (clef.Picture("image", ("a.png",), (96, 64)), "g64", (1, 4, 4)),
    (clef.Picture("image", ("a.png",), (96, 64)), "g128", (1, 8, 8)),
    (clef.Picture("image", ("a.png",), (96, 64)), "native", (1, 4, 6)),
    (clef.Picture("video", ("a.png", "b.png"), (96, 64)), "video", (1, 4, 6)),
    (clef.Picture("video", ("a.png", "b.png", "c.png"), (64, 32)), "video", (2, 2, 4)),
])
def test_expected_grid(picture: clef.Picture, arm: str, grid: tuple[int, int, int]) -> None:
    assert clef.expected_grid(picture, arm, 16, 2, 2) == grid


@pytest.mark.dry
@pytest.mark.parametrize("picture, arm, says", [
    (clef.Picture("image", ("a.png",), (100, 64)), "native", "not a multiple of 32"),
    (clef.Picture("image", ("a.png",), (96, 64)), "video", "does not apply"),
    (clef.Picture("video", ("a.png",), (96, 64)), "g64", "does not apply"),
])
def test_expected_grid_refuses(picture: clef.Picture, arm: str, says: str) -> None:
    with pytest.raises(FixtureError, match=says):
        clef.expected_grid(picture, arm, 16, 2, 2)


@pytest.mark.dry
def test_placeholder_text_by_hand() -> None:
    """One image: start, pads, end; two images: ``Picture i:``; a video: a timestamp before each group."""
    img = clef.Picture("image", ("a.png",), (96, 64))
    assert clef.media_text([img], [(1, 4, 6)], TOKENS, 2, 2, 2.0) == "<S>" + "<I>" * 6 + "<E>\n"
    two = clef.media_text([img, img], [(1, 2, 2), (1, 2, 4)], TOKENS, 2, 2, 2.0)
    assert two == "Picture 1: <S><I><E>\nPicture 2: <S><I><I><E>\n"
    vid = clef.Picture("video", ("a", "b", "c", "d"), (64, 32))
    assert clef.media_text([vid], [(2, 2, 4)], TOKENS, 2, 2, 2.0) == "<0.2 seconds><S><V><V><E><1.2 seconds><S><V><V><E>\n"
    assert clef.group_seconds(3, 2, 2.0) == [0.25, 1.0]  # the last frame repeated to fill the last group


@pytest.mark.dry
@pytest.mark.parametrize("edit, says", [
    (lambda r: r.update(sha256="0" * 64), "field 'sha256'"),
    (lambda r: r["media"].append({"video": ["move_0.png", "move_1.png"]}), "holds images or one video"),
    (lambda r: r["media"].__setitem__(0, {"image": "nope.png"}), "'nope.png' is not in"),
    (lambda r: r["media"].__setitem__(0, {"video": ["circle_red.png", "square_blue.png"]}), "share one size"),
    (lambda r: r["media"].__setitem__(0, {"picture": "circle_red.png"}), "a media entry is"),
    (lambda r: r["request"]["questions"]["red"].update(type="bool"), "field 'questions.red.type'"),
], ids=["sha256", "image-and-video", "unknown-file", "frame-sizes", "media-key", "question-type"])
def test_bad_record_is_refused_by_field(edit: Any, says: str) -> None:
    rec = _rec("img_circle")
    edit(rec)
    if "sha256" not in says:
        rec = clef.dump_record({k: v for k, v in rec.items() if k != "sha256"})
    with pytest.raises(FixtureError, match=says) as exc:
        clef.parse_record(rec, "requests.json: record 'img_circle'", MANIFEST)
    assert "record 'img_circle'" in str(exc.value)


@pytest.mark.dry
def test_arm_sha256_differs_by_arm_and_record() -> None:
    records = clef.load_records()
    keys = {clef.arm_sha256(r, a) for r in records for a in r.arms}
    assert len(keys) == sum(len(r.arms) for r in records)


def test_pictures_redraw_to_the_committed_pixels(tmp_path: Path) -> None:
    """``draw.py`` redraws every committed picture pixel for pixel; the manifest's sizes and digests are
    the committed files'."""
    from PIL import Image

    from oracles.builtin.images import draw

    fresh = draw.draw_all(tmp_path)
    assert sorted(fresh["images"]) == sorted(MANIFEST)
    for name, entry in MANIFEST.items():
        clef.picture_sha256(clef.IMAGES, name, MANIFEST)
        with Image.open(clef.IMAGES / name) as a, Image.open(tmp_path / name) as b:
            assert list(a.size) == entry["size"] == fresh["images"][name]["size"], name
            assert np.array_equal(np.asarray(a.convert("RGB")), np.asarray(b.convert("RGB"))), f"{name}: pixels differ"


@pytest.mark.slow
def test_twin_builds_twice_to_the_pinned_bytes(tmp_path: Path) -> None:
    """``oracles materialize`` of the VL twin, twice into empty folders: each build verifies against the
    committed pin (every file's bytes and sha256) and the two are byte-identical file by file."""
    import filecmp

    from oracles.families import BY_NAME
    from oracles.pins.materialize import materialize
    from oracles.pins.pin import load_pin

    pin = load_pin(BY_NAME["clef"].default_pins[0])
    built = [materialize(pin, tmp_path / name) for name in ("one", "two")]
    assert all(b["built"] and b["digest"] == pin.digest for b in built), built
    for name in pin.files:
        assert filecmp.cmp(tmp_path / "one" / name, tmp_path / "two" / name, shallow=False), f"{name}: the builds differ"
