"""The reference's own code with llama.cpp's activation rounding: the band of a quantized GGUF on its CPU.

llama.cpp's CPU backend computes a matrix product with quantized weights by quantizing the activations
first: each row of the input is cut into blocks of 32 values along the reduction axis and stored as
int8 with one float16 scale per block (ggml's ``block_q8_0`` / ``block_q8_1``; the weight type's
``vec_dot_type`` in ggml-cpu's type traits: Q8_1 for Q4_0/Q4_1, Q8_0 for Q8_0 and Q5_x). The int8 x
int4/int8 dot product is then exact, so the whole difference from a float32 product on the
dequantized weights is this rounding of the activations. A block ``x[0:32]`` becomes (ggml-cpu
``quantize_row_q8_1``, x86 path)::

    amax = max |x_i|;   id = 127 / amax (0 when amax is 0);   q_i = round(x_i * id)  (to nearest even)
    d = float16(amax / 127);   x_i  ->  q_i * d

Q8_0 and Q8_1 round the same way (Q8_1 also stores ``d * sum q_i``, which only Q4_1's offset term
reads, exactly). :func:`install_q8_activations` puts that rounding in front of every ``nn.Linear`` of
a transformers model (the LM head included: SmolLM2's tied output is the Q8_0 ``token_embd``), so the
reference run in ``"q8_1"`` (``TorchReference(dtype="q8_1")``, id ``torch@q8_1``) is the band a
llama.cpp port of a Q4_1 GGUF is judged by (:mod:`oracles.checks.judgment`). Attention's own
products (Q.K, P.V) read the KV cache in float32 (an f32 cache) and are not rounded; the embedding
lookup dequantizes rows exactly.

Imports torch inside the functions only.
"""

from __future__ import annotations

from typing import Any

#: Values per block of ggml's 8-bit activation types (``QK8_0 == QK8_1 == 32``, ggml-common.h).
BLOCK = 32


def quantize_q8_blocks(x: Any) -> Any:
    """``x`` (a float32 torch tensor ``[..., K]``, ``K`` a multiple of :data:`BLOCK`) rounded as ggml's
    Q8_1 / Q8_0 activation blocks along its last axis (module docstring), float32, same shape.

    Raises:
        ValueError: ``K`` is not a multiple of 32 (ggml cannot quantize such a row either).
    """
    import torch

    k = int(x.shape[-1])
    if k % BLOCK:
        raise ValueError(f"q8 activation blocks: a row of {k} values is not a multiple of {BLOCK}")
    blocks = x.float().reshape(*x.shape[:-1], k // BLOCK, BLOCK)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    q = torch.round(blocks * scale)
    d = (amax / 127.0).to(torch.float16).to(torch.float32)
    return (q * d).reshape(x.shape).to(x.dtype)


def install_q8_activations(model: Any) -> int:
    """Round the input of every ``torch.nn.Linear`` in ``model`` by :func:`quantize_q8_blocks` (a
    forward pre-hook each); returns how many were hooked.

    Raises:
        ValueError: the model has no Linear layer (nothing would be rounded: a band of zero width).
    """
    import torch

    hooked = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Linear):
            module.register_forward_pre_hook(lambda _m, args: (quantize_q8_blocks(args[0]), *args[1:]))
            hooked += 1
    if not hooked:
        raise ValueError(f"q8 activations: {type(model).__name__} has no torch.nn.Linear to round the input of")
    return hooked
