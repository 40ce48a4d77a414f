"""A GGUF file's precision, read from its header's tensor types (no tensor data, no llama.cpp).

The weights are the file's type, ``general.file_type`` without ``MOSTLY_`` (``Q4_K_M``, ``Q8_0``;
``ALL_F32``, ``F16`` and ``BF16`` are float32, float16 and bfloat16 weights); a file without that field
takes the type holding the most matrix elements.

The compute is what llama.cpp's CPU backend rounds a matrix product's activations to before the dot
product: ggml-cpu's ``type_traits_cpu[weight type].vec_dot_type`` (:data:`VEC_DOT`, read from
``ggml/src/ggml-cpu/ggml-cpu.c`` of the llama.cpp that llama-cpp-python 0.3.36 vendors). The int8 x
quantized dot product is then exact, so that rounding is the whole difference from a float32 product
on the dequantized weights (:mod:`oracles.engines.torch.activations`). Over the file's matrices (every
tensor of two or more dimensions; ``token_embd`` only where the file has no ``output`` tensor, so that
the embedding is the tied LM head; otherwise it is a row lookup, dequantized exactly):

- every matrix float32: ``float32``; every one float16 / bfloat16: that type (activations cast to it);
- every one rounded to 8-bit blocks of 32 (``Q8_0`` or ``Q8_1``, which round alike): ``q8_1`` where any
  takes Q8_1, else ``q8_0``: the band of the reference's code with that rounding before every Linear;
- every one rounded to ``Q8_K`` (the K-quants and most IQ types: 8-bit blocks of 256): ``q8_K``;
- anything else (say Q4_K_M of a model whose rows are not multiples of 256: Q8_K for some matrices,
  Q8_0 for the fallbacks, or a float32 output head beside quantized layers): ``per-tensor``.

Pure: the header's type ids are named by the ``gguf`` package's enum (imported inside the functions).
"""

from __future__ import annotations

from collections import Counter
from math import prod
from typing import TYPE_CHECKING

from oracles.errors import PinError
from oracles.pins.precision import Precision

if TYPE_CHECKING:
    from oracles.pins.gguf_file import GgufHeader

#: ggml weight type -> the type its matrix products' activations are rounded to (module docstring).
VEC_DOT = {"F32": "F32", "F16": "F16", "BF16": "BF16", "Q4_0": "Q8_0", "Q4_1": "Q8_1", "Q5_0": "Q8_0", "Q5_1": "Q8_1",
           "Q8_0": "Q8_0", "Q8_1": "Q8_1", "MXFP4": "Q8_0", "IQ4_NL": "Q8_0", "Q2_K": "Q8_K", "Q3_K": "Q8_K",
           "Q4_K": "Q8_K", "Q5_K": "Q8_K", "Q6_K": "Q8_K", "IQ2_XXS": "Q8_K", "IQ2_XS": "Q8_K", "IQ3_XXS": "Q8_K",
           "IQ3_S": "Q8_K", "IQ2_S": "Q8_K", "IQ1_S": "Q8_K", "IQ1_M": "Q8_K", "IQ4_XS": "Q8_K", "TQ1_0": "Q8_K",
           "TQ2_0": "Q8_K"}
#: A file type that is a float type: the weights' name in a pin's precision.
FLOAT_FILES = {"ALL_F32": "float32", "F16": "float16", "BF16": "bfloat16"}
#: The activation rounding of a uniform file -> the pin's ``precision.compute``.
ROUNDING = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "Q8_0": "q8_0", "Q8_1": "q8_1", "Q8_K": "q8_K"}


def type_name(ggml_type: int) -> str:
    """The ggml type id's name as the ``gguf`` package's ``GGMLQuantizationType`` spells it (``"Q4_K"``),
    ``"type <n>"`` for an id it does not know."""
    from gguf.constants import GGMLQuantizationType

    try:
        return GGMLQuantizationType(ggml_type).name
    except ValueError:
        return f"type {ggml_type}"


def matrices(header: "GgufHeader") -> dict[str, str]:
    """tensor name -> ggml type name of the file's matrix-product weights (module docstring)."""
    names = {t.name for t in header.tensors}
    tied = "output.weight" not in names
    return {t.name: type_name(t.ggml_type) for t in header.tensors
            if len(t.dims) >= 2 and (tied or not t.name.startswith("token_embd."))}


def rounding_of(header: "GgufHeader") -> dict[str, str]:
    """tensor name -> the activation type llama.cpp rounds that matrix's products to (:data:`VEC_DOT`).

    Raises:
        PinError: a matrix of a type missing from :data:`VEC_DOT` (file, tensor and type named).
    """
    out = {}
    for name, kind in matrices(header).items():
        if kind not in VEC_DOT:
            raise PinError(f"{header.path}: tensor {name!r} is {kind}, a type whose activation rounding on llama.cpp's "
                           f"CPU is not known here (known: {', '.join(VEC_DOT)})")
        out[name] = VEC_DOT[kind]
    return out


def gguf_precision(header: "GgufHeader") -> Precision:
    """The precision of the GGUF whose header is ``header`` (module docstring): weights, compute, and its
    ``gguf_type`` (``general.file_type`` without ``MOSTLY_``, or the dominant matrix type).

    Raises:
        PinError: a file type llama.cpp does not name (``ftype <n>``), a file of a quantized type without
            matrices, or as :func:`rounding_of`; one line naming the file and the field or tensor.
    """
    rounding = rounding_of(header)
    kind = header.file_type
    if not rounding:  # no matrix product: the file type alone says what the weights are
        if kind in FLOAT_FILES:
            return Precision(FLOAT_FILES[kind], FLOAT_FILES[kind], gguf_type=kind)
        raise PinError(f"{header.path}: field 'tensor infos' holds no matrix (no tensor of two or more dimensions) "
                       f"and 'general.file_type' is {kind!r}: no precision to read")
    if kind is None:
        elements: Counter[str] = Counter()
        for t in header.tensors:
            if t.name in rounding:
                elements[type_name(t.ggml_type)] += prod(t.dims)
        kind = elements.most_common(1)[0][0]
        kind = {"F32": "ALL_F32"}.get(kind, kind)
    if kind.startswith("ftype "):
        raise PinError(f"{header.path}: field 'general.file_type' is {kind.removeprefix('ftype ')}, a type llama.cpp's "
                       "llama_ftype does not name")
    found = set(rounding.values())
    if found <= {"Q8_0", "Q8_1"}:
        compute = "q8_1" if "Q8_1" in found else "q8_0"
    elif len(found) == 1:
        compute = ROUNDING[found.pop()]
    else:
        compute = "per-tensor"
    return Precision(FLOAT_FILES.get(kind, kind), compute, gguf_type=kind)


def rounding_plan(header: "GgufHeader", weights: list[str]) -> dict[str, str]:
    """module name -> rounding (a key of ``oracles.engines.torch.activations.ROUNDINGS``) for every Linear of
    the transformers model dequantized from the GGUF ``header`` describes: ``weights`` are that model's matrix
    names (``model.layers.0.mlp.down_proj.weight``), each mapped to its GGUF tensor by the ``gguf`` package's
    tensor name map (``blk.0.ffn_down``); the embedding is a lookup and left out, and a head tied to it
    (``lm_head`` absent from ``weights``) takes the embedding's rounding.

    Raises:
        PinError: an architecture the ``gguf`` package has no name map for, or a matrix it does not map to
            a tensor of the file (file and names given).
    """
    import gguf
    from gguf.constants import MODEL_ARCH_NAMES

    arch = {name: key for key, name in MODEL_ARCH_NAMES.items()}.get(header.architecture or "")
    blocks = header.metadata.get(f"{header.architecture}.block_count")
    if arch is None or not isinstance(blocks, int):
        raise PinError(f"{header.path}: field 'general.architecture' is {header.architecture!r}: the gguf package has no "
                       "tensor name map for it, so its per-tensor rounding cannot be placed on the reference's layers")
    names = gguf.get_tensor_name_map(arch, blocks)
    rounding = rounding_of(header)
    plan = {}
    for weight in weights:
        base = weight.removesuffix(".weight")
        tensor = names.get_name(base)
        if tensor == "token_embd":
            continue
        if tensor is None or f"{tensor}.weight" not in rounding:
            raise PinError(f"{header.path}: the reference's matrix {weight!r} maps to no matrix of the file "
                           f"({tensor or 'no name'}): its per-tensor rounding is unknown")
        plan[base] = ROUNDING[rounding[f"{tensor}.weight"]]
    if "lm_head" not in plan:
        plan["lm_head"] = ROUNDING[rounding["output.weight" if "output.weight" in rounding else "token_embd.weight"]]
    return dict(sorted(plan.items()))
