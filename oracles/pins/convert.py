"""Conversion sources: snapshots made from another pin, pinned by digest like every other.

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

mlx and mlx-lm are imported inside the builders, never at import.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from oracles.errors import PinError
from oracles.pins.pin import FileDigest, Pin, file_digests, load_pin, safetensors_header, sha256_file, snapshot_dir
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
              "litert_torch.convert": ("torch", "transformers", "numpy", "safetensors", "ai-edge-litert")}


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
    """Installed version of each distribution in ``names`` (those not installed are left out)."""
    out = {}
    for dist in names:
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return out


def folder_digest(root: Path) -> str:
    """sha256 over the sorted (path, sha256) pairs of the non-hidden files under ``root``: the formula of
    :attr:`oracles.pins.pin.Pin.digest`, so a folder pinned later has this digest."""
    names = sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                   if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts))
    h = hashlib.sha256()
    for name, digest in file_digests(root, names).items():
        h.update(f"{name}\0{digest.sha256}\n".encode())
    return h.hexdigest()


def source_of(pin: Pin) -> tuple[Path, str, str]:
    """(source snapshot folder or file, its digest, what it is called) of a conversion pin; a source pin is
    materialised (built or verified) first.

    Raises:
        PinError: the source pin is unknown or does not build/verify; a source path does not exist.
    """
    parts = pin.source_parts()
    if parts["from_pin"]:
        from oracles.pins.materialize import materialize

        src = load_pin(parts["from_pin"])
        materialize(src)
        return snapshot_dir(src), src.digest, src.name
    path = Path(parts["from_path"] or "")
    if not path.exists():
        raise PinError(f"{pin.path}: field 'source' {pin.source!r}: {path} does not exist")
    return path, sha256_file(path) if path.is_file() else folder_digest(path), f"local:{path}"


def derived_builder(pin: Pin, write_pin: bool) -> tuple[Callable[[Path], str], str, dict[str, str]]:
    """(build function ``out -> model class``, source digest, the precision fields the artifact cannot say:
    ``dequantized_from`` of a folder's dequantisation) of an ``mlx-convert:`` or ``dequantize:`` pin,
    after checking the source digest and the tool's version against the pin (unless ``write_pin``: a
    maintainer re-making the pin).

    Raises:
        PinError: the source's digest or the installed tool's version differs from the pin's, or a
            recipe argument ``mlx_lm.convert`` does not take; one line naming the pin file and field.
    """
    root, digest, called = source_of(pin)
    recipe = pin.recipe or {}
    if not write_pin and pin.source_sha256 != digest:
        raise PinError(f"{pin.path}: field 'source_sha256' is {pin.source_sha256} but the source {pin.source!r} has "
                       f"digest {digest}")
    if pin.source_parts()["derived"] == "litert-convert":  # its converter is in its own env (pins/litert.py)
        from oracles.pins.litert import litert_builder

        return litert_builder(pin, root, write_pin), digest, {}
    tool = str(recipe.get("tool"))
    installed = versions((TOOL_DISTRIBUTIONS.get(tool, tool),)).get(TOOL_DISTRIBUTIONS.get(tool, tool))
    if not write_pin and recipe.get("version") != installed:
        raise PinError(f"{pin.path}: field 'recipe.version' is {recipe.get('version')!r} but {tool} here is "
                       f"{installed!r}; install the pinned version (constraints.txt) to rebuild the pinned bytes")
    if pin.source_parts()["derived"] == "dequantize":
        from oracles.pins.dequantize import dequantize_snapshot

        extra = {} if root.is_file() else {"dequantized_from": called}
        return (lambda out: dequantize_snapshot(root, out)), digest, extra
    arguments = dict(recipe.get("arguments", {}))
    if bad := sorted(set(arguments) - set(CONVERT_ARGUMENTS)):
        raise PinError(f"{pin.path}: field 'recipe.arguments.{bad[0]}' is not an mlx_lm.convert argument this "
                       f"source passes ({', '.join(CONVERT_ARGUMENTS)})")
    return (lambda out: convert_with_mlx_lm(root, out, arguments)), digest, {}


def convert_with_mlx_lm(src: Path, out: Path, arguments: dict[str, Any]) -> str:
    """``mlx_lm.convert(src, mlx_path=out, **arguments)`` into the empty folder ``out`` (removed first:
    the converter refuses an existing path); returns the model class of the written config.

    Raises:
        PinError: the written folder has no config.json with ``architectures``. Whatever mlx-lm raises on
            a model it cannot convert.
    """
    from mlx_lm import convert

    from oracles.pins.materialize import _canonical_json

    out.rmdir()
    convert(str(src), mlx_path=str(out), **arguments)
    # transformers saves its loading flag (true under HF_HUB_OFFLINE=1): fixed as the default pin's build
    # fixes it, so the bytes do not depend on the environment and the tokenizer is the source pin's.
    _canonical_json(out / "tokenizer_config.json")
    return model_class_of(out)


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
