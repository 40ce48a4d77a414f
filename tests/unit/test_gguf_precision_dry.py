"""A GGUF's precision from its header's tensor types (oracles.pins.gguf_precision), on headers made here; and
the judgment of a user's GGUF pin against the float32 pin dequantized from its file (oracles.pins.pairing),
on pin files written here. Pure: no file is loaded by llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from oracles.errors import PinError
from oracles.pins.gguf_file import GgufHeader, TensorInfo
from oracles.pins.gguf_precision import gguf_precision
from oracles.pins.pairing import BAND_DTYPES, judgment_of
from oracles.pins.pin import load_pin
from oracles.pins.precision import Precision

pytestmark = [pytest.mark.dry]

#: ggml type ids (gguf.GGMLQuantizationType) of the types below.
F32, F16, Q4_0, Q4_1, Q5_0, Q8_0, Q4_K, Q6_K = 0, 1, 2, 3, 6, 8, 12, 14
#: llama_ftype values (general.file_type).
ALL_F32, MOSTLY_Q4_1, MOSTLY_Q8_0, MOSTLY_Q4_K_M = 0, 3, 7, 15


def header(file_type: int | None, **matrices: int) -> GgufHeader:
    """A header with ``general.file_type`` and one ``[64, 64]`` tensor per keyword (its ggml type id),
    beside a float32 norm (one dimension: never a matrix product)."""
    h = GgufHeader(Path("m.gguf"), 3, {} if file_type is None else {"general.file_type": file_type})
    h.tensors = [TensorInfo("blk.0.attn_norm.weight", (64,), F32, 0)]
    h.tensors += [TensorInfo(name.replace("__", "."), (64, 64), kind, 0) for name, kind in matrices.items()]
    return h


@pytest.mark.parametrize(("h", "want"), [
    (header(ALL_F32, token_embd__weight=F32), Precision("float32", "float32", gguf_type="ALL_F32")),
    (header(MOSTLY_Q8_0, token_embd__weight=Q8_0, blk__0__ffn_up__weight=Q8_0), Precision("Q8_0", "q8_0", gguf_type="Q8_0")),
    # the shipped Q4_1 file's mix: Q4_1 layers (Q8_1 activations) and a Q8_0 tied head (Q8_0, rounded alike)
    (header(MOSTLY_Q4_1, token_embd__weight=Q8_0, blk__0__ffn_up__weight=Q4_1), Precision("Q4_1", "q8_1", gguf_type="Q4_1")),
    (header(MOSTLY_Q4_K_M, token_embd__weight=Q6_K, blk__0__ffn_up__weight=Q4_K),
     Precision("Q4_K_M", "q8_K", gguf_type="Q4_K_M")),
    # Q4_K_M of rows that are not multiples of 256: Q5_0 fallbacks beside Q4_K/Q6_K
    (header(MOSTLY_Q4_K_M, token_embd__weight=Q6_K, blk__0__ffn_up__weight=Q5_0),
     Precision("Q4_K_M", "per-tensor", gguf_type="Q4_K_M")),
    # an output head of its own: the embedding is a lookup, not a product, so its type does not count
    (header(MOSTLY_Q4_K_M, token_embd__weight=Q4_K, output__weight=Q8_0, blk__0__ffn_up__weight=Q5_0),
     Precision("Q4_K_M", "q8_0", gguf_type="Q4_K_M")),
    # a float32 head beside quantized layers: not one rounding
    (header(MOSTLY_Q8_0, output__weight=F32, blk__0__ffn_up__weight=Q8_0), Precision("Q8_0", "per-tensor", gguf_type="Q8_0")),
    # no general.file_type: the type holding the most matrix elements
    (header(None, token_embd__weight=Q4_0, blk__0__ffn_up__weight=Q4_0), Precision("Q4_0", "q8_0", gguf_type="Q4_0")),
    (header(None, token_embd__weight=F16), Precision("float16", "float16", gguf_type="F16")),
])
def test_precision_from_tensor_types(h: GgufHeader, want: Precision) -> None:
    assert gguf_precision(h) == want


def test_unknown_file_type_and_unknown_tensor_type_are_one_line() -> None:
    with pytest.raises(PinError, match=r"^m\.gguf: field 'general\.file_type' is 99, a type llama\.cpp's llama_ftype"):
        gguf_precision(header(99, token_embd__weight=Q8_0))
    with pytest.raises(PinError, match=r"^m\.gguf: tensor 'blk\.0\.x' is I32, a type whose activation rounding"):
        gguf_precision(header(MOSTLY_Q8_0, blk__0__x=26))


def _pin(folder: Path, name: str, **fields: Any) -> Any:
    files = fields.pop("files", {"tokenizer.json": {"bytes": 1, "sha256": "a" * 64}})
    doc = {"name": name, "model_class": "LlamaForCausalLM", "files": files, **fields}
    (folder / f"{name}.json").write_text(json.dumps(doc))
    return load_pin(folder / f"{name}.json")


GGUF_SHA = "b" * 64


@pytest.fixture
def dequantized(tmp_path: Path) -> Any:
    """The pin ``oracles pin deq --dequantize-from FILE.gguf`` writes (its source digest: the file's sha256)."""
    return _pin(tmp_path, "deq", source="dequantize:local:/models/m.gguf", source_sha256=GGUF_SHA,
                precision={"weights": "float32", "compute": "float32", "gguf_type": "Q8_0"},
                recipe={"tool": "transformers.gguf", "version": "5.24.0"})


def _artifact(tmp_path: Path, compute: str, sha: str = GGUF_SHA) -> Any:
    return _pin(tmp_path, "mine", source="file:/models/m.gguf", source_sha256=sha, reference="deq",
                files={"m.gguf": {"bytes": 9, "sha256": sha}, "tokenizer.json": {"bytes": 1, "sha256": "a" * 64}},
                precision={"weights": "Q4_K_M", "compute": compute, "gguf_type": "Q4_K_M"})


def test_a_users_quantized_gguf_is_banded_against_its_own_dequantization(tmp_path: Path, dequantized: Any) -> None:
    judgment = judgment_of(dequantized, _artifact(tmp_path, "q8_0"))
    assert (judgment.kind, judgment.dtype) == ("band", "q8_0")
    assert "computes on activations rounded to q8_0 blocks" in judgment.why


def test_the_dequantization_of_another_file_does_not_judge_it(tmp_path: Path, dequantized: Any) -> None:
    with pytest.raises(PinError, match=r"pin mine holds Q4_K_M weights, which pin deq does not hold"):
        judgment_of(dequantized, _artifact(tmp_path, "q8_0", sha="c" * 64))


def test_k_quant_and_mixed_roundings_have_their_band(tmp_path: Path, dequantized: Any) -> None:
    assert judgment_of(dequantized, _artifact(tmp_path, "q8_K")).dtype == "q8_K"
    planned = _pin(tmp_path, "deq2", source="dequantize:local:/models/m.gguf", source_sha256=GGUF_SHA,
                   files={"ggml_rounding.json": {"bytes": 2, "sha256": "d" * 64},
                          "tokenizer.json": {"bytes": 1, "sha256": "a" * 64}},
                   precision={"weights": "float32", "compute": "float32", "gguf_type": "Q4_K_M"},
                   recipe={"tool": "transformers.gguf", "version": "5.24.0"})
    judgment = judgment_of(planned, _artifact(tmp_path, "per-tensor"))
    assert (judgment.kind, judgment.dtype) == ("band", "per-tensor") and "rounded per matrix" in judgment.why


def test_a_mixed_rounding_without_its_plan_is_refused(tmp_path: Path, dequantized: Any) -> None:
    with pytest.raises(PinError, match=r"^--port-pin deq=mine: pin mine rounds each matrix's activations its own way "
                                       r"\(per-tensor\) and pin deq pins no ggml_rounding\.json saying how"):
        judgment_of(dequantized, _artifact(tmp_path, "per-tensor"))


def test_a_rounding_no_band_engine_runs_is_refused_naming_it(tmp_path: Path, dequantized: Any) -> None:
    with pytest.raises(PinError, match=r"^--port-pin deq=mine: pin mine computes in 'dynamic_int8' .*no band engine "
                                       r"runs the reference in that precision"):
        judgment_of(dequantized, _artifact(tmp_path, "dynamic_int8"))


def test_band_dtypes_are_the_torch_references() -> None:
    from oracles.engines.torch.reference import TorchReference

    assert set(BAND_DTYPES) == set(TorchReference.DTYPES) - {"float32"}


def test_the_rounding_plan_places_each_tensors_rounding_on_its_linear() -> None:
    from oracles.pins.gguf_precision import rounding_plan

    h = header(MOSTLY_Q4_K_M, token_embd__weight=Q6_K, blk__0__attn_q__weight=Q5_0, blk__0__ffn_down__weight=Q4_K)
    h.metadata.update({"general.architecture": "llama", "llama.block_count": 1})
    weights = ["model.embed_tokens.weight", "model.layers.0.mlp.down_proj.weight", "model.layers.0.self_attn.q_proj.weight"]
    assert rounding_plan(h, weights) == {"lm_head": "q8_K", "model.layers.0.mlp.down_proj": "q8_K",
                                         "model.layers.0.self_attn.q_proj": "q8_0"}  # the tied head: the embedding's
    with pytest.raises(PinError, match=r"matrix 'model\.layers\.0\.mlp\.up_proj\.weight' maps to no matrix of the file"):
        rounding_plan(h, [*weights, "model.layers.0.mlp.up_proj.weight"])
