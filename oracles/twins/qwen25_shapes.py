"""The real-size twin: an untrained decoder at Qwen2.5-0.5B's shapes sharing SmolLM2's tokenizer
(``qwen25-0.5b-shapes-twin``, source ``twin:qwen25-0.5b-shapes#SEED``), for measuring what the suite
costs at a size people port: time, peak memory against the weights' bytes, receipt bytes
(``bench/real_size.py``).

Built from transformers' own ``LlamaConfig`` and ``LlamaForCausalLM`` with Qwen2.5-0.5B's published
``config.json`` shapes: hidden 896, MLP 4,864, 24 layers, 14 query heads and 2 key/value heads of 64,
RMSNorm epsilon 1e-6, RoPE base 1,000,000, the full 151,936-row vocabulary, tied embeddings:
494,005,120 parameters, 1.98 GB in float32. The weights are the class's own initialiser under
``torch.manual_seed(SEED)`` (normal, std ``initializer_range`` 0.02 as Qwen2.5's config says); the
tokenizer files and chat template are copied byte for byte from the verified default snapshot, so
every record's recorded SmolLM2 ids run on it (they are below 49,152: the rows past them are read by
the LM head only). Its special ids are SmolLM2's (bos 1, eos and pad 2).

Why Llama's classes and not Qwen2's: Qwen2 differs only by biases on q/k/v (27,648 parameters here),
but a ``model_type`` of ``qwen2`` makes transformers' ``AutoTokenizer`` load ``Qwen2Tokenizer`` whatever
``tokenizer_config.json`` names (``qwen2`` is in its ``MODELS_WITH_INCORRECT_HUB_TOKENIZER_CLASS``,
transformers 5.24), which pre-tokenizes with Qwen2's own pattern: it encodes a blank line as one token
where SmolLM2's ``tokenizer.json`` gives two, so the reference would not feed the recorded ids and the
load-time tokenizer canary refuses the pin (measured here).

Untrained: it never chooses a stop token on purpose (``"trained": false`` in its pin), so a
generation runs to its cap, the work a trained model does at most.

Not part of ``make test`` (a 2 GB build): ``oracles materialize qwen25-0.5b-shapes-twin`` builds it.
torch and transformers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.twins import copy_tokenizer, save_snapshot
from oracles.twins.draft import TOKENIZER_FILES

#: Qwen2.5-0.5B's shapes (its config.json on the Hugging Face hub, Qwen/Qwen2.5-0.5B) without its q/k/v
#: biases (module docstring); SmolLM2's special ids.
CONFIG: dict[str, Any] = {
    "vocab_size": 151936, "hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24,
    "num_attention_heads": 14, "num_key_value_heads": 2, "head_dim": 64, "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "tie_word_embeddings": True, "initializer_range": 0.02,
    "attention_bias": False, "mlp_bias": False, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2,
}


def build(seed: int, out: Path, tokenizer_root: Path) -> str:
    """Write the twin's snapshot (config, generation config, float32 safetensors, tokenizer) into ``out``.

    Deterministic: the same torch and transformers versions and ``seed`` give byte-identical files.
    Peak memory is about twice the weights (the model, and the contiguous copies ``save_snapshot`` writes).
    Returns the model class name.

    Raises:
        FileNotFoundError: a tokenizer file is missing from ``tokenizer_root``.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**CONFIG)).float().eval()
    name = save_snapshot(model, out, {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}, tied=True)
    copy_tokenizer(tokenizer_root, out, TOKENIZER_FILES)
    return name
