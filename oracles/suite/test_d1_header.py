"""The safetensors header proof (oracles.checks.header) on the real snapshot, and on small files
written here that are truncated or corrupted (each failure must name the tensor)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from oracles.checks.header import TORCH_TO_CODE, compare_to_model, tile_problems
from oracles.errors import PinError
from oracles.pins.pin import Pin, safetensors_header
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.d1]


def _weights(pin: Pin) -> str:
    """The pin's one safetensors file (a sharded snapshot's headers are checked by ``verify_snapshot``)."""
    files = sorted(pin.safetensors_headers)
    if len(files) != 1:
        pytest.skip(f"pin {pin.name}: {len(files)} safetensors files; the header proofs read a single-file snapshot")
    return files[0]


def _proof(path: Path) -> tuple[list[str], dict[str, Any], dict[str, Any]]:
    n, header, _ = safetensors_header(path)
    problems, figures = tile_problems(header, n, path.stat().st_size)
    return problems, figures, header


@pytest.mark.slow
def test_header_tiles_file(verified_snapshot: Callable[[str], Path], pin: str, pin_file: Pin, receipt: Receipt) -> None:
    """The snapshot's header parses; the data regions tile the buffer; 8 + N + last end == file size."""
    path = verified_snapshot(pin) / _weights(pin_file)
    problems, figures, header = _proof(path)
    receipt.update(figures, metadata=header.get("__metadata__"))
    assert not problems, f"{path}: {len(problems)} header problems; first: {problems[0]}"
    assert figures["tensors"] > 0, f"{path}: the header lists no tensor"
    assert 8 + figures["header_bytes"] + figures["data_bytes"] == figures["file_bytes"]


@pytest.mark.slow
def test_header_matches_meta_build(verified_snapshot: Callable[[str], Path], pin: str, pin_file: Pin,
                                   receipt: Receipt) -> None:
    """Tensor names, dtypes and shapes equal a meta-device build of the pin's model class; the
    tied lm_head is reported tied (present in the model, absent from the file)."""
    import torch
    import transformers

    root = verified_snapshot(pin)
    weights = _weights(pin_file)
    config = transformers.AutoConfig.from_pretrained(root)
    with torch.device("meta"):
        model = getattr(transformers, pin_file.model_class)(config)
    model_tensors = {k: (TORCH_TO_CODE[str(v.dtype).removeprefix("torch.")], tuple(v.shape))
                     for k, v in model.state_dict().items()}
    out_w, in_w = model.get_output_embeddings().weight, model.get_input_embeddings().weight
    tied_now = out_w is in_w
    tied = {k: v for k, v in (getattr(model, "_tied_weights_keys", None) or {}).items()} if tied_now else {}
    _, header, _ = safetensors_header(root / weights)
    cmp = compare_to_model(header, model_tensors, tied)
    receipt.update(cmp, model_class=f"{type(model).__module__}.{type(model).__name__}", lm_head_tied=tied_now,
                   tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)))
    assert cmp["equal"], (f"header vs meta build of {pin_file.model_class}: missing in model {cmp['missing_in_model'][:3]}, "
                          f"not in header {cmp['not_in_header'][:3]}, shapes {cmp['shape_differences'][:3]}, "
                          f"dtypes {cmp['dtype_differences'][:3]}, tied but stored {cmp['tied_in_header']}")
    assert tied_now == bool(config.tie_word_embeddings), f"lm_head tied {tied_now}, config says {config.tie_word_embeddings}"
    assert cmp["matched"] == cmp["header_tensors"], f"{cmp['matched']} of {cmp['header_tensors']} tensors matched"


# -- small files written here ----------------------------------------------------------------------
def _write(path: Path) -> Path:
    """Three float32 tensors in the safetensors layout (8-byte little-endian header length, the JSON
    header padded with spaces to 8 bytes, the data in header order): byte for byte what
    ``safetensors.numpy.save_file`` writes for these tensors (compared with safetensors 0.8.0), written by
    hand so the dry tests need numpy only (safetensors is not a dependency of the plugin)."""
    tensors = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "b.bias": np.ones(4, np.float32),
               "c.scale": np.zeros((1,), np.float32)}
    header, data, at = {}, b"", 0
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        data, at = data + a.astype("<f4").tobytes(), at + a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + data)
    return path


def _rewrite_header(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    edit(header)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n:])


@pytest.mark.dry
def test_header_proof_holds_on_a_good_file(tmp_path: Path) -> None:
    problems, figures, _ = _proof(_write(tmp_path / "good.safetensors"))
    assert problems == [], problems
    assert figures["tensors"] == 3 and figures["data_bytes"] == 4 * (6 + 4 + 1)


@pytest.mark.dry
def test_truncated_file_names_the_tensor(tmp_path: Path) -> None:
    path = _write(tmp_path / "cut.safetensors")
    _, _, header = _proof(path)
    last = max((k for k in header if k != "__metadata__"), key=lambda k: header[k]["data_offsets"][1])
    path.write_bytes(path.read_bytes()[:-2])
    problems, _, _ = _proof(path)
    assert problems and f"tensor {last!r}" in problems[0] and "truncated" in problems[0], problems


@pytest.mark.dry
def test_gap_and_overlap_name_the_tensor(tmp_path: Path) -> None:
    path = _write(tmp_path / "gap.safetensors")

    def shift(h: dict[str, Any]) -> None:  # c.scale's region moved 4 bytes later: a gap before it
        b, e = h["c.scale"]["data_offsets"]
        h["c.scale"]["data_offsets"] = [b + 4, e + 4]

    _rewrite_header(path, shift)
    problems, _, _ = _proof(path)
    assert any("tensor 'c.scale'" in p and "gap" in p for p in problems), problems

    path = _write(tmp_path / "overlap.safetensors")
    _rewrite_header(path, lambda h: h["b.bias"].__setitem__("shape", [5]))  # 20 bytes declared, 16 stored
    problems, _, _ = _proof(path)
    assert any("tensor 'b.bias'" in p and "needs 20" in p for p in problems), problems


@pytest.mark.dry
def test_trailing_bytes_are_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "tail.safetensors")
    path.write_bytes(path.read_bytes() + b"\0" * 8)
    problems, _, _ = _proof(path)
    assert problems and "!= file size" in problems[-1], problems


@pytest.mark.dry
def test_corrupted_header_is_a_clear_error(tmp_path: Path) -> None:
    path = _write(tmp_path / "bad.safetensors")
    raw = bytearray(path.read_bytes())
    raw[9] = ord("#")  # inside the JSON
    path.write_bytes(bytes(raw))
    with pytest.raises(PinError, match="bad.safetensors: safetensors header is not JSON"):
        safetensors_header(path)


@pytest.mark.dry
def test_compare_to_model_reports_differences() -> None:
    header = {"__metadata__": {}, "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}}
    same = compare_to_model(header, {"w": ("F32", (2, 3)), "head": ("F32", (2, 3))}, {"head": "w"})
    assert same["equal"] and same["matched"] == 1
    bad = compare_to_model(header, {"w": ("F32", (3, 2)), "extra": ("F16", (1,))}, {})
    assert bad["shape_differences"] == ["w"] and bad["not_in_header"] == ["extra"] and not bad["equal"]
