"""Draw the clef family's pictures and write their manifest: ``python -m oracles.builtin.images.draw``.

Each picture is drawn with PIL on a white RGB canvas from filled shapes (``ImageDraw.ellipse``,
``rectangle``, ``polygon``) and text in PIL's built-in bitmap font (``ImageFont.load_default_imagefont``:
no FreeType, so the pixels do not depend on a font library's version), then saved as PNG. Sizes are
multiples of 32 pixels on each side (patch 16 x merge 2 of the Qwen3.5 twin), so the processors of
both engines keep a picture at the size it was drawn (the ``native`` arm) and every grid is exact.

``manifest.json`` lists each file's size ``[width, height]``, what it shows, and the sha256 of its PNG
bytes; the clef family reads sizes from it (no PIL at collection) and refuses a file whose bytes differ.
Re-drawing gives the same pixels (checked by ``oracles/suite/test_clef_images.py``); PNG bytes may differ
across zlib versions, so the manifest is rewritten only by this script.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
MANIFEST = HERE / "manifest.json"
RED, BLUE, GREEN, BLACK = (220, 30, 30), (30, 60, 220), (30, 160, 60), (0, 0, 0)


def _canvas(width: int, height: int) -> tuple[Any, Any]:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (255, 255, 255))
    return image, ImageDraw.Draw(image)


def circle_red() -> Any:
    """96 x 64: a red circle in the left half."""
    image, draw = _canvas(96, 64)
    draw.ellipse([8, 12, 48, 52], fill=RED)
    return image


def square_blue() -> Any:
    """64 x 128: a blue square in the top half."""
    image, draw = _canvas(64, 128)
    draw.rectangle([12, 12, 52, 52], fill=BLUE)
    return image


def word_cat() -> Any:
    """128 x 64: the word CAT in black bitmap letters, drawn at 4x and scaled down by whole pixels."""
    from PIL import Image, ImageFont

    small, draw = _canvas(32, 16)
    draw.text((6, 2), "CAT", fill=BLACK, font=ImageFont.load_default_imagefont())
    return small.resize((128, 64), Image.Resampling.NEAREST)


def triangle_green() -> Any:
    """160 x 96: a green triangle on the right."""
    image, draw = _canvas(160, 96)
    draw.polygon([(100, 80), (150, 80), (125, 16)], fill=GREEN)
    return image


def moving_circle(frame: int) -> Callable[[], Any]:
    """96 x 64 frame ``frame`` of 4: a red circle moving from left to right, 16 pixels a frame."""
    def draw_frame() -> Any:
        image, draw = _canvas(96, 64)
        x = 6 + 16 * frame
        draw.ellipse([x, 20, x + 24, 44], fill=RED)
        return image
    draw_frame.__doc__ = f"96 x 64: frame {frame} of a red circle moving right"
    return draw_frame


PICTURES: dict[str, Callable[[], Any]] = {
    "circle_red.png": circle_red, "square_blue.png": square_blue, "word_cat.png": word_cat,
    "triangle_green.png": triangle_green, **{f"move_{i}.png": moving_circle(i) for i in range(4)},
}


def draw_all(folder: Path = HERE) -> dict[str, Any]:
    """Draw every picture into ``folder`` and return the manifest (also written there)."""
    entries = {}
    for name, fn in PICTURES.items():
        image = fn()
        path = folder / name
        image.save(path, format="PNG")
        entries[name] = {"size": list(image.size), "shows": (fn.__doc__ or "").strip(),
                         "sha256": hashlib.sha256(path.read_bytes()).hexdigest()}
    manifest = {"what": "pictures of the clef family, drawn by oracles/builtin/images/draw.py", "images": entries}
    (folder / MANIFEST.name).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


if __name__ == "__main__":
    print(json.dumps(draw_all(), indent=1))
