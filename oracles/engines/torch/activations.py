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

The K-quants (Q2_K..Q6_K) and most IQ types take ``block_q8_K`` activations instead: blocks
of 256, the scale from the block's signed extreme and kept in float32 (ggml-quants.c
``quantize_row_q8_K_ref``, which the x86 CPU backend calls as it is)::

    max = the x_i of largest |x_i|;   iscale = -127 / max;   q_i = round(iscale * x_i);   x_i  ->  q_i * (1 / iscale)

A GGUF that mixes the two (a Q4_K_M whose rows are not multiples of 256 falls back to Q5_0 for those) is
rounded per Linear: :func:`install_q8_activations` takes a plan, module name -> rounding, which the
dequantized reference of that GGUF carries (``ggml_rounding.json``, written by
:mod:`oracles.pins.dequantize`; the reference's id is then ``torch@per-tensor``).

Imports torch inside the functions only.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: Values per block of ggml's 8-bit activation types (``QK8_0 == QK8_1 == 32``, ggml-common.h).
BLOCK = 32
#: Values per block of ``block_q8_K`` (``QK_K``, ggml-common.h).
BLOCK_K = 256
#: The file a dequantized GGUF reference holds its per-Linear rounding plan in (module docstring).
PLAN_FILE = "ggml_rounding.json"


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


def quantize_q8_K_blocks(x: Any) -> Any:
    """``x`` (a float32 torch tensor ``[..., K]``, ``K`` a multiple of :data:`BLOCK_K`) rounded as ggml's
    ``block_q8_K`` activations along its last axis (module docstring), float32, same shape.

    Raises:
        ValueError: ``K`` is not a multiple of 256 (ggml cannot quantize such a row either).
    """
    import torch

    k = int(x.shape[-1])
    if k % BLOCK_K:
        raise ValueError(f"q8_K activation blocks: a row of {k} values is not a multiple of {BLOCK_K}")
    blocks = x.float().reshape(*x.shape[:-1], k // BLOCK_K, BLOCK_K)
    at = blocks.abs().argmax(dim=-1, keepdim=True)  # the first of equal extremes, as ggml's strict ">" keeps it
    peak = blocks.gather(-1, at)
    # true divisions, as the C code's: torch's ``scalar / tensor`` multiplies by a reciprocal (one more rounding)
    iscale = torch.where(peak != 0, torch.full_like(peak, -127.0) / peak, torch.zeros_like(peak))
    q = torch.clamp(torch.round(iscale * blocks), max=127.0)
    d = torch.where(iscale != 0, torch.ones_like(iscale) / iscale, torch.zeros_like(iscale))
    return (q * d).reshape(x.shape).to(x.dtype)


def to_float16(x: Any) -> Any:
    """``x`` rounded to float16 and back: the input of llama.cpp's F16 matrix product (``vec_dot_type`` F16,
    products accumulated in float32)."""
    import torch

    return x.to(torch.float16).to(x.dtype)


def to_bfloat16(x: Any) -> Any:
    """``x`` rounded to bfloat16 and back: the input of llama.cpp's BF16 matrix product."""
    import torch

    return x.to(torch.bfloat16).to(x.dtype)


#: A rounding's name (a pin's ``precision.compute``; a plan's value) -> the function applying it (None: none).
ROUNDINGS = {"q8_0": quantize_q8_blocks, "q8_1": quantize_q8_blocks, "q8_K": quantize_q8_K_blocks,
             "float16": to_float16, "bfloat16": to_bfloat16, "float32": None}


def read_plan(root: Path) -> dict[str, str]:
    """The per-Linear rounding plan of the dequantized GGUF reference at ``root`` (:data:`PLAN_FILE`:
    ``{"gguf": FILE, "modules": {module name: rounding}}``).

    Raises:
        OracleError: the file is missing or not such an object (file named).
    """
    from oracles.errors import OracleError

    path = root / PLAN_FILE
    try:
        modules = json.loads(path.read_text(encoding="utf-8"))["modules"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise OracleError(f"{path}: the per-tensor band needs the rounding plan of the GGUF this reference was "
                          f"dequantized from (oracles pin NAME --dequantize-from FILE.gguf writes it): {exc}") from None
    if not (isinstance(modules, dict) and all(isinstance(v, str) for v in modules.values())):
        raise OracleError(f"{path}: field 'modules' must map module names to roundings")
    return {str(k): str(v) for k, v in modules.items()}


def install_q8_activations(model: Any, rounding: str = "q8_1", plan: dict[str, str] | None = None) -> int:
    """Round the input of every ``torch.nn.Linear`` in ``model`` (a forward pre-hook each) as ``rounding``
    names (:data:`ROUNDINGS`), or, with ``plan`` (module name -> rounding), as the plan names for that
    module; returns how many were hooked.

    Raises:
        ValueError: the model has no Linear layer (nothing would be rounded: a band of zero width), a
            rounding not in :data:`ROUNDINGS`, or a Linear the plan does not name (module named).
    """
    import torch

    hooked = 0
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        kind = rounding if plan is None else plan.get(name)
        if kind not in ROUNDINGS:
            raise ValueError(f"q8 activations: Linear {name!r} has rounding {kind!r}; known: {', '.join(ROUNDINGS)}")
        fn = ROUNDINGS[kind]
        if fn is not None:
            module.register_forward_pre_hook(lambda _m, args, fn=fn: (fn(args[0]), *args[1:]))
            hooked += 1
    if not hooked:
        raise ValueError(f"q8 activations: {type(model).__name__} has no torch.nn.Linear to round the input of")
    return hooked
