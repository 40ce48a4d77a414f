"""The MLX port on reduced-precision folders (oracles/engines/mlx/lm.py, cohort.py): a seeded two-layer
Llama saved as mlx-lm saves it, in bfloat16 and 4-bit affine, loaded by :class:`MlxPort` as
``mlx_lm.load`` loads it; precision read from the model, numpy float32 at the boundary, a KV snapshot
restored in the model's dtype, and a folder whose config.json contradicts its weights refused in one
line. Needs mlx (slow: it imports and runs it)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.pins.pin import Pin

pytestmark = pytest.mark.slow

TOKENIZERS = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
CONFIG = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 2,
          "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
          "vocab_size": 49152, "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "max_position_embeddings": 512,
          "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "eos_token_id": 2, "bos_token_id": 1}


def _folder(tmp: Path, name: str, dtype: str = "float32", bits: int | None = None,
            declared_bits: int | None = None) -> Path:
    """A seeded tiny Llama saved as mlx-lm's convert saves it: safetensors of ``model.parameters()``,
    cast to ``dtype`` and, with ``bits``, quantized (affine, group 64) with config.json declaring
    ``declared_bits`` (default ``bits``)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten, tree_map
    from mlx_lm.models.llama import Model, ModelArgs

    mx.random.seed(0)
    model = Model(ModelArgs.from_dict({**CONFIG, "rope_theta": 100000.0}))
    model.update(tree_map(lambda v: v.astype(getattr(mx, dtype)), model.parameters()))
    config = dict(CONFIG)
    if bits is not None:
        nn.quantize(model, group_size=64, bits=bits)
        config["quantization"] = {"group_size": 64, "bits": declared_bits or bits, "mode": "affine"}
    root = tmp / name
    root.mkdir()
    mx.save_safetensors(str(root / "model.safetensors"), dict(tree_flatten(model.parameters())))
    (root / "config.json").write_text(json.dumps(config))
    for f in TOKENIZERS.iterdir():
        shutil.copy(f, root / f.name)
    return root


def _port(root: Path) -> Any:
    """The port on ``root`` under a pin declaring the precision ``oracles pin`` reads from it (float32,
    the default, where the folder contradicts itself: the port's own refusal is then under test)."""
    from oracles.engines.mlx.lm import MlxPort
    from oracles.errors import PinError
    from oracles.pins.precision import FLOAT32, read_precision

    try:
        precision = read_precision(root, ["model.safetensors"])
    except PinError:
        precision = FLOAT32
    pin = Pin(name=root.name, source=f"local:{root}", source_sha256=None, model_class="LlamaForCausalLM", files={},
              safetensors_headers={}, built_with={}, path=root.parent / f"{root.name}.json", precision=precision)
    return MlxPort(root, pin)


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("mlx-precision")
    return {"bf16": _folder(tmp, "bf16", dtype="bfloat16"), "q4": _folder(tmp, "q4", bits=4),
            "q4-says-8": _folder(tmp, "q4-says-8", bits=4, declared_bits=8)}


def test_bfloat16_folder_loads_and_computes_in_bfloat16(folders: dict[str, Path]) -> None:
    port = _port(folders["bf16"])
    d = port.describe()
    assert (d["dtype"], d["quantization"], d["precision"]) == ("bfloat16", None, "bfloat16 weights, bfloat16 compute")
    assert port.precision().compute == "bfloat16"
    step = port.forward([1, 2, 3, 4])
    assert step.logits.dtype == np.float32 and step.hidden.dtype == np.float32
    # the forward's float32 numbers are bfloat16 values: the low 16 bits of each are zero
    assert not (step.logits.view(np.uint32) & 0xFFFF).any()
    # the head and final norm re-run on those values in bfloat16 give the forward's own numbers
    layers = port.forward([1, 2, 3, 4], layers=True)
    assert np.array_equal(port.lm_head(layers.hidden), layers.logits)
    assert np.array_equal(port.final_norm(layers.layers[-1]), layers.hidden)


def test_bfloat16_snapshot_restores_in_bfloat16(folders: dict[str, Path]) -> None:
    import mlx.core as mx

    port = _port(folders["bf16"])
    cache = port.make_cache()
    port.forward([1, 2, 3, 4], cache, keep=1)
    snap = port.snapshot(cache)
    assert snap[0]["dtypes"] == {"keys": "bfloat16", "values": "bfloat16"}
    restored = port.restore(snap)
    assert restored[0].keys.dtype == mx.bfloat16 and restored[0].values.dtype == mx.bfloat16
    assert np.array_equal(port.forward([5], restored).logits, port.forward([5], cache).logits)


def test_quantized_folder_reports_its_quantization(folders: dict[str, Path]) -> None:
    port = _port(folders["q4"])
    d = port.describe()
    assert d["dtype"] == "float32" and d["quantization"] == {"mode": "affine", "bits": 4, "group_size": 64}
    assert d["precision"] == "affine 4-bit g64, float32 compute"
    assert d["translations"] == port.translations and port.translations[0]["field"] == "rope_theta"
    assert port.translations[0]["mlx_lm_reads"] == 10000 and port.translations[0]["transformers_reads"] == 100000.0
    assert np.isfinite(port.forward([1, 2, 3]).logits).all()


def test_config_that_contradicts_the_weights_is_refused(folders: dict[str, Path]) -> None:
    with pytest.raises(TypeError) as err:
        _port(folders["q4-says-8"])
    message = str(err.value)
    assert "config.json" in message and "bits: declared 8, loaded 4" in message and "\n" not in message, message


def test_mlx_faults_change_the_quantized_forward_and_are_undone(folders: dict[str, Path]) -> None:
    """Each MLX fault (oracles/faults/mlx.py) changes the 4-bit port's logits while in force, and the
    port's own logits are bit-identical after it is undone."""
    from oracles.faults.mlx import MLX_FAULTS, mlx_fault_port

    port = _port(folders["q4"])
    ids = [1, 2, 3, 4, 5, 6]
    before = port.forward(ids).logits
    for name in MLX_FAULTS:
        bad = mlx_fault_port(name, port)
        assert not np.array_equal(bad.forward(ids).logits, before), f"{name} left the forward unchanged"
        assert np.array_equal(port.forward(ids).logits, before), f"{name} was not undone"
    assert mlx_fault_port("gate_up_swapped", port).stage() == "layer 1"
