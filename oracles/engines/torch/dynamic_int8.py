"""The reference's own code with ONNX Runtime's dynamic int8 arithmetic: the band of a ``quantize_dynamic`` export.

``onnxruntime.quantization.quantize_dynamic`` (``QInt8`` weights, per tensor) rewrites an export's
products with a weight initializer. Where the product's input is an activation, it becomes
``DynamicQuantizeLinear`` of the input (ONNX operator spec: one uint8 scale and zero point for the whole
tensor, from its range widened to hold 0)::

    lo = min(0, min x);  hi = max(0, max x);  s = (hi - lo) / 255;  z = clip(round(-lo / s), 0, 255)
    q = clip(round(x / s) + z, 0, 255)                     (round half to even)

then ``MatMulInteger(q, W_q, z, z_w)``, exact in int32, times ``s * s_w``. The other weights (the tied
embedding the head reads) are ``DequantizeLinear`` of int8 values, multiplied in float32.
:func:`install_dynamic_int8` puts that arithmetic into a transformers model: every quantized weight
replaced by its int8 values (read from the ``.onnx``), every activation-quantized ``nn.Linear`` computing
the integer product of the rounded input in float64 (exact) times the two scales. The int8 export's
initializers carry the float export's names, whose float32 values are each ``nn.Linear``'s weight
transposed, bit for bit: :func:`read_int8_weights` maps them by those bytes.

``saturate=True`` also rounds as x86 CPUs without AVX-VNNI compute a uint8 x int8 product (MLAS's AVX2
kernel, ``vpmaddubsw``): adjacent pairs along the reduction summed in int16 with saturation at ±32767
before the int32 sum. Measured on the draft twin's export: ONNX Runtime 1.31.1 on this machine (AVX2, no
VNNI) is within 2.4e-7 of the saturating emulation over 40 positions, and 0.037 from the exact one; the
exact one is the band (what the quantization itself costs), the saturation a property of the kernel.
On SmolLM2 neither tracks ONNX Runtime position by position: one uint8 step of its residual stream is
its range / 255, a range its massive activations widen, so a float32 reordering upstream that moves a
value across a rounding boundary changes everything after it (46-token chat prompt: ONNX Runtime, the
band and the saturating band at KL mean 1.39, 1.27 and 1.21 nats from float32, and 0.47 / 0.73 from
ONNX Runtime): a band to be held statistically (the graded family), not row by row.

Imports torch and onnx inside the functions only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The engine id of the band (an instance id of the torch reference; its runs are kept apart by it).
BAND_ID = "torch@dynamic_uint8"
#: The largest int16: the bound of one saturating pair sum (``vpmaddubsw``).
INT16_MAX = 32767
#: Rows of the saturating product computed at once (``[rows, in / 2, out]`` float64: 113 MB at SmolLM2's MLP).
SATURATE_ROWS = 32


@dataclass(frozen=True)
class Int8Weight:
    """One quantized weight: ``values`` float64 ``[out, in]`` (``W_q - z_w``, integers), ``scale`` (s_w, float32),
    ``activations``: whether its product's input is quantized at run time (a ``MatMulInteger``)."""

    values: Any
    scale: float
    activations: bool


def read_int8_weights(source: Path, int8: Path, model: Any) -> dict[str, Int8Weight]:
    """The int8 weights of ``int8`` (a ``quantize_dynamic`` .onnx) by ``model``'s module name: each
    ``nn.Linear``, and ``"embed_tokens"`` for the input embedding (tied to the head), matched through the float
    export ``source`` (the .onnx it was quantized from, external data beside it) by the weight's bytes.

    Raises:
        ValueError: a quantized initializer that matches no weight of ``model``, or none at all (named).
    """
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper

    graph = onnx.load(str(int8)).graph
    ints = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    integer_inputs = {i for n in graph.node if n.op_type == "MatMulInteger" for i in n.input}
    floats = onnx.load(str(source), load_external_data=False).graph.initializer
    by_bytes = {}
    for tensor in floats:
        if tensor.name + "_quantized" in ints:
            by_bytes[numpy_helper.to_array(tensor, base_dir=str(source.parent)).tobytes()] = tensor.name
    modules = {name: m for name, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    modules["embed_tokens"] = model.get_input_embeddings()
    out: dict[str, Int8Weight] = {}
    matched: set[str] = set()
    for name, module in modules.items():
        w = module.weight.detach().cpu().numpy()
        for form, data in (("transposed", np.ascontiguousarray(w.T)), ("as is", w)):
            base = by_bytes.get(data.tobytes())
            if base is not None:
                q = ints[base + "_quantized"].astype(np.float64) - float(ints[base + "_zero_point"])
                out[name] = Int8Weight(q.T if form == "transposed" else q, float(ints[base + "_scale"]),
                                       base + "_quantized" in integer_inputs)
                matched.add(base)
                break
    if not by_bytes or matched != set(by_bytes.values()):
        left = sorted(set(by_bytes.values()) - matched)[:3]
        raise ValueError(f"{int8}: {len(by_bytes)} quantized weights, {len(matched)} matched a weight of "
                         f"{type(model).__name__} through {source} (unmatched: {left})")
    return out


def quantize_uint8(x: Any) -> tuple[Any, Any, Any]:
    """``DynamicQuantizeLinear`` of ``x`` (a float32 torch tensor, whole tensor): ``(q, s, z)``, ``q`` float32
    holding the uint8 values (module docstring; ONNX operator spec)."""
    import torch

    x = x.float()
    lo, hi = torch.clamp(x.min(), max=0.0), torch.clamp(x.max(), min=0.0)
    scale = (hi - lo) / 255.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero input: any scale rounds it to z
    zero = torch.clamp(torch.round(-lo / scale), 0, 255)
    return torch.clamp(torch.round(x / scale) + zero, 0, 255), scale, zero


def integer_linear(x: Any, weight: Int8Weight, saturate: bool) -> Any:
    """``x [..., in]`` through ``weight`` as ``DynamicQuantizeLinear`` + ``MatMulInteger`` + the scales compute it
    (``saturate``: with the int16 pair saturation of a non-VNNI x86 kernel); float32 ``[..., out]``."""
    import torch

    q, scale, zero = quantize_uint8(x)
    rows = q.double().reshape(-1, q.shape[-1])
    w = torch.as_tensor(weight.values, dtype=torch.float64)
    if saturate:  # [rows, in / 2, out] pair sums, by blocks of rows (a 512-row prefill would hold GBs at once)
        even, odd = w.T[0::2], w.T[1::2]
        odd = odd if odd.shape[0] == even.shape[0] else torch.nn.functional.pad(odd, (0, 0, 0, 1))
        blocks = []
        for r in rows.split(SATURATE_ROWS):
            r_odd = r[:, 1::2] if r[:, 1::2].shape[1] == even.shape[0] else torch.nn.functional.pad(r[:, 1::2], (0, 1))
            pairs = r[:, 0::2, None] * even[None] + r_odd[:, :, None] * odd[None]
            blocks.append(pairs.clamp(-INT16_MAX - 1, INT16_MAX).sum(1))
        acc = torch.cat(blocks) - zero.double() * w.sum(1)[None]
    else:
        acc = (rows - zero.double()) @ w.T
    return (acc.float() * (scale * weight.scale)).reshape(*x.shape[:-1], -1)


def install_dynamic_int8(model: Any, weights: dict[str, Int8Weight], saturate: bool = False) -> int:
    """Give ``model`` the export's int8 arithmetic: each weight in ``weights`` set to its dequantized values
    (float32 ``values * scale``), and each activation-quantized ``nn.Linear`` computing :func:`integer_linear`
    (a forward hook replacing its output). Returns how many Linears compute on rounded activations.

    Raises:
        ValueError: no Linear is activation-quantized (nothing would be rounded: a band of zero width).
    """
    import torch

    modules = dict(model.named_modules())
    modules["embed_tokens"] = model.get_input_embeddings()
    hooked = 0
    with torch.no_grad():
        for name, weight in weights.items():
            module = modules[name]
            module.weight.copy_(torch.as_tensor(weight.values * weight.scale, dtype=torch.float32)
                                .reshape(module.weight.shape))
            if weight.activations:
                module.register_forward_hook(lambda m, args, _out, w=weight: integer_linear(args[0], w, saturate))
                hooked += 1
    if not hooked:
        raise ValueError(f"dynamic int8: no Linear of {type(model).__name__} has an activation-quantized product")
    return hooked


def band_engine(root: Path, pin: Any, threads: int, int8: Path, source: Path, saturate: bool = False) -> Any:
    """The torch reference on ``root`` (the float32 snapshot the export was made from) with the int8 arithmetic
    of the export ``int8`` installed (:func:`install_dynamic_int8`), id :data:`BAND_ID` (``+sat`` when
    ``saturate``).

    Raises:
        ValueError: as :func:`read_int8_weights` and :func:`install_dynamic_int8`.
    """
    from oracles.engines.torch.reference import TorchReference

    engine = TorchReference(root, pin, threads)
    install_dynamic_int8(engine.model, read_int8_weights(source, int8, engine.model), saturate)
    engine.id = BAND_ID + ("+sat" if saturate else "")  # type: ignore[misc]  # an instance id, as the reference's dtypes
    return engine
