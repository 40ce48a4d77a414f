"""The draft twin: a tiny seeded Llama sharing SmolLM2's tokenizer, the draft model of the
speculative oracles (``oracles/builtin/pins/smollm2-draft-twin.json``, source ``twin:llama-draft#SEED``).

Built from transformers' own ``LlamaConfig`` at a tiny size (2 layers, hidden 64, the full 49,152
vocabulary so its ids are the target's ids) with weights from ``torch.manual_seed(SEED)`` through the
class's own initialiser; the tokenizer files and chat template are copied byte for byte from the
verified default snapshot. Its drafts are near random, so it exercises the reject/correct path of a
draft/verify/commit cycle; the target drafting for itself exercises the accept/bonus path.

torch and transformers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.twins import copy_tokenizer, save_snapshot

#: The tiny size. vocab, special ids and RoPE base follow SmolLM2-135M-Instruct's config so the
#: twin reads the same token ids; everything else is as small as a Llama allows.
CONFIG: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5, "tie_word_embeddings": True, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 2, "rope_theta": 100000.0,
}
#: Files copied from the default snapshot (the shared tokenizer and chat template).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def build(seed: int, out: Path, tokenizer_root: Path) -> str:
    """Write the twin's snapshot (config, generation config, float32 safetensors, tokenizer) into ``out``.

    Deterministic: the same torch and transformers versions and ``seed`` give byte-identical files.
    Returns the model class name.

    Raises:
        FileNotFoundError: a tokenizer file is missing from ``tokenizer_root``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(**CONFIG)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).float().eval()
    name = save_snapshot(model, out, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}, tied=True)
    copy_tokenizer(tokenizer_root, out, TOKENIZER_FILES)
    return name
