"""What mlx-vlm 0.7.10 needs to load a transformers-written DeepSeek-V4 snapshot, each item recorded.

mlx-vlm's ``deepseek_v4`` model reads the official DeepSeek-V4 checkpoint layout: its ``ModelConfig``
reads ``compress_ratios`` (one rate per layer, 0 for a sliding-window layer) and ``num_hash_layers``
(the first N layers hash-routed), not transformers' ``layer_types`` / ``compress_rates`` /
``mlp_layer_types``; its ``sanitize`` reads the official weight names (``layers.i.attn.wq_a``,
``layers.i.ffn.experts.e.w1``, ``hc_head_fn``, ...). transformers 5.24 maps that layout to its own on
load (``conversion_mapping.py``, ``deepseek_v4``) and its snapshot holds its own names
(``model.layers.i.self_attn.q_a_proj``, one packed ``mlp.experts.gate_up_proj`` ``[E, 2I, D]``, ...).
Loaded as is, mlx-vlm refuses the weights (measured: "Received 72 parameters not in model") and would
read the default layer schedule (``[0, 128, 4, 0]`` for 4 layers, not the twin's ``[0, 4, 128, 4]``).

So the port writes a translated copy (:func:`write_translated`): ``config.json`` with the two keys set
from transformers' own fields (:func:`config_overrides`), and the weights under the official names
(:func:`official_name`: the inverse of transformers' renaming, written out here; the packed experts
split into per-expert ``w1`` (the first ``I`` rows, the gate, as ``DeepseekV4Experts._apply_gate``
chunks it) / ``w3`` / ``w2``), which mlx-vlm's own ``load_model`` and ``sanitize`` then load. Bytes are
copied, never changed. numpy and safetensors only.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

#: transformers layer-local name (regex) -> the official name mlx-vlm's sanitize reads (first match wins).
LAYER_NAMES: tuple[tuple[str, str], ...] = (
    (r"self_attn\.compressor\.indexer\.q_b_proj\.", "attn.indexer.wq_b."),
    (r"self_attn\.compressor\.indexer\.scorer\.weights_proj\.", "attn.indexer.weights_proj."),
    (r"self_attn\.compressor\.indexer\.kv_proj\.", "attn.indexer.compressor.wkv."),
    (r"self_attn\.compressor\.indexer\.gate_proj\.", "attn.indexer.compressor.wgate."),
    (r"self_attn\.compressor\.indexer\.position_bias$", "attn.indexer.compressor.ape"),
    (r"self_attn\.compressor\.indexer\.kv_norm\.", "attn.indexer.compressor.norm."),
    (r"self_attn\.compressor\.kv_proj\.", "attn.compressor.wkv."),
    (r"self_attn\.compressor\.gate_proj\.", "attn.compressor.wgate."),
    (r"self_attn\.compressor\.position_bias$", "attn.compressor.ape"),
    (r"self_attn\.compressor\.kv_norm\.", "attn.compressor.norm."),
    (r"self_attn\.q_a_proj\.", "attn.wq_a."), (r"self_attn\.q_a_norm\.", "attn.q_norm."),
    (r"self_attn\.q_b_proj\.", "attn.wq_b."), (r"self_attn\.kv_proj\.", "attn.wkv."),
    (r"self_attn\.kv_norm\.", "attn.kv_norm."), (r"self_attn\.o_a_proj\.", "attn.wo_a."),
    (r"self_attn\.o_b_proj\.", "attn.wo_b."), (r"self_attn\.sinks$", "attn.attn_sink"),
    (r"input_layernorm\.", "attn_norm."), (r"post_attention_layernorm\.", "ffn_norm."),
    (r"attn_hc\.(fn|base|scale)$", r"hc_attn_\1"), (r"ffn_hc\.(fn|base|scale)$", r"hc_ffn_\1"),
    (r"mlp\.gate\.e_score_correction_bias$", "ffn.gate.bias"), (r"mlp\.gate\.", "ffn.gate."),
    (r"mlp\.shared_experts\.gate_proj\.", "ffn.shared_experts.w1."),
    (r"mlp\.shared_experts\.down_proj\.", "ffn.shared_experts.w2."),
    (r"mlp\.shared_experts\.up_proj\.", "ffn.shared_experts.w3."),
)
#: transformers top-level name -> official name.
TOP_NAMES = {"model.embed_tokens.weight": "embed.weight", "lm_head.weight": "head.weight",
             "model.norm.weight": "norm.weight", "model.hc_head.hc_fn": "hc_head_fn",
             "model.hc_head.hc_base": "hc_head_base", "model.hc_head.hc_scale": "hc_head_scale"}
#: Per-layer rate of each transformers layer type (``compress_ratios``' 0 for a sliding-window layer).
SLIDING = "sliding_attention"


def config_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """``compress_ratios`` and ``num_hash_layers`` from transformers' ``layer_types`` /
    ``compress_rates`` / ``mlp_layer_types``.

    Raises:
        ValueError: hash-routed layers that are not the first ones (``num_hash_layers`` cannot say it),
            or a layer type with no rate; each names the field.
    """
    rates = {SLIDING: 0, **config.get("compress_rates", {})}
    types, mlp = list(config["layer_types"]), list(config["mlp_layer_types"])
    if unknown := [t for t in types if t not in rates]:
        raise ValueError(f"config.json: layer_types {unknown} have no compress rate in compress_rates {rates}")
    n_hash = mlp.count("hash_moe")
    if mlp[:n_hash] != ["hash_moe"] * n_hash:
        raise ValueError(f"config.json: mlp_layer_types {mlp}: hash_moe layers must come first for num_hash_layers")
    return {"compress_ratios": [int(rates[t]) for t in types], "num_hash_layers": n_hash}


def official_name(name: str) -> str:
    """The official checkpoint name of a transformers DeepSeek-V4 tensor (the packed experts excepted:
    :func:`official_weights`).

    Raises:
        KeyError: a name this table does not know (the snapshot holds a tensor the port would drop).
    """
    if name in TOP_NAMES:
        return TOP_NAMES[name]
    m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
    if m:
        for pattern, official in LAYER_NAMES:
            new, hits = re.subn(pattern, official, m.group(2))
            if hits:
                return f"layers.{m.group(1)}.{new}"
    raise KeyError(f"no official DeepSeek-V4 name for transformers tensor {name!r}")


def official_weights(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor under its official name; ``mlp.experts.gate_up_proj`` ``[E, 2I, D]`` split into
    ``ffn.experts.e.w1`` ``[I, D]`` (rows ``:I``, the gate) and ``w3`` (rows ``I:``, up), and
    ``mlp.experts.down_proj`` ``[E, D, I]`` into ``ffn.experts.e.w2`` ``[D, I]``. Values unchanged."""
    out: dict[str, np.ndarray] = {}
    for name, value in weights.items():
        m = re.match(r"model\.layers\.(\d+)\.mlp\.experts\.(gate_up_proj|down_proj)$", name)
        if not m:
            out[official_name(name)] = value
            continue
        prefix = f"layers.{m.group(1)}.ffn.experts"
        for e in range(value.shape[0]):
            if m.group(2) == "down_proj":
                out[f"{prefix}.{e}.w2.weight"] = np.ascontiguousarray(value[e])
            else:
                half = value.shape[1] // 2
                out[f"{prefix}.{e}.w1.weight"] = np.ascontiguousarray(value[e, :half])
                out[f"{prefix}.{e}.w3.weight"] = np.ascontiguousarray(value[e, half:])
    return out


def write_translated(root: Path, out: Path) -> dict[str, Any]:
    """Write the translated copy of snapshot ``root`` into ``out`` (module docstring); return the
    record of what was translated: ``config_overrides`` and ``translations`` (one line per rule)."""
    from safetensors.numpy import load_file, save_file

    config = json.loads((root / "config.json").read_text())
    overrides = config_overrides(config)
    (out / "config.json").write_text(json.dumps({**config, **overrides}, indent=2, sort_keys=True) + "\n")
    weights: dict[str, np.ndarray] = {}
    for f in sorted(root.glob("*.safetensors")):
        weights.update(load_file(str(f)))
    official = official_weights(weights)
    save_file(official, str(out / "model.safetensors"))
    lines = [f"config.json {k} = {v!r} (from layer_types / compress_rates / mlp_layer_types)" for k, v in overrides.items()]
    lines += [f"weights {p} -> {o}" for p, o in LAYER_NAMES] + [f"weights {p} -> {o}" for p, o in TOP_NAMES.items()]
    lines.append("weights mlp.experts.gate_up_proj [E, 2I, D] -> ffn.experts.e.w1 (rows :I) / w3 (rows I:); "
                 "mlp.experts.down_proj -> ffn.experts.e.w2")
    return {"config_overrides": overrides, "translations": lines, "tensors": [len(weights), len(official)]}
