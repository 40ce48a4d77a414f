"""The hybrid twin: a tiny seeded Qwen3.5 text model (Gated DeltaNet linear-attention layers and a
full-attention layer) sharing SmolLM2's tokenizer and chat template, so every record of the default
pin runs on it unchanged (``smollm2-hybrid-twin``, source ``twin:qwen35-hybrid#SEED``).

Built from transformers' own ``Qwen3_5TextConfig`` and ``Qwen3_5ForCausalLM``: hidden 64, four
decoder layers typed ``linear_attention`` x 3 then ``full_attention`` (the placement of Qwen3.5's
own ``full_attention_interval`` 4, which is also the one place mlx-lm's ``qwen3_5`` model puts it:
mlx-lm reads the interval and ignores ``layer_types``), the full 49,152-token vocabulary, tied
embeddings. Its linear-attention caches hold a conv state and a recurrent state that fold every
position in and cannot be cut back, which is what the speculative and chat oracles must roll back by
snapshot/restore.

Weight scale. The weights are the class's own initialiser under ``torch.manual_seed(SEED)`` (normal
with std ``initializer_range`` for the embedding, projections and convolution; Qwen3.5's own
``A_log``/``dt_bias`` draws; its (1 + w) RMSNorms at w = 0), with ``initializer_range`` raised from
Qwen3.5's 0.02. At 0.02 the layers add almost nothing to the tied embedding, the last row's logits are
the current token's similarity to every embedding, and greedy decoding repeats one token, which
proves nothing about a cache. Measured here (seed 0, greedy, 64 new tokens, transformers fp32, on the
"arith" and "ping" chat prompts), distinct tokens among the 64 as the range grows:

    initializer_range   0.02   0.05    0.06    0.07    0.08    0.09    0.10    0.15    0.20
    distinct tokens     1, 1   8, 2    56, 56  61, 61  64, 63  62, 64  63, 63  64, 64  63, 64

0.10 is past the jump between 0.05 and 0.06 with room on both sides: every prompt decodes varied text
(63 of 64 distinct), the logits stay moderate (std 0.8, largest |logit| ~4; no float32 stress), and
the smallest top-1/top-2 logit gap over those 128 steps (8.4e-4) is ~25x the MLX-vs-torch difference
measured on this twin (3.4e-5), so the port comparisons test the port, not coin flips.

Untrained: it never chooses a stop token on purpose, so its pin says ``"trained": false`` and the
checks that a generation ends with a stop token skip naming that (:mod:`oracles.pins.pin`).

torch and transformers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.twins import copy_tokenizer, save_snapshot

#: Layer placement: linear attention except every ``FULL_ATTENTION_INTERVAL``-th layer (Qwen3.5's rule).
FULL_ATTENTION_INTERVAL = 4
LAYER_TYPES = ["linear_attention"] * (FULL_ATTENTION_INTERVAL - 1) + ["full_attention"]
#: The seeded weights' normal std (module docstring: how it was chosen).
INITIALIZER_RANGE = 0.1
#: The tiny size. vocab, special ids, context and RoPE base follow SmolLM2-135M-Instruct's config so
#: the twin reads the same token ids and every record fits. Attention keeps Qwen3.5's shape rules:
#: a quarter of each head rotated (``partial_rotary_factor`` 0.25 of head_dim 32: 8 dims, 4
#: frequencies), M-RoPE sections summing to those 4 frequencies (text positions put the same
#: position on all three planes, so they act as plain RoPE); linear attention with twice as many
#: value heads as key heads, as Qwen3.5's 16/32.
CONFIG: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": len(LAYER_TYPES),
    "layer_types": LAYER_TYPES, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "initializer_range": INITIALIZER_RANGE, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 2,
    "rope_parameters": {"rope_type": "default", "rope_theta": 100000.0, "partial_rotary_factor": 0.25,
                        "mrope_section": [2, 1, 1]},
}
#: Files copied from the default snapshot (the shared tokenizer and chat template).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build(seed: int, out: Path, tokenizer_root: Path) -> str:
    """Write the twin's snapshot (config, generation config, float32 safetensors, tokenizer) into ``out``.

    Deterministic: the same torch and transformers versions and ``seed`` give byte-identical files.
    Returns the model class name (``Qwen3_5ForCausalLM``).

    Raises:
        FileNotFoundError: a tokenizer file is missing from ``tokenizer_root``.
    """
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    config = Qwen3_5TextConfig(**CONFIG)
    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(config).float().eval()
    name = save_snapshot(model, out, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}, tied=True)
    copy_tokenizer(tokenizer_root, out, TOKENIZER_FILES)
    return name
