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
(:func:`build_gguf_snapshot`, the default pin's builder), and beside it, for a
GGUF whose matrices' activations llama.cpp rounds differently one from another (``per-tensor`` compute),
the plan of that rounding per Linear (``ggml_rounding.json``) that its band engine reads.

``oracles pin NAME --dequantize-from PIN|DIR|FILE.gguf`` (:func:`oracles.pins.dequantize_pin.pin_dequantized`) builds it into
``$ORACLES_HOME/snapshots/NAME`` and writes the pin, source ``dequantize:PIN`` or
``dequantize:local:PATH``, so ``oracles materialize NAME`` can rebuild it.

mlx, numpy, safetensors, torch and transformers are imported inside the builders, never at import.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from oracles.errors import PinError
from oracles.pins.convert import canonical_json_file, model_class_of
from oracles.pins.digests import safetensors_header
from oracles.pins.precision import QUANT_KEYS, _tensors, check_packing, module_quantization, quantization

#: The per-Linear rounding plan a dequantized GGUF reference carries (oracles.engines.torch.activations.PLAN_FILE).
PLAN_FILE = "ggml_rounding.json"
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
        model_class = build_gguf_snapshot(src, out)
        _write_rounding_plan(src, out)
        return model_class
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


def build_gguf_snapshot(gguf: Path, out: Path) -> str:
    """Dequantise ``gguf`` into a float32 safetensors snapshot in the empty folder ``out``.

    Returns the model class name. Raises whatever transformers raises on a bad GGUF file.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    state = model.state_dict()
    tied = bool(getattr(model.config, "tie_word_embeddings", False))
    tensors = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in sorted(state.items())
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = model.config.to_dict()
    for volatile in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        config.pop(volatile, None)
    config["dtype"] = "float32"
    config["architectures"] = [type(model).__name__]
    (out / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = model.generation_config.to_dict()
    gen.pop("transformers_version", None)
    (out / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
    tokenizer.save_pretrained(out)
    canonical_json_file(out / "tokenizer_config.json")
    return type(model).__name__


def _write_rounding_plan(gguf: Path, out: Path) -> None:
    """Beside the float32 snapshot dequantized from ``gguf``: where llama.cpp rounds its matrices' activations
    differently from one matrix to the next (``per-tensor`` compute), the plan of that rounding per Linear
    (``ggml_rounding.json``: :func:`oracles.pins.gguf_precision.rounding_plan`), which the band engine reads."""
    from oracles.pins.gguf_file import read_header
    from oracles.pins.gguf_precision import gguf_precision, rounding_plan

    header = read_header(gguf)
    if gguf_precision(header).compute != "per-tensor":
        return
    weights = [name for rel in sorted(out.glob("*.safetensors"))
               for name, entry in safetensors_header(rel)[1].items()
               if name.endswith(".weight") and isinstance(entry, dict) and len(entry.get("shape") or []) == 2]
    plan = {"gguf": gguf.name, "modules": rounding_plan(header, sorted(weights))}
    (out / PLAN_FILE).write_text(json.dumps(plan, indent=2) + "\n")


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
