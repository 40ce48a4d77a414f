"""The llamacpp engine and its GGUF pins without llama.cpp: the registry entry, which pins it refuses,
the built-in pin files, and the bad-input lines of a GGUF's header (truncated, vocabulary other than
the pin's tokenizer), each on tiny GGUF files written with the ``gguf`` package's GGUFWriter in
tmp_path; the glibc patch's ELF pieces. Nothing here imports ``llama_cpp_py_sync``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.errors import PinError
from oracles.pins.gguf_file import read_header, vocabulary_disagreement
from oracles.pins.pin import load_pin

pytestmark = pytest.mark.dry


def _gguf(path: Path, tokens: list[str], arch: str = "llama", tensor_len: int = 64, file_type: int = 0) -> Path:
    """A tiny GGUF: ``general.architecture`` ``arch``, ``general.file_type``, the vocabulary ``tokens``
    and one float32 tensor of ``tensor_len`` values."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_file_type(file_type)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens)
    writer.add_tensor("token_embd.weight", np.arange(tensor_len, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tokenizer_json(path: Path, tokens: list[str]) -> Path:
    path.write_text(json.dumps({"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(tokens)}},
                                "added_tokens": []}))
    return path


TOKENS = ["<|endoftext|>", "a", "b", "Ġc"]


def test_unavailable_reason_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from oracles.engines.llamacpp.engine import LlamaCppPort

    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    reason = LlamaCppPort.unavailable_reason()
    assert reason is not None and "llama-cpp-py-sync" in reason and "[llamacpp]" in reason


def test_unsupported_pin_refuses_a_pin_without_gguf() -> None:
    from oracles.engines.llamacpp.engine import LlamaCppPort

    why = LlamaCppPort.unsupported_pin(load_pin("smollm2-135m-instruct"))
    assert why is not None and "no .gguf file" in why and "smollm2-135m-instruct" in why
    assert LlamaCppPort.unsupported_pin(load_pin("smollm2-gguf-f32")) is None
    assert LlamaCppPort.unsupported_pin(load_pin("smollm2-gguf-q4_1")) is None


def test_builtin_gguf_pins() -> None:
    q4, f32 = load_pin("smollm2-gguf-q4_1"), load_pin("smollm2-gguf-f32")
    assert (q4.precision.weights, q4.precision.compute, q4.precision.gguf_type) == ("Q4_1", "q8_1", "Q4_1")
    assert (f32.precision.weights, f32.precision.compute, f32.precision.gguf_type) == ("float32", "float32", "ALL_F32")
    assert q4.reference == f32.reference == "smollm2-135m-instruct" == f32.converted_from
    assert q4.source == load_pin("smollm2-135m-instruct").source  # the same file: shipped vs dequantised
    assert f32.recipe is not None and f32.recipe["arguments"] == {"outtype": "f32"}
    assert f32.recipe["sdist_sha256"] == "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
    for pin in (q4, f32):  # the reference's tokenizer files, so the canary and per-tokenizer records apply
        assert pin.tokenizer_sha256 == load_pin("smollm2-135m-instruct").tokenizer_sha256


def test_header_reads_architecture_type_and_vocabulary(tmp_path: Path) -> None:
    header = read_header(_gguf(tmp_path / "m.gguf", TOKENS, file_type=3))
    assert (header.architecture, header.file_type, header.tokens) == ("llama", "Q4_1", TOKENS)
    header.check_complete()


def test_truncated_gguf_names_the_tensor(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", TOKENS)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(PinError, match=r"m\.gguf: truncated: tensor 'token_embd.weight' ends at byte \d+ but the file "
                                       r"has \d+ bytes"):
        read_header(path).check_complete()


def test_gguf_truncated_inside_its_header(tmp_path: Path) -> None:
    path = _gguf(tmp_path / "m.gguf", TOKENS)
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(PinError, match=r"m\.gguf: truncated: the GGUF header ends inside"):
        read_header(path)


def test_not_a_gguf(tmp_path: Path) -> None:
    (tmp_path / "x.gguf").write_bytes(b"PK\x03\x04rest")
    with pytest.raises(PinError, match=r"x\.gguf: not a GGUF file: it starts with b'PK"):
        read_header(tmp_path / "x.gguf")


@pytest.mark.parametrize(("tokens", "want"), [
    (TOKENS[:3], r"field 'tokenizer.ggml.tokens' has 3 tokens but .*tokenizer.json has 4"),
    (["<|endoftext|>", "a", "B", "Ġd"], r"field 'tokenizer.ggml.tokens' differs from .*tokenizer.json: first at id 2 "
                                        r"\('B' vs 'b'\), 2 of 4 ids differ"),
])
def test_vocabulary_other_than_the_pins(tmp_path: Path, tokens: list[str], want: str) -> None:
    header = read_header(_gguf(tmp_path / "m.gguf", tokens))
    line = vocabulary_disagreement(header, _tokenizer_json(tmp_path / "tokenizer.json", TOKENS))
    assert line is not None and "m.gguf" in line
    assert __import__("re").search(want, line), line
    assert vocabulary_disagreement(read_header(_gguf(tmp_path / "n.gguf", TOKENS)), tmp_path / "tokenizer.json") is None


def test_gguf_precision_mismatch_names_pin_field(tmp_path: Path) -> None:
    from oracles.pins.gguf_pins import check_gguf_precision

    _gguf(tmp_path / "model.gguf", TOKENS, file_type=0)
    pin = load_pin("smollm2-gguf-q4_1")
    fake: Any = type("P", (), {"files": {"model.gguf": None}, "precision": pin.precision, "path": pin.path})()
    with pytest.raises(PinError, match=r"field 'precision.weights' is 'Q4_1' but .*model.gguf holds 'float32'"):
        check_gguf_precision(fake, tmp_path)


def test_convert_recipe_version_must_name_the_sdist(tmp_path: Path) -> None:
    from oracles.pins.gguf_convert import _sdist_spec

    obj = json.loads(load_pin("smollm2-gguf-f32").path.read_text())
    obj["recipe"]["version"] = "0.3.36"
    (tmp_path / "smollm2-gguf-f32.json").write_text(json.dumps(obj))
    with pytest.raises(PinError, match=r"field 'recipe.version' is '0.3.36', not DIST==VERSION"):
        _sdist_spec(load_pin(tmp_path / "smollm2-gguf-f32.json"))


def test_elf_hash_and_glibc_version() -> None:
    from oracles.engines.llamacpp.native import elf_hash, glibc_version

    assert elf_hash(b"GLIBC_2.2.5") == 0x09691A75
    found = glibc_version()
    assert found is None or (found[0] == 2 and found[1] > 0)


def test_hf_rotary_order_undoes_the_converters_permutation() -> None:
    from oracles.engines.llamacpp.state import hf_rotary_order

    hf = np.arange(2 * 8, dtype=np.float32).reshape(2, 8)  # two heads of head_dim 8
    # convert_hf_to_gguf.py's LlamaModel.permute: reshape(n_head, 2, half, ...).swapaxes(1, 2)
    llama = hf.reshape(2, 2, 4).swapaxes(1, 2).reshape(2, 8)
    assert np.array_equal(hf_rotary_order(llama), hf)
