"""clef family: typed questions about pictures, in the d1 request format, on a vision-language pin.

A record of ``oracles/builtin/records/clef/requests.json``::

    {"id": "img_circle", "source": "image", "media": [{"image": "circle_red.png"}],
     "request": {"state": "...", "questions": {"red": {"type": "noul", "prompt": "..."}}},
     "gold": {"red": "true"}, "sha256": <canonical sha256 of {"media": ..., "request": ...}>}

``request``, ``gold`` and the question types are d1's (:mod:`oracles.families.d1.records`); ``media`` lists the
pictures, in the order their placeholders appear: ``{"image": FILE}`` or ``{"video": [FILE, ...]}``
(frames), files under ``oracles/builtin/images`` (sizes and digests from its ``manifest.json``). A
record holds images or one video, not both (mlx-vlm's Qwen3.5 reads one kind a prompt).

Arms (how a record's pictures reach the processor):

* ``text``: a record without media;
* ``g64``, ``g128``: each image resized to a square of that side (PIL BICUBIC) before the processor,
  so its patch grid is ``(1, side / patch, side / patch)`` (asserted against the engine's processor);
* ``native``: each image as drawn (sides multiples of ``patch * merge``, so the grid is
  ``(1, H / patch, W / patch)``);
* ``video``: the frames as drawn; grid ``(ceil(F / temporal), H / patch, W / patch)``.

A row (one question of one record in one arm) is one user turn: the pictures' placeholder text, then
the state and the question as d1 renders it (``Question.user_tail``), through the pin's chat template
with the generation prompt; its answer slot is the last position. Pictures are written out as a
processor writes them (one vision start, the pads, one vision end per image; per video group a
``<s seconds>`` timestamp first, as transformers' and mlx-vlm's Qwen3-VL processors do; several
images are introduced as ``Picture i:``).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from oracles.errors import FixtureError
from oracles.families.d1 import records as d1
from oracles.families.records import BUILTIN, RECORDS, canonical_sha256, load_record_list, require

REQUESTS = RECORDS / "clef" / "requests.json"
IMAGES = BUILTIN / "images"
#: Fixed square arms: side in pixels.
GRID_ARMS = {"g64": 64, "g128": 128}
IMAGE_ARMS = (*GRID_ARMS, "native")
ARM_KINDS = {"text": "text", "native": "image", "video": "video", **{a: "image" for a in GRID_ARMS}}
FIELDS = ("id", "source", "media", "request", "gold", "sha256", "expect_rejected", "note")


@dataclass(frozen=True)
class Picture:
    """One media entry: ``kind`` ``"image"`` or ``"video"``; ``files``: one file, or a video's frames;
    ``size``: ``(width, height)`` as drawn (every frame of a video has it)."""

    kind: str
    files: tuple[str, ...]
    size: tuple[int, int]


@dataclass(frozen=True)
class Record:
    """A parsed clef record: the d1 request, its pictures, and the arms it runs."""

    request: d1.Request
    media: tuple[Picture, ...]
    sha256: str

    @property
    def id(self) -> str:
        return self.request.id

    @property
    def kind(self) -> str:
        return self.media[0].kind if self.media else "text"

    @property
    def arms(self) -> tuple[str, ...]:
        return {"text": ("text",), "image": IMAGE_ARMS, "video": ("video",)}[self.kind]


def load_manifest(folder: Path = IMAGES) -> dict[str, dict[str, Any]]:
    """``manifest.json`` of the picture folder: file -> {"size": [w, h], "shows", "sha256"}.

    Raises:
        FixtureError: missing or malformed (path and field named).
    """
    from oracles.receipts.files import load_json

    obj = load_json(folder / "manifest.json")
    images = obj.get("images") if isinstance(obj, dict) else None
    if not isinstance(images, dict):
        raise FixtureError(f"{folder / 'manifest.json'}: field 'images' is missing or not an object")
    return images


def _picture(entry: Any, where: str, manifest: dict[str, dict[str, Any]]) -> Picture:
    if not isinstance(entry, dict) or len(entry) != 1 or next(iter(entry)) not in ("image", "video"):
        raise FixtureError(f"{where}: a media entry is {{\"image\": FILE}} or {{\"video\": [FILE, ...]}}, got {entry!r}")
    kind, value = next(iter(entry.items()))
    files = (value,) if kind == "image" else value
    if not isinstance(files, (list, tuple)) or not files or not all(isinstance(f, str) for f in files):
        raise FixtureError(f"{where}: field '{kind}' must name {'a file' if kind == 'image' else 'frame files'}")
    sizes: set[tuple[int, int]] = set()
    for f in files:
        if f not in manifest:
            raise FixtureError(f"{where}: picture {f!r} is not in {IMAGES / 'manifest.json'}")
        width, height = manifest[f]["size"]
        sizes.add((int(width), int(height)))
    if len(sizes) != 1:
        raise FixtureError(f"{where}: the frames of a video must share one size, got {sorted(sizes)}")
    return Picture(kind, tuple(files), sizes.pop())


def parse_record(rec: dict[str, Any], where: str, manifest: dict[str, dict[str, Any]]) -> Record:
    """One clef record (module docstring).

    Raises:
        FixtureError: a bad field, a sha256 that is not the record's, images mixed with video, more than
            one video, or a question the d1 parser refuses without the record declaring it.
    """
    media_raw = require(rec, "media", list, where)
    sha = require(rec, "sha256", str, where)
    actual = canonical_sha256({"media": media_raw, "request": rec.get("request")})
    if sha != actual:
        raise FixtureError(f"{where}: field 'sha256' is {sha} but media and request hash to {actual}")
    media = tuple(_picture(e, f"{where}: media[{i}]", manifest) for i, e in enumerate(media_raw))
    kinds = {p.kind for p in media}
    if len(kinds) > 1 or (kinds == {"video"} and len(media) > 1):
        raise FixtureError(f"{where}: field 'media' holds images or one video, not {[p.kind for p in media]}")
    d1_rec = {k: v for k, v in rec.items() if k in ("id", "source", "request", "gold", "expect_rejected")}
    request = d1.parse_request({**d1_rec, "sha256": canonical_sha256(rec.get("request"))}, where)
    return Record(request, media, sha)


def load_records(path: Path = REQUESTS, manifest: dict[str, dict[str, Any]] | None = None) -> list[Record]:
    """Every record of a clef requests file, parsed.

    Raises:
        FixtureError: see :func:`parse_record` and :func:`oracles.families.records.load_record_list`.
    """
    _, records = load_record_list(path, "records", family="clef", fields=FIELDS)
    manifest = load_manifest() if manifest is None else manifest
    return [parse_record(r, f"{path}: record {r['id']!r}", manifest) for r in records]


# -- grids and placeholder text ---------------------------------------------------------------
def expected_grid(picture: Picture, arm: str, patch: int, merge: int, temporal: int) -> tuple[int, int, int]:
    """The patch grid ``(t, h, w)`` the processor must choose for ``picture`` in ``arm``.

    Raises:
        FixtureError: the arm does not fit the picture's kind, or a native size that is not a multiple
            of ``patch * merge`` (the processor would resize it).
    """
    if ARM_KINDS.get(arm) != picture.kind:
        raise FixtureError(f"arm {arm!r} does not apply to a {picture.kind} ({picture.files[0]})")
    if arm in GRID_ARMS:
        side = GRID_ARMS[arm] // patch
        return (1, side, side)
    width, height = picture.size
    unit = patch * merge
    if width % unit or height % unit:
        raise FixtureError(f"{picture.files[0]}: size {width} x {height} is not a multiple of {unit} (patch {patch} "
                           f"x merge {merge}): the processor would resize it, so its native grid is not the drawn one")
    t = math.ceil(len(picture.files) / temporal) if picture.kind == "video" else 1
    return (t, height // patch, width // patch)


def group_seconds(frames: int, temporal: int, fps: float) -> list[float]:
    """Seconds of each temporal group of ``frames`` pre-sampled frames at ``fps``: the mean of its first
    and last frame's time, the last frame repeated to fill the last group (transformers'
    ``Qwen3VLProcessor._calculate_timestamps``, 5.24)."""
    idx = list(range(frames)) + [frames - 1] * (-frames % temporal)
    return [(idx[i] / fps + idx[i + temporal - 1] / fps) / 2 for i in range(0, len(idx), temporal)]


@dataclass(frozen=True)
class Tokens:
    """The special token strings a VL tokenizer writes pictures with."""

    start: str
    end: str
    image: str
    video: str


def media_text(pictures: Sequence[Picture], grids: Sequence[tuple[int, int, int]], tokens: Tokens, merge: int,
               temporal: int, fps: float) -> str:
    """The placeholder text of a row's pictures (module docstring), ending in a newline when not empty."""
    parts = []
    for i, (pic, (t, h, w)) in enumerate(zip(pictures, grids)):
        n = h * w // (merge * merge)
        if pic.kind == "image":
            block = tokens.start + tokens.image * n + tokens.end
            parts.append(f"Picture {i + 1}: {block}" if len(pictures) > 1 else block)
        else:
            secs = group_seconds(len(pic.files), temporal, fps)
            parts.append("".join(f"<{s:.1f} seconds>" + tokens.start + tokens.video * n + tokens.end for s in secs[:t]))
    return "".join(p + "\n" for p in parts)


def row_messages(record: Record, question: d1.Question, placeholders: str) -> list[dict[str, str]]:
    """The chat messages of one row: one user turn, pictures first."""
    return [{"role": "user", "content": placeholders + record.request.state + question.user_tail()}]


def picture_sha256(folder: Path, name: str, manifest: dict[str, dict[str, Any]]) -> None:
    """Refuse a picture file whose bytes are not the manifest's.

    Raises:
        FixtureError: missing file or a digest mismatch (file, expected and actual digest).
    """
    path = folder / name
    if not path.is_file():
        raise FixtureError(f"{path}: picture listed in the manifest is missing")
    got = hashlib.sha256(path.read_bytes()).hexdigest()
    if got != manifest[name]["sha256"]:
        raise FixtureError(f"{path}: sha256 {got} differs from the manifest's {manifest[name]['sha256']}")


def load_pictures(picture: Picture, arm: str, manifest: dict[str, dict[str, Any]], folder: Path = IMAGES) -> list[Any]:
    """The PIL RGB images of one media entry for ``arm`` (resized for the fixed-grid arms).

    Raises:
        FixtureError: see :func:`picture_sha256`.
    """
    from PIL import Image

    out = []
    for name in picture.files:
        picture_sha256(folder, name, manifest)
        with Image.open(folder / name) as im:
            image = im.convert("RGB")
        if arm in GRID_ARMS:
            image = image.resize((GRID_ARMS[arm], GRID_ARMS[arm]), Image.Resampling.BICUBIC)
        out.append(image)
    return out


def arm_sha256(record: Record, arm: str) -> str:
    """The comparable unit's request key of a record in an arm: sha256 of ``{"record", "arm"}`` (the
    record's sha256 covers its media and request), matched across receipts by ``oracles compare``."""
    return canonical_sha256({"record": record.sha256, "arm": arm})


def dump_record(rec: dict[str, Any]) -> dict[str, Any]:
    """``rec`` with its ``sha256`` set (for writing records by hand: ``json.dumps(dump_record(...))``)."""
    return {**rec, "sha256": canonical_sha256({"media": rec["media"], "request": rec["request"]})}


__all__ = ["ARM_KINDS", "GRID_ARMS", "IMAGE_ARMS", "Picture", "Record", "Tokens", "arm_sha256",
           "dump_record", "expected_grid", "group_seconds", "load_manifest", "load_pictures", "load_records",
           "media_text", "parse_record", "row_messages"]
