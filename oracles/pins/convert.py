"""Conversion sources: snapshots made from another pin, pinned by digest like every other; what their
builds share (the folder a build happens in, the versions and fields it records) and mlx-lm's converter.

``mlx-convert:PIN`` is ``mlx_lm.convert(<PIN's snapshot>, mlx_path=..., **recipe.arguments)`` (mlx-lm's
own converter, as a user runs ``mlx_lm convert``: bfloat16, affine 8-bit, 4-bit, ...);
``dequantize:PIN`` and ``dequantize:local:PATH`` are the float32 snapshot of a quantized MLX folder or a
GGUF file (:mod:`oracles.pins.dequantize`). The pin's ``recipe`` says the tool, its version and its
arguments; its ``source_sha256`` is the source pin's :attr:`~oracles.pins.pin.Pin.digest` (a folder's
digest by the same formula; a file's sha256). Before a build, the source snapshot is materialised and
verified, its digest and the tool's installed version checked against the pin: mlx-lm 0.32.2's
converter is deterministic (two conversions of each built-in pin gave identical sha256 for every
file), so only the same version is expected to give the pinned bytes. The one byte that depended on the
environment (``tokenizer_config.json``'s ``local_files_only``) is fixed as the default pin's build fixes it.

Which builder a source kind takes, and its source snapshot materialised first, is
:mod:`oracles.pins.materialize`'s. mlx and mlx-lm are imported inside the builders, never at import.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Iterator

from oracles.errors import PinError
from oracles.pins.digests import FileDigest, file_digests, safetensors_header
from oracles.pins.precision import Precision, read_precision

#: ``mlx_lm.convert`` keyword arguments a recipe may give (the JSON-valued ones of mlx-lm 0.32's signature).
CONVERT_ARGUMENTS = ("dtype", "quantize", "q_bits", "q_group_size", "q_mode", "quant_predicate")
#: The distribution whose version each recipe tool is.
TOOL_DISTRIBUTIONS = {"mlx_lm.convert": "mlx-lm", "mx.dequantize": "mlx", "transformers.gguf": "transformers"}
#: Distributions recorded as ``built_with`` per tool (those installed).
BUILT_WITH = {"mlx_lm.convert": ("mlx", "mlx-lm", "transformers", "safetensors", "tokenizers"),
              "mx.dequantize": ("mlx", "numpy", "safetensors"),
              "transformers.gguf": ("torch", "transformers", "gguf", "safetensors", "tokenizers"),
              # the converter env's own packages are the recipe's; torch and numpy come from this one
              "litert_torch.generative": ("torch", "numpy", "safetensors", "ai-edge-litert"),
              # the plain graph converts the transformers model itself, so transformers' version counts too
              "litert_torch.convert": ("torch", "transformers", "numpy", "safetensors", "ai-edge-litert"),
              # an .onnx's exporter and quantizer: their own packages are the recipe's (oracles.pins.onnx_export)
              "torch.onnx.export": ("torch", "transformers", "numpy", "safetensors", "tokenizers"),
              "onnxruntime.quantization.quantize_dynamic": ("numpy",),
              # optimum-executorch exports the transformers model with this env's torch and executorch
              "optimum.exporters.executorch": ("torch", "transformers", "numpy", "executorch")}


@contextlib.contextmanager
def building(dest: Path) -> Iterator[Path]:
    """A temporary folder beside ``dest`` to build a snapshot in: when the block ends cleanly it replaces
    ``dest`` whole (renamed into place), when it raises it is removed and ``dest`` is untouched."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            shutil.rmtree(dest)
        tmp.rename(dest)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)


def versions(names: tuple[str, ...]) -> dict[str, str]:
    """Installed version of each distribution in ``names`` (those not installed are left out), read from the
    dist-info folder names as the receipt reads them (:func:`oracles.receipts.environment.installed_versions`;
    ``importlib.metadata.version`` parses each METADATA file, ~6 ms a distribution here)."""
    from oracles.receipts.environment import installed_versions

    return {dist: version for dist, version in installed_versions(names).items() if version is not None}


def folder_digest(root: Path) -> str:
    """sha256 over the sorted (path, sha256) pairs of the non-hidden files under ``root``: the formula of
    :attr:`oracles.pins.pin.Pin.digest`, so a folder pinned later has this digest."""
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    h = hashlib.sha256()
    for name, digest in file_digests(root, names).items():
        h.update(f"{name}\0{digest.sha256}\n".encode())
    return h.hexdigest()


def convert_with_mlx_lm(src: Path, out: Path, arguments: dict[str, Any]) -> str:
    """``mlx_lm.convert(src, mlx_path=out, **arguments)`` into the empty folder ``out`` (removed first:
    the converter refuses an existing path); returns the model class of the written config.

    Raises:
        PinError: the written folder has no config.json with ``architectures``. Whatever mlx-lm raises on
            a model it cannot convert.
    """
    from mlx_lm import convert

    out.rmdir()
    convert(str(src), mlx_path=str(out), **arguments)
    # transformers saves its loading flag (true under HF_HUB_OFFLINE=1): fixed as the default pin's build
    # fixes it, so the bytes do not depend on the environment and the tokenizer is the source pin's.
    canonical_json_file(out / "tokenizer_config.json")
    return model_class_of(out)


def canonical_json_file(path: Path) -> None:
    """Rewrite the JSON object at ``path`` (a saved ``tokenizer_config.json``) with sorted keys, without
    ``name_or_path`` and with ``local_files_only`` false, so its bytes do not depend on where or how the
    build ran; a missing file is left missing."""
    if path.is_file():
        obj = json.loads(path.read_text())
        if isinstance(obj, dict):
            obj.pop("name_or_path", None)
            # from_pretrained saves its own loading flag: true under HF_HUB_OFFLINE=1 (the Makefile and
            # the plugin set it), false otherwise. Fixed to the pinned value so the bytes do not depend on it.
            if "local_files_only" in obj:
                obj["local_files_only"] = False
        path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def model_class_of(root: Path) -> str:
    """``architectures[0]`` of ``root/config.json``.

    Raises:
        PinError: no such file or field (path named).
    """
    try:
        archs = json.loads((root / "config.json").read_text(encoding="utf-8")).get("architectures")
    except (OSError, json.JSONDecodeError, AttributeError) as exc:
        raise PinError(f"{root / 'config.json'}: not a readable config: {exc}") from None
    if not (isinstance(archs, list) and archs and isinstance(archs[0], str)):
        raise PinError(f"{root / 'config.json'}: field 'architectures' is missing or not a list of class names")
    return archs[0]


def built_fields(root: Path, model_class: str, source_sha256: str | None, tool: str,
                 precision: dict[str, str]) -> dict[str, Any]:
    """The pin fields a build determines: files and header digests, model class, source digest, the
    versions it was built with and the precision read from it (``precision``: the fields the artifact
    cannot say, ``gguf_type`` / ``dequantized_from``).

    Raises:
        PinError: as :func:`oracles.pins.precision.read_precision` (config and weights disagree).
    """
    digests: dict[str, FileDigest] = file_digests(root)
    weights = sorted(k for k in digests if k.endswith(".safetensors"))
    found = read_precision(root, weights)
    return {
        "source_sha256": source_sha256,
        "model_class": model_class,
        "files": {k: {"bytes": v.bytes, "sha256": v.sha256} for k, v in sorted(digests.items())},
        "safetensors_headers": {k: hashlib.sha256(safetensors_header(root / k)[2]).hexdigest() for k in weights},
        "built_with": versions(BUILT_WITH[tool]),
        "precision": Precision(**{**found.to_json(), **precision}).to_json(),
    }
