"""What a loaded mlx-lm model computes in, read from the model itself, and what its artifact declares.

mlx-lm's loader builds the model from the folder's config.json and weights (``mlx_lm.utils.load_model``):
a ``"quantization"`` block there makes it swap each ``Linear`` / ``Embedding`` whose weights carry
``.scales`` for a ``QuantizedLinear`` / ``QuantizedEmbedding``, with bits and group size recovered from
the packed weight shapes (``infer_quant_config``: the config's numbers are defaults only), and the
floating parameters keep the dtype they were saved in. So the loaded modules are the one account of
what the port computes; the artifact's declarations (the config's block, the pin's precision) are
held against it (:func:`disagreements`).

Vocabulary (that of ``oracles.pins.precision.Precision``, the pin's field; this class has the same
field names so either can be read where the other is): ``weights`` is a float dtype name or the
quantization mode (``"affine"``, ``"mxfp4"``, ``"mxfp8"``, ``"nvfp4"``: the modes ``mlx_lm.convert``'s
``q_mode`` offers in mlx-lm 0.32.2); ``compute`` is the float dtype of the activations.

The config's ``"dtype"`` is not a declaration of the float dtype: ``mlx_lm.convert(dtype="bfloat16")``
rewrites the weights and leaves config.json's ``"dtype": "float32"`` as it was (measured on SmolLM2,
mlx-lm 0.32.2), so only the quantization block is read from it. Pure but for :func:`loaded_precision`,
which imports mlx.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: mlx dtype names -> the vocabulary's float names.
FLOAT_DTYPES = {"mlx.core.float32": "float32", "mlx.core.bfloat16": "bfloat16", "mlx.core.float16": "float16"}
#: The quantization modes mlx-lm 0.32.2's ``convert`` writes (``--q-mode`` choices).
MODES = ("affine", "mxfp4", "nvfp4", "mxfp8")
#: The fields a declaration may state and the loaded precision is compared on.
FIELDS = ("weights", "compute", "bits", "group_size", "mode")


@dataclass(frozen=True)
class LoadedPrecision:
    """What a loaded model holds: ``weights`` (float dtype or quantization mode), ``compute`` (float
    dtype of the activations), and for a quantized model ``bits``, ``group_size``, ``mode`` (None when
    the quantized modules differ: then ``variants`` lists each distinct ``(bits, group_size, mode)``)."""

    weights: str
    compute: str
    bits: int | None = None
    group_size: int | None = None
    mode: str | None = None
    variants: tuple[tuple[int, int, str], ...] = ()

    @property
    def exact_compute(self) -> bool:
        """Activations in float32: a port on this artifact can be held to the float32 thresholds."""
        return self.compute == "float32"

    def describe(self) -> str:
        """``"affine 4-bit g64, float32 compute"``, ``"bfloat16 weights, bfloat16 compute"``."""
        if not self.variants:
            return f"{self.weights} weights, {self.compute} compute"
        shown = ", ".join(f"{m} {b}-bit g{g}" for b, g, m in self.variants)
        return f"{shown}, {self.compute} compute"

    def to_json(self) -> dict[str, Any]:
        """The fields as a JSON-safe dict (variants as lists)."""
        return {"weights": self.weights, "compute": self.compute, "bits": self.bits, "group_size": self.group_size,
                "mode": self.mode, "variants": [list(v) for v in self.variants], "describe": self.describe()}


def precision_of(floating: Iterable[str], quantized: Iterable[tuple[int, int, str]]) -> LoadedPrecision:
    """The precision of a model whose floating parameters have the mlx dtype names ``floating`` (every
    floating parameter, quantization scales and biases included) and whose quantized modules have the
    ``(bits, group_size, mode)`` triples ``quantized``.

    The compute dtype is the one floating dtype: mlx promotes a mixed operation to the wider type, so
    with two floating dtypes the activations change dtype inside the model and no one name is true.

    Raises:
        TypeError: no floating parameter, a floating dtype outside :data:`FLOAT_DTYPES`, or several
            (all named).
    """
    found = sorted(set(floating))
    if len(found) != 1 or found[0] not in FLOAT_DTYPES:
        raise TypeError(f"floating parameters are {found}: the port computes in exactly one of "
                        f"{sorted(FLOAT_DTYPES.values())}")
    compute = FLOAT_DTYPES[found[0]]
    variants = tuple(sorted(set(quantized)))
    if not variants:
        return LoadedPrecision(weights=compute, compute=compute)
    modes = {m for _, _, m in variants}
    weights = modes.pop() if len(modes) == 1 else "mixed"
    if len(variants) == 1:
        bits, group, mode = variants[0]
        return LoadedPrecision(weights, compute, bits, group, mode, variants)
    return LoadedPrecision(weights, compute, variants=variants)


def loaded_precision(model: Any) -> LoadedPrecision:
    """:func:`precision_of` of a loaded mlx ``nn.Module``: its parameters' dtypes (``mx.floating``
    ones) and its ``QuantizedLinear`` / ``QuantizedEmbedding`` modules' ``bits``, ``group_size``, ``mode``.

    Raises:
        TypeError: see :func:`precision_of`.
    """
    import mlx.core as mx
    import mlx.nn as nn
    from mlx.utils import tree_flatten

    flat: list[tuple[str, Any]] = []
    tree_flatten(model.parameters(), destination=flat)
    floating = [str(v.dtype) for _, v in flat if mx.issubdtype(v.dtype, mx.floating)]
    quantized = [(int(m.bits), int(m.group_size), str(getattr(m, "mode", "affine"))) for _, m in model.named_modules()
                 if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))]
    return precision_of(floating, quantized)


def config_declaration(config: Mapping[str, Any]) -> dict[str, Any]:
    """What config.json declares of the precision mlx-lm will load: ``{"bits", "group_size", "mode"}``
    from its ``"quantization"`` block (mode ``"affine"`` when absent, as mlx-lm reads it), ``bits`` and
    ``group_size`` left out when the block also holds per-module entries (mlx-lm's mixed recipes: the
    top-level numbers are then defaults only); ``{"mode": None}`` without a block (nothing is quantized
    by mlx-lm then); never a float dtype (module docstring).

    Raises:
        ValueError: a ``"quantization"`` that is not an object, or a mode mlx-lm does not write.
    """
    block = config.get("quantization")
    if block is None:
        return {"mode": None}
    if not isinstance(block, Mapping):
        raise ValueError(f"config.json: field 'quantization' is {type(block).__name__}, not an object")
    mode = block.get("mode", "affine")
    if mode not in MODES:
        raise ValueError(f"config.json: field 'quantization.mode' is {mode!r}, not one of {list(MODES)}")
    per_module = any(isinstance(v, (Mapping, bool)) for k, v in block.items() if k not in ("bits", "group_size", "mode"))
    out: dict[str, Any] = {"mode": mode}
    if not per_module:
        out.update({k: block[k] for k in ("bits", "group_size") if k in block})
    return out


def pin_declaration(pin: Any) -> dict[str, Any]:
    """The pin's declared precision (``Pin.precision``'s stated :data:`FIELDS`, None ones left out), or
    {} for a pin without that field."""
    precision = getattr(pin, "precision", None)
    if precision is None:
        return {}
    return {f: getattr(precision, f) for f in FIELDS if getattr(precision, f, None) is not None}


def disagreements(declared: Mapping[str, Any], loaded: LoadedPrecision) -> list[str]:
    """``"FIELD: declared X, loaded Y"`` for each field of ``declared`` (keys among :data:`FIELDS`)
    that the loaded precision contradicts; [] when they agree."""
    return [f"{field}: declared {want!r}, loaded {getattr(loaded, field)!r}" for field, want in declared.items()
            if getattr(loaded, field) != want]


__all__ = ["FIELDS", "FLOAT_DTYPES", "MODES", "LoadedPrecision", "config_declaration", "disagreements",
           "loaded_precision", "pin_declaration", "precision_of"]
