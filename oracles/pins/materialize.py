"""Build a pinned snapshot under ``$ORACLES_HOME`` and verify it against its pin.

The only builder so far is the GGUF one: a ``pypi:`` source naming a ``.gguf`` file is read by
transformers (``from_pretrained(..., gguf_file=...)``, which dequantises every tensor with the
``gguf`` package's numpy kernels to float32) and written as a float32 safetensors snapshot:
``config.json``, ``generation_config.json``, ``model.safetensors`` (tensors in sorted order, the
tied ``lm_head.weight`` left out as transformers itself does), and the tokenizer files with the chat
template. The build is deterministic: the same versions give byte-identical files.

torch and transformers are imported inside the functions, never at module import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oracles.errors import PinError
from oracles.pins.pin import Pin, file_digests, sha256_file, snapshot_dir, verify_snapshot
from oracles.pins.pypi import locate_pypi_file


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
    _canonical_json(out / "tokenizer_config.json")
    return type(model).__name__


def _canonical_json(path: Path) -> None:
    if path.is_file():
        obj = json.loads(path.read_text())
        if isinstance(obj, dict):
            obj.pop("name_or_path", None)
            # from_pretrained saves its own loading flag: true under HF_HUB_OFFLINE=1 (the Makefile and
            # the plugin set it), false otherwise. Fixed to the pinned value so the bytes do not depend on it.
            if "local_files_only" in obj:
                obj["local_files_only"] = False
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def materialize(pin: Pin, dest: Path | None = None, *, write_pin: bool = False) -> dict[str, Any]:
    """Build ``pin``'s snapshot into ``dest`` (default ``$ORACLES_HOME/snapshots/NAME``) and verify it.

    A snapshot already at ``dest`` that verifies is kept as it is. The build happens in a temporary
    sibling folder that is renamed into place only after it verifies, so a failed build leaves nothing.
    With ``write_pin`` the pin file's ``files`` and header digests are rewritten from the build
    (for a maintainer creating or bumping a pin) instead of being checked.

    A ``local:`` or ``hf:`` pin (``oracles pin``) is not built: its snapshot is the folder it names (the
    commit's folder in the local Hugging Face cache), verified in place.

    Raises:
        PinError: unsupported source, a source file whose sha256 differs from the pin, or a built
            file that differs from the pin (file, expected and actual digest).
    """
    if pin.source_parts()["local"] or pin.source.startswith("hf:"):
        if dest is not None or write_pin:
            raise PinError(f"{pin.path}: source {pin.source!r} is a snapshot you pinned with `oracles pin`; it is "
                           "verified where it is (no --dest, no --write-pin)")
        return {**verify_snapshot(pin, snapshot_dir(pin)), "built": False}
    dest = dest or snapshot_dir(pin)
    if dest.is_dir() and not write_pin:
        try:
            return {**verify_snapshot(pin, dest), "built": False}
        except PinError:
            pass  # rebuild below; the stale folder is replaced only after the new one verifies
    parts = pin.source_parts()
    extra: dict[str, str] = {}
    from oracles.pins.gguf_pins import gguf_builder

    if (gguf_build := gguf_builder(pin, write_pin)) is not None:  # a .gguf artifact (llama.cpp's): copied or converted
        build, got, extra = gguf_build
    elif parts["kind"] == "twin":
        build, got = _twin_builder(pin, parts), None
    elif parts["derived"]:
        from oracles.pins.convert import derived_builder

        build, got, extra = derived_builder(pin, write_pin)
    else:
        if parts["kind"] != "pypi" or not (parts["file"] or "").endswith(".gguf"):
            raise PinError(f"{pin.path}: source {pin.source!r}: only pypi:PKG==VER#FILE.gguf, twin:NAME#SEED, "
                           "mlx-convert:PIN and dequantize:... sources can be built")
        gguf = locate_pypi_file(parts["what"] or "", parts["version"], parts["file"] or "")
        got = sha256_file(gguf)
        if pin.source_sha256 and got != pin.source_sha256 and not write_pin:
            raise PinError(f"{gguf}: source sha256 mismatch: expected {pin.source_sha256}, actual {got}")
        extra["gguf_type"] = _check_gguf_type(pin, gguf, write_pin)
        build = lambda out: build_gguf_snapshot(gguf, out)  # noqa: E731
    from oracles.pins.convert import building

    with building(dest) as tmp:
        model_class = build(tmp)
        if write_pin:
            _write_pin(pin, tmp, got, model_class, extra)
            from oracles.pins.pin import load_pin

            pin = load_pin(pin.path)
        result = verify_snapshot(pin, tmp)
    return {**result, "root": str(dest), "built": True}


#: twin:NAME -> (builder module with ``build(seed, out, tokenizer_root) -> class name``, the pin
#: whose verified snapshot lends its tokenizer files, or None for a twin that trains its own).
TWINS: dict[str, tuple[str, str | None]] = {
    "llama-draft": ("oracles.twins.draft", "smollm2-135m-instruct"),
    "qwen35-hybrid": ("oracles.twins.hybrid", "smollm2-135m-instruct"),
    "qwen35-vl": ("oracles.twins.qwen35_vl", None),
    "lfm2-vl-d1": ("oracles.twins.lfm2_vl", "smollm2-135m-instruct"),
    "inkling-mtp": ("oracles.twins.mtp", "smollm2-135m-instruct"),
    "deepseek-v4": ("oracles.twins.deepseek_v4", "smollm2-135m-instruct"),
}


def _twin_builder(pin: Pin, parts: dict[str, str | None]) -> Any:
    """The build function of a ``twin:NAME#SEED`` source; verifies the tokenizer-lending snapshot first.

    Raises:
        PinError: unknown twin name (known ones listed), a SEED that is not an int, or the lending
            snapshot missing or not matching its pin.
    """
    import importlib

    from oracles.pins.pin import load_pin

    name, seed = parts["what"] or "", parts["file"] or ""
    if name not in TWINS:
        raise PinError(f"{pin.path}: source {pin.source!r}: unknown twin {name!r}; known: {', '.join(sorted(TWINS))}")
    if not seed.isdigit():
        raise PinError(f"{pin.path}: source {pin.source!r}: SEED must be a non-negative integer")
    module, lender = TWINS[name]
    builder = importlib.import_module(module).build
    if lender is None:
        return lambda out: builder(int(seed), out, None)
    lender_pin = load_pin(lender)
    verify_snapshot(lender_pin, snapshot_dir(lender_pin))
    return lambda out: builder(int(seed), out, snapshot_dir(lender_pin))


def _check_gguf_type(pin: Pin, gguf: Path, write_pin: bool) -> str:
    """The GGUF type of ``gguf``; unless ``write_pin``, it must be the one the pin declares.

    Raises:
        PinError: the pin's ``precision.gguf_type`` differs from the file's (both named).
    """
    from oracles.pins.precision import gguf_type

    got = gguf_type(gguf)
    if not write_pin and pin.precision.gguf_type != got:
        raise PinError(f"{pin.path}: field 'precision.gguf_type' is {pin.precision.gguf_type!r} but the source {gguf} "
                       f"is {got!r}")
    return got


def _write_pin(pin: Pin, root: Path, source_sha256: str | None, model_class: str, extra: dict[str, str]) -> None:
    """Rewrite ``pin``'s file from the build at ``root`` (``--write-pin``): its files, digests, versions and
    precision (``extra``: what the artifact cannot say); a conversion pin's ``recipe.version`` too."""
    from oracles.pins.convert import built_fields

    if any(f.endswith(".gguf") for f in file_digests(root)):
        from oracles.pins.gguf_pins import write_gguf_pin

        return write_gguf_pin(pin, root, source_sha256, model_class)
    parts = pin.source_parts()
    # a GGUF or twin build records the versions of torch, transformers, gguf, safetensors, tokenizers
    tool = (pin.recipe or {}).get("tool") if parts["derived"] else "transformers.gguf"
    obj = json.loads(pin.path.read_text())
    obj.update(built_fields(root, model_class, source_sha256, str(tool), extra))
    if parts["derived"] == "litert-convert":
        from oracles.pins.litert import recipe_fields

        obj["recipe"] = recipe_fields(obj["recipe"], root)
    elif parts["derived"]:
        from oracles.pins.convert import TOOL_DISTRIBUTIONS, versions

        dist = TOOL_DISTRIBUTIONS[str(tool)]
        obj["recipe"] = {**obj["recipe"], "version": versions((dist,))[dist]}
    if parts["kind"] == "twin" and "precision" in obj and obj["precision"] == {"weights": "float32", "compute": "float32"}:
        del obj["precision"]  # the default: a twin's pin file stays as it was
    pin.path.write_text(json.dumps(obj, indent=2) + "\n")
