"""The twin at Qwen2.5-0.5B's shapes (``qwen25-0.5b-shapes-twin``): registered as a twin, untrained, its
shapes those of Qwen2.5-0.5B's published config (a Llama: no q/k/v biases, oracles/twins/qwen25_shapes.py
says why), and its pinned weights file exactly that many float32 parameters. No build (2 GB): the
parameter count comes from the model class on the meta device."""

from __future__ import annotations

import struct

import pytest

from oracles.pins.materialize import TWINS
from oracles.pins.pin import load_pin, snapshot_dir

PIN = "qwen25-0.5b-shapes-twin"
#: Qwen/Qwen2.5-0.5B's config.json (hidden, MLP, layers, query heads, KV heads, vocabulary, RoPE base,
#: RMSNorm epsilon, tied head), and its parameters but the q/k/v biases counted by hand: the embedding
#: 151,936 x 896 = 136,134,656; a layer 14,911,232 (q and o 896 x 896 each, k and v 896 x 128 each,
#: gate/up/down 3 x 896 x 4,864, two norms 2 x 896); 24 layers; the final norm 896. With the biases
#: (24 x (896 + 2 x 128) = 27,648 more) it is Qwen2.5-0.5B's 494,032,768 (0.49 B on its model card).
QWEN25_05B = {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
              "num_key_value_heads": 2, "vocab_size": 151936, "rope_theta": 1000000.0, "rms_norm_eps": 1e-6,
              "tie_word_embeddings": True}
PARAMETERS = 136_134_656 + 24 * 14_911_232 + 896  # 494,005,120


@pytest.mark.dry
def test_registered_untrained_and_not_built_by_make() -> None:
    from pathlib import Path

    pin = load_pin(PIN)
    assert pin.source == "twin:qwen25-0.5b-shapes#0" and pin.model_class == "LlamaForCausalLM" and pin.untrained
    assert TWINS["qwen25-0.5b-shapes"] == ("oracles.twins.qwen25_shapes", "smollm2-135m-instruct")
    makefile = (Path(__file__).resolve().parents[2] / "Makefile").read_text()
    assert PIN not in makefile  # a 2 GB build: `oracles materialize` only, never make test's


@pytest.mark.dry
def test_pinned_weights_are_the_parameters_in_float32() -> None:
    """The pinned model.safetensors is its 8-byte length, its header, then 4 bytes a parameter (tied head once)."""
    weights = load_pin(PIN).files["model.safetensors"].bytes
    header = _header_bytes()
    if header is None:  # the header's length is in the file: without it, bound it by its pinned size
        assert 0 < weights - 4 * PARAMETERS < 64_000, weights
    else:
        assert weights == 8 + header + 4 * PARAMETERS, (weights, header)


def _header_bytes() -> int | None:
    path = snapshot_dir(load_pin(PIN)) / "model.safetensors"
    if not path.is_file():
        return None
    with path.open("rb") as fh:
        return int(struct.unpack("<Q", fh.read(8))[0])


@pytest.mark.slow
def test_config_is_qwen25_05b_shapes() -> None:
    """The builder's config through transformers' own Llama classes: Qwen2.5-0.5B's shapes, 64-wide heads,
    and that many parameters (on the meta device: nothing allocated)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from oracles.twins.qwen25_shapes import CONFIG

    config = LlamaConfig(**CONFIG)
    got = {k: getattr(config, k) for k in QWEN25_05B if k != "rope_theta"}
    assert got == {k: v for k, v in QWEN25_05B.items() if k != "rope_theta"}
    assert dict(config.rope_parameters or {}).get("rope_theta") == QWEN25_05B["rope_theta"] and config.head_dim == 64
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == PARAMETERS
