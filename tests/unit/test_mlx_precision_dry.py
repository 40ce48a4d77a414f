"""The MLX port's precision and translation bookkeeping, without mlx (oracles/engines/mlx/precision.py,
oracles/engines/mlx/config.py): the precision named from dtypes and quantized modules, the config's and
the pin's declarations and their disagreements, the translations recorded, and the field-by-field
comparison of mlx-lm's reading with transformers'."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oracles.engines.mlx import config as mc
from oracles.engines.mlx import precision as mp

pytestmark = pytest.mark.dry

F32, BF16, F16 = "mlx.core.float32", "mlx.core.bfloat16", "mlx.core.float16"


def test_float_models_compute_in_their_dtype() -> None:
    for name, want in ((F32, "float32"), (BF16, "bfloat16"), (F16, "float16")):
        p = mp.precision_of([name, name], [])
        assert (p.weights, p.compute, p.mode, p.bits) == (want, want, None, None)
        assert p.describe() == f"{want} weights, {want} compute"
    assert mp.precision_of([F32], []).exact_compute and not mp.precision_of([BF16], []).exact_compute


def test_quantized_model_names_mode_bits_group() -> None:
    # scales, biases and norms float32 (what mlx_lm.convert writes for a float32 source)
    p = mp.precision_of([F32] * 3, [(4, 64, "affine")] * 5)
    assert (p.weights, p.compute, p.bits, p.group_size, p.mode) == ("affine", "float32", 4, 64, "affine")
    assert p.describe() == "affine 4-bit g64, float32 compute"
    assert p.to_json()["variants"] == [[4, 64, "affine"]]


def test_mixed_quantization_keeps_every_variant() -> None:
    p = mp.precision_of([F32], [(4, 64, "affine"), (8, 64, "affine"), (4, 64, "affine")])
    assert (p.weights, p.bits, p.group_size, p.mode) == ("affine", None, None, None)
    assert p.variants == ((4, 64, "affine"), (8, 64, "affine"))
    assert mp.precision_of([F32], [(4, 32, "mxfp4"), (8, 64, "affine")]).weights == "mixed"


@pytest.mark.parametrize("floating", [[], [F32, BF16], ["mlx.core.float64"]])
def test_no_one_compute_dtype_is_refused(floating: list[str]) -> None:
    with pytest.raises(TypeError, match="floating parameters are"):
        mp.precision_of(floating, [])


def test_config_declaration() -> None:
    assert mp.config_declaration({}) == {"mode": None}
    assert mp.config_declaration({"quantization": {"group_size": 64, "bits": 4}}) == {"mode": "affine", "bits": 4,
                                                                                       "group_size": 64}
    # per-module entries: the top-level numbers are defaults only
    mixed = {"quantization": {"group_size": 64, "bits": 4, "mode": "affine", "model.layers.0.mlp.up_proj": {"bits": 8}}}
    assert mp.config_declaration(mixed) == {"mode": "affine"}
    with pytest.raises(ValueError, match="quantization.mode"):
        mp.config_declaration({"quantization": {"mode": "gptq"}})
    with pytest.raises(ValueError, match="'quantization' is list"):
        mp.config_declaration({"quantization": [4]})


def test_disagreement_names_field_and_both_values() -> None:
    q4 = mp.precision_of([F32], [(4, 64, "affine")])
    assert mp.disagreements({"mode": "affine", "bits": 4, "group_size": 64}, q4) == []
    assert mp.disagreements({"mode": "affine", "bits": 8, "group_size": 64}, q4) == ["bits: declared 8, loaded 4"]
    # a float folder: config.json declares nothing quantized, and nothing is
    assert mp.disagreements({"mode": None}, mp.precision_of([BF16], [])) == []
    assert mp.disagreements({"mode": None}, q4) == ["mode: declared None, loaded 'affine'"]


def test_pin_declaration_reads_stated_fields_only() -> None:
    assert mp.pin_declaration(SimpleNamespace()) == {}
    precision = SimpleNamespace(weights="affine", compute="float32", bits=4, group_size=64, mode="affine", gguf_type=None)
    assert mp.pin_declaration(SimpleNamespace(precision=precision)) == {
        "weights": "affine", "compute": "float32", "bits": 4, "group_size": 64, "mode": "affine"}
    bf16 = SimpleNamespace(weights="bfloat16", compute="bfloat16", bits=None, group_size=None, mode=None)
    assert mp.disagreements(mp.pin_declaration(SimpleNamespace(precision=bf16)), mp.precision_of([F32], [])) == [
        "weights: declared 'bfloat16', loaded 'float32'", "compute: declared 'bfloat16', loaded 'float32'"]


SMOL = {"model_type": "llama", "hidden_size": 576, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
        "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}}


def test_translation_records_both_readings() -> None:
    overrides = mc.rope_overrides(SMOL)
    assert overrides == {"rope_theta": 100000.0}
    (t,) = mc.translations(SMOL, overrides, {"rope_theta": 10000})
    assert t.to_json() == {"field": "rope_theta", "mlx_lm_reads": 10000, "transformers_key": "rope_parameters.rope_theta",
                           "transformers_reads": 100000.0,
                           "applied": "mlx_lm.load(path, model_config={'rope_theta': 100000.0})"}
    assert mc.translations({**SMOL, "rope_theta": 100000.0}, mc.rope_overrides({**SMOL, "rope_theta": 1e5}), {}) == []


def test_reading_differences() -> None:
    transformers = {**SMOL, "head_dim": 64}
    mlx = {"model_type": "llama", "hidden_size": 576, "rms_norm_eps": 1e-5, "tie_word_embeddings": True,
           "rope_theta": 10000, "head_dim": None, "rope_traditional": False}
    (d,) = mc.reading_differences(mlx, transformers)
    assert (d.field, d.mlx_lm_reads, d.transformers_key, d.transformers_reads) == (
        "rope_theta", 10000, "rope_parameters.rope_theta", 100000.0)
    assert d.line() == "rope_theta: mlx-lm reads 10000, transformers reads 100000.0 (rope_parameters.rope_theta)"
    # equal by value (an int read as a float), a field only mlx-lm has, one it leaves None: not differences
    assert mc.reading_differences({**mlx, "rope_theta": 100000}, transformers) == []
    # booleans by identity: mlx-lm's Llama default tie_word_embeddings=True against a config that says false
    assert [d.field for d in mc.reading_differences(mlx, {**transformers, "tie_word_embeddings": False,
                                                          "rope_parameters": {"rope_theta": 1e4}})] == ["tie_word_embeddings"]
    refused = {"model_type": "refused: Model type qwen3_5_text not supported."}
    assert [d.field for d in mc.reading_differences(refused, {"model_type": "qwen3_5_text"})] == ["model_type"]


def test_keyed() -> None:
    assert mc.keyed(SMOL, "rope_parameters.rope_theta") == (True, 100000.0)
    assert mc.keyed(SMOL, "rope_parameters.factor") == (False, None)
    assert mc.keyed(SMOL, "hidden_size.x") == (False, None)
