"""The DeepSeek-V4 port's translation of a transformers snapshot for mlx-vlm
(:mod:`oracles.engines.mlx.deepseek_v4_load`): the schedule keys, the official names, the packed
experts split, and bad input named. numpy only."""

from __future__ import annotations

import numpy as np
import pytest

from oracles.engines.mlx import deepseek_v4_load as load
from oracles.twins import deepseek_v4 as twin

pytestmark = pytest.mark.dry


def test_config_overrides_from_the_twin_config() -> None:
    got = load.config_overrides({**twin.CONFIG})
    assert got == {"compress_ratios": [0, 4, 128, 4], "num_hash_layers": 2}


def test_config_overrides_refuse_what_mlx_vlm_cannot_say() -> None:
    with pytest.raises(ValueError, match=r"config.json: mlp_layer_types .* hash_moe layers must come first"):
        load.config_overrides({**twin.CONFIG, "mlp_layer_types": ["moe", "hash_moe", "moe", "moe"]})
    with pytest.raises(ValueError, match=r"config.json: layer_types \['full_attention'\] have no compress rate"):
        load.config_overrides({**twin.CONFIG, "layer_types": ["full_attention"] + twin.LAYER_TYPES[1:]})


@pytest.mark.parametrize("name,official", [
    ("model.embed_tokens.weight", "embed.weight"), ("lm_head.weight", "head.weight"),
    ("model.hc_head.hc_fn", "hc_head_fn"), ("model.layers.1.self_attn.q_a_proj.weight", "layers.1.attn.wq_a.weight"),
    ("model.layers.1.self_attn.sinks", "layers.1.attn.attn_sink"),
    ("model.layers.1.self_attn.compressor.position_bias", "layers.1.attn.compressor.ape"),
    ("model.layers.1.self_attn.compressor.indexer.kv_norm.weight", "layers.1.attn.indexer.compressor.norm.weight"),
    ("model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight", "layers.1.attn.indexer.weights_proj.weight"),
    ("model.layers.0.attn_hc.fn", "layers.0.hc_attn_fn"), ("model.layers.3.mlp.gate.e_score_correction_bias",
                                                            "layers.3.ffn.gate.bias"),
    ("model.layers.0.post_attention_layernorm.weight", "layers.0.ffn_norm.weight"),
    ("model.layers.2.mlp.shared_experts.up_proj.weight", "layers.2.ffn.shared_experts.w3.weight"),
])
def test_official_names(name: str, official: str) -> None:
    assert load.official_name(name) == official


def test_unknown_tensor_is_named() -> None:
    with pytest.raises(KeyError, match="model.layers.0.self_attn.mystery.weight"):
        load.official_name("model.layers.0.self_attn.mystery.weight")


def test_packed_experts_split_gate_first() -> None:
    """``gate_up_proj`` ``[E, 2I, D]``: rows ``:I`` are the gate (w1), ``I:`` up (w3); ``down_proj`` w2."""
    gate_up = np.arange(2 * 6 * 3, dtype=np.float32).reshape(2, 6, 3)
    down = np.arange(2 * 3 * 3, dtype=np.float32).reshape(2, 3, 3)
    out = load.official_weights({"model.layers.0.mlp.experts.gate_up_proj": gate_up,
                                 "model.layers.0.mlp.experts.down_proj": down})
    assert sorted(out) == sorted(f"layers.0.ffn.experts.{e}.{w}.weight" for e in range(2) for w in ("w1", "w2", "w3"))
    assert np.array_equal(out["layers.0.ffn.experts.1.w1.weight"], gate_up[1, :3])
    assert np.array_equal(out["layers.0.ffn.experts.1.w3.weight"], gate_up[1, 3:])
    assert np.array_equal(out["layers.0.ffn.experts.0.w2.weight"], down[0])
