"""The dequantized reference: a float32 snapshot transformers loads, made from a quantized artifact's own
weights, so a port on the quantized artifact can be held to float32 bounds against it.

From a quantized MLX folder (:func:`dequantize_snapshot`): every packed weight is
``mx.dequantize(weight, scales, biases, group_size, bits, mode)`` with the config's (per-module) bits,
group size and mode (``biases`` is None in the modes that have none: mxfp4, mxfp8, nvfp4), every
other tensor is cast to float32; written with safetensors (tensors in sorted order) as one
``model.safetensors``, beside ``config.json`` without its quantization keys (and ``dtype``
float32) and every other file of the folder but the weights index and mlx-lm's README. The tensor
names stay MLX's, which are transformers' for the Llama family (mlx-lm's ``llama.sanitize`` only drops
the rotary buffers and a tied head). From a GGUF file: transformers' own GGUF reader
(:func:`oracles.pins.materialize.build_gguf_snapshot`, the default pin's builder).

``oracles pin NAME --dequantize-from PIN|DIR|FILE.gguf`` (:func:`pin_dequantized`) builds it into
``$ORACLES_HOME/snapshots/NAME`` and writes the pin, source ``dequantize:PIN`` or
``dequantize:local:PATH``, so ``oracles materialize NAME`` can rebuild it.

mlx, numpy and safetensors are imported inside the builder, never at import.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from oracles.errors import OracleError, PinError
from oracles.pins.convert import TOOL_DISTRIBUTIONS, building, built_fields, model_class_of, source_of, versions
from oracles.pins.pin import Pin, PinStore, load_pin, oracles_home, store, verify_snapshot
from oracles.pins.precision import QUANT_KEYS, _tensors, check_packing, gguf_type, module_quantization, quantization

#: Files of a quantized MLX folder the float32 snapshot does not keep: its weights, their index, and the
#: model card mlx-lm writes (it says "mlx", which this snapshot is not).
NOT_COPIED = ("config.json", "README.md")


def _weights(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*.safetensors")
                  if not any(part.startswith(".") for part in p.relative_to(root).parts))


def dequantize_snapshot(src: Path, out: Path) -> str:
    """Write the float32 snapshot of the quantized MLX folder (or ``.gguf`` file) ``src`` into the empty
    folder ``out`` (module docstring); returns the model class.

    Tensors: a packed ``uint32 [out, in * bits / 32]`` weight becomes ``float32 [out, in]``; every other
    tensor keeps its shape, cast to float32.

    Raises:
        PinError: ``src`` is not quantized (no ``quantization`` in its config.json), or its config and
            weights disagree (:func:`oracles.pins.precision.check_packing`); checked before anything is
            written. Whatever transformers raises on a bad GGUF file.
    """
    if src.is_file():
        if src.suffix != ".gguf":
            raise PinError(f"{src}: a dequantize source is a quantized MLX folder or a .gguf file")
        from oracles.pins.materialize import build_gguf_snapshot

        return build_gguf_snapshot(src, out)
    q = quantization(src)
    if q is None:
        raise PinError(f"{src / 'config.json'}: not quantized (no field 'quantization'): a dequantize source is a "
                       "quantized MLX folder or a .gguf file")
    files = _weights(src)
    tensors = _tensors(src, files)
    check_packing(src, tensors, q)
    model_class = model_class_of(src)
    _write_float32(src, files, q, out / "model.safetensors")
    config = json.loads((src / "config.json").read_text(encoding="utf-8"))
    for key in QUANT_KEYS:
        config.pop(key, None)
    for key in ("dtype", "torch_dtype"):
        if key in config or key == "dtype":
            config[key] = "float32"
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for path in sorted(src.rglob("*")):
        rel = path.relative_to(src)
        if (path.is_file() and rel.as_posix() not in NOT_COPIED and not rel.name.startswith(".")
                and not rel.name.endswith((".safetensors", ".safetensors.index.json"))):
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, out / rel)
    return model_class


def _write_float32(src: Path, files: list[str], q: dict[str, Any], target: Path) -> None:
    """``mx.dequantize`` each packed weight of ``files``, cast the rest, save one float32 safetensors file."""
    import mlx.core as mx
    import numpy as np
    from safetensors.numpy import save_file

    weights: dict[str, Any] = {}
    for rel in files:
        loaded = mx.load(str(src / rel))
        assert isinstance(loaded, dict)  # a .safetensors file loads as a dict of arrays
        weights.update(loaded)
    packed = {n.removesuffix(".weight") for n, v in weights.items() if n.endswith(".weight") and v.dtype == mx.uint32}
    out: dict[str, np.ndarray] = {}
    for name in sorted(weights):
        base, _, leaf = name.rpartition(".")
        if base in packed and leaf in ("scales", "biases"):
            continue
        if base in packed:
            spec = module_quantization(q, base)
            assert spec is not None  # check_packing refused a packed weight the config leaves unquantized
            bits, group, mode = spec
            value = mx.dequantize(weights[name], weights[f"{base}.scales"], weights.get(f"{base}.biases"),
                                  group_size=group, bits=bits, mode=mode, dtype=mx.float32)
        else:
            value = weights[name].astype(mx.float32)
        out[name] = np.array(value, copy=True)
    save_file(out, str(target), metadata={"format": "pt"})


def pin_dequantized(name: str, spec: str, pins_dir: Path | None = None) -> Pin:
    """``oracles pin NAME --dequantize-from SPEC``: build the float32 snapshot of ``spec`` (a pin name, a
    quantized MLX folder or a ``.gguf`` file) into ``$ORACLES_HOME/snapshots/NAME`` and write its pin
    (source ``dequantize:PIN`` or ``dequantize:local:PATH``, the source's digest, the recipe, the precision
    with ``dequantized_from`` or ``gguf_type``) in ``pins_dir`` (default: the active store's first folder).

    Returns the written pin, verified against the built snapshot.

    Raises:
        PinError: a bad or taken name, a source that does not exist or is not quantized, config and
            weights that disagree, or the pin cannot be written; nothing is left half-written (the
            snapshot is built in a temporary folder, the pin created whole, then the folder renamed).
    """
    from oracles.pins.writer import check_name

    where = store() if pins_dir is None else PinStore.with_project(pins_dir)
    check_name(name, where)
    is_pin = "/" not in spec and where.path(spec) is not None
    source = f"dequantize:{spec}" if is_pin else f"dequantize:local:{Path(spec).expanduser().resolve()}"
    draft = Pin(name=name, source=source, source_sha256=None, model_class="", files={}, safetensors_headers={},
                built_with={}, path=(pins_dir or where.dirs[0]) / f"{name}.json")
    root, digest, called = source_of(draft)
    tool = "transformers.gguf" if root.is_file() else "mx.dequantize"
    dist = TOOL_DISTRIBUTIONS[tool]
    extra = {"gguf_type": gguf_type(root)} if root.is_file() else {"dequantized_from": called}
    dest = oracles_home() / "snapshots" / name
    with building(dest) as tmp:
        model_class = dequantize_snapshot(root, tmp)
        doc = {"name": name, "source": source, **built_fields(tmp, model_class, digest, tool, extra),
               "recipe": {"tool": tool, "version": versions((dist,)).get(dist, ""), "arguments": {}}}
        if is_pin:
            doc["converted_from"] = spec
        pin = _write_pin_file(draft.path, doc)
    verify_snapshot(pin, dest)
    return pin


def _write_pin_file(target: Path, doc: dict[str, Any]) -> Pin:
    from oracles.receipts.files import write_exclusive

    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_exclusive(target, (json.dumps(doc, indent=2) + "\n").encode())
    except OracleError as exc:
        raise PinError(f"{target}: not written: {exc}") from None
    try:
        return load_pin(target)
    except OracleError:
        target.unlink()  # a pin that does not parse is not left behind
        raise
