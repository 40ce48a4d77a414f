"""The DeepSeek-V4 twin: a tiny seeded DeepSeek-V4 text model with compressed caches, sharing SmolLM2's
tokenizer and chat template (``deepseek-v4-twin``, source ``twin:deepseek-v4#SEED``), the cohort
family's model whose caches hold compressed entries.

Built from transformers 5.24's own ``DeepseekV4Config`` and ``DeepseekV4ForCausalLM`` at the sizes
issue 18 measured: hidden 64; four layers typed sliding-window, compressed sparse attention (CSA,
rate 4, with its Lightning Indexer), heavily compressed attention (HCA, rate 128), CSA; MLPs
hash-routed, hash-routed, top-k MoE, top-k MoE; 4 query heads x head_dim 32 over one shared K=V head;
4 routed experts, top 2, one shared expert; ``index_topk`` 8; a sliding window of 128; ``hc_mult`` 4
hyper-connection streams. With a 148-token prompt and 132 decode steps a lane's positions cross
multiples of 4 (a CSA entry closes every 4th step) and of 128 (an HCA entry closes at position 256),
and the window of 128 is full, so the cohort proof reads every kind of cache buffer.

Indexer heads: 16 (``index_n_heads``). The Lightning Indexer scores an entry as
``sum_h w_h * relu(q_h . k)``; with 2 heads about a quarter of the scores are exactly zero (both
ReLUs off), and ``topk`` over tied scores picks by position, which then depends on how many entries
exist, i.e. on the sequence length (measured for issue 18). 16 heads make an all-zero score rare.

Seeded weights: the class's own initialiser under ``torch.manual_seed(SEED)`` at its
``initializer_range`` 0.02, except the hash routers' ``tid2eid`` tables, which transformers leaves at
zero ("real values come from the checkpoint") so every token would route to expert 0 twice: they are
drawn from a ``torch.Generator`` seeded with SEED, each token's ``num_experts_per_tok`` experts
distinct (a random permutation's first entries), as a trained checkpoint's table holds.

The full 49,152-token vocabulary of SmolLM2, untied head (DeepSeek-V4 does not tie): 6.6 M parameters.
torch and transformers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.twins import copy_tokenizer, save_snapshot

LAYER_TYPES = ["sliding_attention", "compressed_sparse_attention", "heavily_compressed_attention",
               "compressed_sparse_attention"]
MLP_LAYER_TYPES = ["hash_moe", "hash_moe", "moe", "moe"]
#: Compression rates by layer type (DeepSeek-V4's own: m = 4 for CSA, m' = 128 for HCA).
COMPRESS_RATES = {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
#: The tiny size (module docstring). vocab and special ids follow SmolLM2-135M-Instruct's config so the
#: twin reads the same token ids; ``q_lora_rank`` / ``o_lora_rank`` / ``o_groups`` / the indexer head
#: size are the smallest that keep DeepSeek-V4's shape rules (heads * head_dim divisible by o_groups).
CONFIG: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 64, "num_hidden_layers": len(LAYER_TYPES), "layer_types": LAYER_TYPES,
    "mlp_layer_types": MLP_LAYER_TYPES, "compress_rates": COMPRESS_RATES, "num_attention_heads": 4,
    "num_key_value_heads": 1, "head_dim": 32, "q_lora_rank": 32, "o_groups": 2, "o_lora_rank": 32,
    "moe_intermediate_size": 64, "n_routed_experts": 4, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "index_n_heads": 16, "index_head_dim": 16, "index_topk": 8, "sliding_window": 128, "hc_mult": 4,
    "partial_rotary_factor": 0.25, "max_position_embeddings": 8192, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
    "num_nextn_predict_layers": 0,
}
#: Files copied from the default snapshot (the shared tokenizer and chat template).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def seed_hash_tables(model: Any, seed: int) -> None:
    """Fill every hash router's ``tid2eid`` ``[V, top_k]`` (int64) with distinct experts per token,
    drawn from a generator seeded with ``seed`` (module docstring)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    for name, buf in sorted(model.named_buffers()):
        if name.endswith("tid2eid"):
            vocab, top_k = buf.shape
            experts = int(model.config.n_routed_experts)
            draws = torch.rand((vocab, experts), generator=gen).argsort(dim=-1)[:, :top_k]
            buf.copy_(draws.to(buf.dtype))


def build(seed: int, out: Path, tokenizer_root: Path) -> str:
    """Write the twin's snapshot (config, generation config, float32 safetensors, tokenizer) into ``out``.

    Deterministic: the same torch and transformers versions and ``seed`` give byte-identical files.
    Returns the model class name (``DeepseekV4ForCausalLM``).

    Raises:
        FileNotFoundError: a tokenizer file is missing from ``tokenizer_root``.
    """
    import torch
    from transformers import DeepseekV4Config, DeepseekV4ForCausalLM

    config = DeepseekV4Config(**CONFIG)
    torch.manual_seed(seed)
    model = DeepseekV4ForCausalLM(config).float().eval()
    with torch.no_grad():
        seed_hash_tables(model, seed)
    name = save_snapshot(model, out, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}, tied=False)
    copy_tokenizer(tokenizer_root, out, TOKENIZER_FILES)
    return name
