"""What a pin's weights are and what precision its activations are computed in: declared in the pin
file, read from the artifact, and the two checked against each other.

A pin file's optional ``precision`` field (absent: float32 weights, float32 compute)::

    "precision": {"weights": "affine", "compute": "float32", "bits": 4, "group_size": 64, "mode": "affine"}
    "precision": {"weights": "float32", "compute": "float32", "gguf_type": "Q4_1"}
    "precision": {"weights": "float32", "compute": "float32", "dequantized_from": "smollm2-mlx-q4"}

Read from a snapshot folder (:func:`read_precision`), with no weights loaded:

- ``config.json``'s ``quantization`` (mlx-lm writes it, and the same under ``quantization_config``):
  ``bits``, ``group_size``, ``mode`` (default ``"affine"``, as ``mlx.core.quantize``), and per-module
  overrides keyed by module path (mlx-lm's mixed recipes);
- the safetensors headers' dtypes: a quantized linear is a ``U32`` ``NAME.weight`` packing 32 / bits
  values a word, with ``NAME.scales`` (and, in affine mode, ``NAME.biases``) one per group of
  ``group_size`` inputs, so ``weight [out, in * bits / 32]`` and ``scales [out, in / group_size]``
  (the layout of ``mlx.core.quantize``). The compute dtype is the floating dtype holding the most
  elements outside the packed weights (norms, scales, biases, unquantized matrices): the dtype the
  activations take in mlx's quantized and unquantized layers alike.

A GGUF file's type is its ``general.file_type`` (``MOSTLY_Q4_1`` -> ``"Q4_1"``), read with the
``gguf`` package's reader (memory-mapped; nothing dequantised).

Nothing heavy is imported here: ``gguf`` only inside :func:`gguf_type`.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from dataclasses import asdict, dataclass
from math import prod
from pathlib import Path
from typing import Any

from oracles.errors import PinError
from oracles.pins.digests import safetensors_header

#: GGUF block-quantized weight types a GGUF pin's weights may be (:mod:`oracles.pins.gguf_precision`): the
#: quantized ``llama_ftype`` names (gguf.LlamaFileType without ``MOSTLY_``) and, for a file without
#: ``general.file_type``, the ggml tensor types; and the activation types llama.cpp's CPU kernels round their
#: dot products' inputs to: 8-bit blocks of 32 (Q8_0 and Q8_1 round alike: oracles.engines.torch.activations),
#: of 256 (``q8_K``), or a mix of those per tensor (``per-tensor``).
GGUF_WEIGHTS = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
                "Q5_K_S", "Q5_K_M", "Q6_K", "IQ2_XXS", "IQ2_XS", "Q2_K_S", "IQ3_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL",
                "IQ3_S", "IQ3_M", "IQ2_S", "IQ2_M", "IQ4_XS", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4_MOE", "NVFP4", "Q1_0",
                "Q3_K", "Q4_K", "Q5_K", "MXFP4")
GGUF_COMPUTE = ("q8_0", "q8_1", "q8_K", "per-tensor")
#: A ``.tflite``'s dynamic-range quantized weights, and the int8 its activations are quantized to per row when
#: a product runs (:mod:`oracles.pins.tflite_artifact`).
TFLITE_WEIGHTS = ("int8", "int4")
TFLITE_COMPUTE = ("dynamic_int8",)
#: ONNX Runtime's dynamic quantization (``quantize_dynamic``): int8 weights, activations quantized to uint8 per
#: tensor with a scale computed at run time (oracles.engines.onnx.artifact.precision_of).
ONNX_WEIGHTS, ONNX_COMPUTE = ("int8",), ("dynamic_uint8",)
WEIGHTS = tuple(dict.fromkeys(("float32", "bfloat16", "float16", "affine", "mxfp4", "mxfp8", "nvfp4", "gguf") + GGUF_WEIGHTS
                              + TFLITE_WEIGHTS + ONNX_WEIGHTS))
COMPUTE = ("float32", "bfloat16", "float16") + GGUF_COMPUTE + TFLITE_COMPUTE + ONNX_COMPUTE
#: ``mlx.core.quantize`` modes: the ``weights`` values a quantized artifact has (its ``mode``).
QUANTIZED = ("affine", "mxfp4", "mxfp8", "nvfp4")
#: safetensors dtype names of the floating types a precision names (the safetensors format's own).
FLOATS = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
#: The keys a quantized config holds its quantization under (mlx-lm writes both, the same).
QUANT_KEYS = ("quantization", "quantization_config")


@dataclass(frozen=True)
class Precision:
    """What a pin's weights are and what its activations are computed in (module docstring)."""

    weights: str
    compute: str
    bits: int | None = None
    group_size: int | None = None
    mode: str | None = None
    gguf_type: str | None = None
    dequantized_from: str | None = None

    @property
    def exact_compute(self) -> bool:
        """True when activations are float32: a port on this artifact is held to the FLOAT32 bounds."""
        return self.compute == "float32"

    @property
    def quantized(self) -> bool:
        """True for packed weights (an ``mlx.core.quantize`` mode)."""
        return self.weights in QUANTIZED

    def describe(self) -> str:
        """One phrase: ``"affine 4-bit g64, float32 compute"``, ``"float32 weights (from GGUF Q4_1), float32
        compute"``, ``"float32 weights dequantized from smollm2-mlx-q4, float32 compute"``."""
        if self.quantized:
            what = f"{self.weights} {self.bits}-bit g{self.group_size}"
        else:
            what = f"{self.weights} weights"
        if self.gguf_type:
            what += f" (from GGUF {self.gguf_type})"
        if self.dequantized_from:
            what += f" dequantized from {self.dequantized_from}"
        return f"{what}, {self.compute} compute"

    def to_json(self) -> dict[str, Any]:
        """The pin file's ``precision`` object: the set fields only."""
        return {k: v for k, v in asdict(self).items() if v is not None}


FLOAT32 = Precision("float32", "float32")


def parse_precision(value: Any, path: Path) -> Precision:
    """A pin file's ``precision`` field (None: absent, :data:`FLOAT32`).

    Raises:
        PinError: one line naming ``path`` and the field (``precision.bits``, ...) that is malformed.
    """
    if value is None:
        return FLOAT32
    if not isinstance(value, dict):
        raise PinError(f"{path}: field 'precision' must be an object, got {value!r}")
    known = set(Precision.__dataclass_fields__)
    if unknown := sorted(set(value) - known):
        raise PinError(f"{path}: field 'precision.{unknown[0]}' is not a precision field ({', '.join(sorted(known))})")
    for key, allowed in (("weights", WEIGHTS), ("compute", COMPUTE)):
        if value.get(key) not in allowed:
            raise PinError(f"{path}: field 'precision.{key}' is {value.get(key)!r}, not one of {', '.join(allowed)}")
    for key in ("bits", "group_size"):
        if key in value and (type(value[key]) is not int or value[key] <= 0):
            raise PinError(f"{path}: field 'precision.{key}' must be a positive integer, got {value[key]!r}")
    for key in ("mode", "gguf_type", "dequantized_from"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            raise PinError(f"{path}: field 'precision.{key}' must be a non-empty string, got {value[key]!r}")
    quantized = value["weights"] in QUANTIZED
    for key in ("bits", "group_size", "mode"):
        if quantized != (key in value):
            need = "needs" if quantized else "has no use for"
            raise PinError(f"{path}: field 'precision.{key}': weights {value['weights']!r} {need} it")
    if quantized and value["mode"] != value["weights"]:
        raise PinError(f"{path}: field 'precision.mode' is {value['mode']!r} but 'precision.weights' is "
                       f"{value['weights']!r}; a quantized pin's weights are its mode")
    return Precision(**value)


def gguf_type(path: Path) -> str:
    """The type of a GGUF file: its ``general.file_type`` (a ``gguf.LlamaFileType``) without ``MOSTLY_``,
    e.g. ``"Q4_1"``; a file without that field: the tensor type holding the most elements.

    Raises:
        PinError: the file is not a GGUF file the ``gguf`` package reads (path named).
    """
    stat = path.stat()
    return _gguf_type(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=8)
def _gguf_type(path: str, _mtime_ns: int, _size: int) -> str:
    """:func:`gguf_type` of one version of a file (its path, modification time and size): the reader
    parses every tensor's header, ~3 s on the default pin's source, and materialise and verification
    ask it more than once."""
    import gguf

    try:
        reader = gguf.GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise PinError(f"{path}: not a GGUF file the gguf package reads: {exc}") from None
    field = reader.fields.get("general.file_type")
    if field is not None:
        return gguf.LlamaFileType(int(field.parts[field.data[0]][0])).name.removeprefix("MOSTLY_")
    counts: Counter[str] = Counter()
    for tensor in reader.tensors:
        counts[tensor.tensor_type.name] += int(tensor.n_elements)
    return counts.most_common(1)[0][0] if counts else "F32"


def _config(root: Path) -> dict[str, Any]:
    path = root / "config.json"
    if not path.is_file():
        return {}
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PinError(f"{path}: not JSON: {exc}") from None
    return obj if isinstance(obj, dict) else {}


def quantization(root: Path) -> dict[str, Any] | None:
    """``config.json``'s MLX quantization (``{"bits", "group_size", "mode", <module>: {...}}``), or None.

    Raises:
        PinError: ``quantization`` and ``quantization_config`` disagree, one is not an object, or it is a
            transformers quantizer's (``quant_method``), which no engine here loads; naming file and field.
    """
    path = root / "config.json"
    cfg = _config(root)
    found = {k: cfg[k] for k in QUANT_KEYS if cfg.get(k) is not None}
    for key, q in found.items():
        if not isinstance(q, dict):
            raise PinError(f"{path}: field {key!r} is not an object")
        if "quant_method" in q:
            raise PinError(f"{path}: field '{key}.quant_method' is {q['quant_method']!r}: a transformers quantizer's "
                           "weights, which no engine here loads (MLX quantization has bits and group_size)")
    if len(found) == 2 and found["quantization"] != found["quantization_config"]:
        raise PinError(f"{path}: fields 'quantization' and 'quantization_config' disagree")
    q = next(iter(found.values()), None)
    if q is not None:
        for key in ("bits", "group_size"):
            if type(q.get(key)) is not int or q[key] <= 0:
                raise PinError(f"{path}: field '{next(iter(found))}.{key}' must be a positive integer, got {q.get(key)!r}")
        if q.get("mode", "affine") not in QUANTIZED:
            raise PinError(f"{path}: field '{next(iter(found))}.mode' is {q['mode']!r}, not one of {', '.join(QUANTIZED)}")
    return q


def _tensors(root: Path, files: list[str]) -> dict[str, tuple[str, str, list[int]]]:
    """tensor name -> (file, dtype, shape) over the safetensors ``files`` of ``root``."""
    out = {}
    for rel in files:
        _, header, _ = safetensors_header(root / rel)
        for name, entry in header.items():
            if name != "__metadata__" and isinstance(entry, dict):
                out[name] = (rel, str(entry.get("dtype")), list(entry.get("shape") or []))
    return out


def module_quantization(q: dict[str, Any], module: str) -> tuple[int, int, str] | None:
    """(bits, group_size, mode) of ``module`` (a path like ``model.layers.0.mlp.down_proj``) under the
    config's quantization ``q``: its per-module entry where mlx-lm wrote one (``false``: left unquantized),
    else the global values."""
    over = q.get(module)
    if over is False:
        return None
    base = (q["bits"], q["group_size"], str(q.get("mode", "affine")))
    if isinstance(over, dict):
        return int(over.get("bits", base[0])), int(over.get("group_size", base[1])), str(over.get("mode", base[2]))
    return base


def check_packing(root: Path, tensors: dict[str, tuple[str, str, list[int]]], q: dict[str, Any] | None) -> None:
    """Config and weights agree: every ``U32`` weight is quantized by the config, has its scales (and biases
    in affine mode), and its shapes are those of the config's bits and group size (module docstring).

    Shapes fix the product bits x group_size and the word count; 2-bit g128 and 4-bit g64 pack alike,
    and the config's value stands there.

    Raises:
        PinError: one line naming the safetensors file, the tensor and the config field it contradicts.
    """
    config = root / "config.json"
    packed = sorted(n for n, (_, dtype, _) in tensors.items() if dtype == "U32" and n.endswith(".weight"))
    if q is None:
        if packed:
            raise PinError(f"{root / tensors[packed[0]][0]}: tensor {packed[0]!r} is U32 (packed quantized weights) "
                           f"but {config} has no field 'quantization'")
        return
    if not packed:
        raise PinError(f"{config}: field 'quantization' says {q['bits']}-bit g{q['group_size']} but no safetensors file "
                       "holds a U32 packed weight: config and weights disagree")
    for name in packed:
        base = name.removesuffix(".weight")
        rel, _, shape = tensors[name]
        where = f"{root / rel}: tensor {name!r}"
        spec = module_quantization(q, base)
        if spec is None:
            raise PinError(f"{where} is U32 (packed) but {config} field 'quantization.{base}' says it is not quantized")
        bits, group, mode = spec
        scales = tensors.get(f"{base}.scales")
        if scales is None:
            raise PinError(f"{where} is U32 (packed) but there is no tensor '{base}.scales'")
        if (f"{base}.biases" in tensors) != (mode == "affine"):
            state = "missing" if mode == "affine" else "present"
            raise PinError(f"{where}: tensor '{base}.biases' is {state}, but {config} field 'quantization.mode' is {mode!r}")
        s = scales[2]
        inputs = shape[-1] * 32 / bits if shape else 0.0
        if len(s) != len(shape) or s[:-1] != shape[:-1] or inputs != int(inputs) or inputs / group != s[-1]:
            raise PinError(f"{where} is U32 {shape} with scales {s}: at {config} field 'quantization' bits {bits}, "
                           f"group_size {group} it packs {inputs:g} inputs in {inputs / group:g} groups, not "
                           f"{s[-1] if s else '?'}: config and weights disagree")


def read_precision(root: Path, files: list[str]) -> Precision:
    """The precision of the snapshot at ``root`` from its ``config.json`` and the headers of its safetensors
    ``files`` (relative paths); no tensor data is read. ``gguf_type`` and ``dequantized_from`` are not in the
    artifact and stay None. A snapshot without safetensors headers takes config.json's ``dtype``
    (``torch_dtype``), else float32.

    Raises:
        PinError: config and weights disagree (:func:`check_packing`), or the quantization is malformed
            (:func:`quantization`); one line naming file, tensor and field.
    """
    q = quantization(root)
    tensors = _tensors(root, files)
    check_packing(root, tensors, q)
    elements: Counter[str] = Counter()
    for _, dtype, shape in tensors.values():
        if dtype in FLOATS:
            elements[FLOATS[dtype]] += prod(shape)
    if elements:
        compute = elements.most_common(1)[0][0]
    else:
        cfg = _config(root)
        declared = cfg.get("dtype", cfg.get("torch_dtype"))
        compute = declared if declared in COMPUTE else "float32"
    if q is not None:
        mode = str(q.get("mode", "affine"))
        return Precision(mode, compute, int(q["bits"]), int(q["group_size"]), mode)
    return Precision(compute, compute)


def check_precision(declared: Precision, root: Path, files: list[str], pin_path: Path) -> Precision:
    """The precision ``declared`` by the pin at ``pin_path`` against what the snapshot at ``root`` holds
    (:func:`read_precision`); returns what it holds.

    Raises:
        PinError: config and weights disagree, or a declared field differs from the artifact's; one line
            naming the pin file, the field and both values.
    """
    got = read_precision(root, files)
    for key in ("weights", "compute", "bits", "group_size", "mode"):
        want, have = getattr(declared, key), getattr(got, key)
        if want != have:
            note = " (float32 is what a pin without a 'precision' field declares)" if declared == FLOAT32 else ""
            raise PinError(f"{pin_path}: field 'precision.{key}' is {want!r} but the snapshot {root} holds {have!r} "
                           f"(its config.json quantization and safetensors dtypes){note}")
    return got


#: A pin name, as a pin file's ``reference`` and ``converted_from`` give one (a file stem).
_PIN_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"
#: The tool each conversion source kind is made by, as its ``recipe.tool`` names it.
RECIPE_TOOLS = {"mlx-convert": ("mlx_lm.convert",), "dequantize": ("mx.dequantize", "transformers.gguf"),
                "gguf-convert": ("convert_hf_to_gguf.py",),
                "litert-convert": ("litert_torch.generative", "litert_torch.convert"),
                "onnx-export": ("torch.onnx.export", "onnxruntime.quantization.quantize_dynamic"),
                "executorch-convert": ("optimum.exporters.executorch",)}


def derived_fields(obj: dict[str, Any], path: Path, derived: str | None, from_pin: str | None) -> dict[str, Any]:
    """The pin file's ``precision``, ``reference``, ``converted_from`` and ``recipe`` as :class:`Pin` keyword
    arguments. ``derived`` is the conversion source kind (``mlx-convert``, ``dequantize``; None for any
    other source) and ``from_pin`` the pin it names: ``converted_from`` defaults to it and may not differ,
    and such a source needs a ``recipe`` whose ``tool`` is the kind's (:data:`RECIPE_TOOLS`).

    Raises:
        PinError: a malformed field, one line naming ``path`` and the field.
    """
    import re

    out: dict[str, Any] = {"precision": parse_precision(obj.get("precision"), path)}
    for key in ("reference", "converted_from"):
        value = obj.get(key)
        if value is not None and not (isinstance(value, str) and re.fullmatch(_PIN_NAME, value)):
            raise PinError(f"{path}: field {key!r} must be a pin name, got {value!r}")
        out[key] = value
    if from_pin is not None:
        if out["converted_from"] not in (None, from_pin):
            raise PinError(f"{path}: field 'converted_from' is {out['converted_from']!r} but the source converts "
                           f"pin {from_pin!r}")
        out["converted_from"] = from_pin
    recipe = obj.get("recipe")
    if recipe is None and derived is not None:
        raise PinError(f"{path}: field 'recipe' is missing: a {derived}: source needs the tool, its version and "
                       "its arguments")
    if recipe is not None:
        if not (isinstance(recipe, dict) and isinstance(recipe.get("tool"), str)
                and isinstance(recipe.get("version"), str) and isinstance(recipe.get("arguments", {}), dict)):
            raise PinError(f"{path}: field 'recipe' must be {{\"tool\": str, \"version\": str, \"arguments\": {{...}}}}")
        if derived is not None and recipe["tool"] not in RECIPE_TOOLS[derived]:
            raise PinError(f"{path}: field 'recipe.tool' is {recipe['tool']!r} but a {derived}: source is made by "
                           f"{' or '.join(RECIPE_TOOLS[derived])}")
        out["recipe"] = {**recipe, "arguments": dict(recipe.get("arguments", {}))}
    return out
