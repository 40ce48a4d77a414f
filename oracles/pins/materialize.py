"""Build a pinned snapshot under ``$ORACLES_HOME`` and verify it against its pin.

Each source kind has its builder (:func:`_builder`): a ``pypi:`` ``.gguf`` dequantised by transformers to a
float32 safetensors snapshot (:func:`oracles.pins.dequantize.build_gguf_snapshot`) or copied as shipped
(:mod:`oracles.pins.gguf_pins`), a twin, a user's artifact file (:mod:`oracles.pins.artifacts`), and the
conversion sources (:mod:`oracles.pins.convert`, ``gguf_convert``, ``onnx_export``, ``litert``,
``executorch``, ``dequantize``). The pins and snapshots a build is made from are materialised here first
and handed to its builder, so no builder imports this module. The build happens in a temporary folder
renamed into place once it verifies.

torch and transformers are imported inside the builders, never at module import.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from oracles.errors import PinError
from oracles.pins.convert import (
    CONVERT_ARGUMENTS,
    TOOL_DISTRIBUTIONS,
    building,
    built_fields,
    convert_with_mlx_lm,
    folder_digest,
    versions,
)
from oracles.pins.digests import file_digests, sha256_file
from oracles.pins.pin import Pin, PinStore, load_pin, snapshot_dir, store, verify_snapshot
from oracles.pins.pypi import locate_pypi_file


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
    build, got, extra = _builder(pin, write_pin)
    with building(dest) as tmp:
        model_class = build(tmp)
        if write_pin:
            _write_pin(pin, tmp, got, model_class, extra)
            pin = load_pin(pin.path)
        result = verify_snapshot(pin, tmp)
    return {**result, "root": str(dest), "built": True}


#: What a source kind's builder gives: the build function ``out -> model class`` (``out`` an empty folder), the
#: source's digest (None where the pin records none: a twin), the precision fields the artifact cannot say.
Builder = tuple[Callable[[Path], str], str | None, dict[str, str]]


def _builder(pin: Pin, write_pin: bool) -> Builder:
    """The builder of ``pin``'s source kind, each pin or snapshot it is made from materialised first
    (:func:`source_of`, :func:`reference_snapshot`) and handed to it.

    Raises:
        PinError: an unsupported source, or as the kind's builder (a digest or version other than the pin's).
    """
    parts = pin.source_parts()
    if parts["artifact"]:  # a user's artifact file beside its reference's companion files
        from oracles.pins.artifacts import artifact_build, artifact_source

        path, got = artifact_source(pin, write_pin)
        reference, reference_root = reference_snapshot(str(pin.reference), store())
        return artifact_build(pin, path, reference, reference_root), got, {}
    if parts["derived"] == "gguf-convert":  # llama.cpp's own converter on the source pin's snapshot
        from oracles.pins.gguf_convert import convert_builder

        return convert_builder(pin, source_of(pin), write_pin)
    from oracles.pins.gguf_pins import gguf_copy, gguf_source

    if (shipped := gguf_source(pin, write_pin)) is not None:  # a .gguf artifact (llama.cpp's) as shipped, copied
        return gguf_copy(pin, shipped[0], _gguf_reference(pin)), shipped[1], {}
    if parts["kind"] == "twin":
        return _twin_builder(pin, parts), None, {}
    if parts["derived"] == "onnx-export":  # an .onnx by torch's exporter or ORT's quantizer
        from oracles.pins.onnx_export import onnx_builder

        return onnx_builder(pin, source_of(pin), write_pin)
    if parts["derived"]:
        return _derived_builder(pin, source_of(pin), write_pin)
    if parts["kind"] != "pypi" or not (parts["file"] or "").endswith(".gguf"):
        raise PinError(f"{pin.path}: source {pin.source!r}: only pypi:PKG==VER#FILE.gguf, twin:NAME#SEED, "
                       "mlx-convert:PIN and dequantize:... sources can be built")
    from oracles.pins.dequantize import build_gguf_snapshot

    gguf = locate_pypi_file(parts["what"] or "", parts["version"], parts["file"] or "")
    got = sha256_file(gguf)
    if pin.source_sha256 and got != pin.source_sha256 and not write_pin:
        raise PinError(f"{gguf}: source sha256 mismatch: expected {pin.source_sha256}, actual {got}")
    extra = {"gguf_type": _check_gguf_type(pin, gguf, write_pin)}
    return (lambda out: build_gguf_snapshot(gguf, out)), got, extra


def source_of(pin: Pin) -> tuple[Path, str, str]:
    """(source snapshot folder or file, its digest, what it is called) of a conversion pin; a source pin is
    materialised (built or verified) first.

    Raises:
        PinError: the source pin is unknown or does not build/verify; a source path does not exist.
    """
    parts = pin.source_parts()
    if parts["from_pin"]:
        src = load_pin(parts["from_pin"])
        materialize(src)
        return snapshot_dir(src), src.digest, src.name
    path = Path(parts["from_path"] or "")
    if not path.exists():
        raise PinError(f"{pin.path}: field 'source' {pin.source!r}: {path} does not exist")
    return path, sha256_file(path) if path.is_file() else folder_digest(path), f"local:{path}"


def reference_snapshot(name: str, where: PinStore) -> tuple[Pin, Path]:
    """The reference pin ``name`` in ``where`` and its verified snapshot (built first when it is a built one).

    Raises:
        PinError: an unknown pin (``--reference NAME: ...``), or its snapshot does not build or verify.
    """
    try:
        pin = where.load(name)
    except PinError as exc:
        raise PinError(f"--reference {name}: {exc}") from None
    materialize(pin)
    return pin, snapshot_dir(pin)


def _gguf_reference(pin: Pin) -> Path:
    """The verified snapshot of a GGUF pin's reference (materialised first), whose tokenizer files its
    snapshot copies.

    Raises:
        PinError: the pin names no reference, or it does not build / verify.
    """
    name = pin.reference or pin.converted_from
    if name is None:
        raise PinError(f"{pin.path}: field 'reference' is missing: a GGUF pin copies its reference's tokenizer files")
    ref = load_pin(name)
    materialize(ref)
    return snapshot_dir(ref)


def _derived_builder(pin: Pin, source: tuple[Path, str, str], write_pin: bool) -> Builder:
    """(build function ``out -> model class``, source digest, the precision fields the artifact cannot say:
    ``dequantized_from`` of a folder's dequantisation) of an ``mlx-convert:``, ``dequantize:``, ``litert-convert:``
    or ``executorch-convert:`` pin whose ``source`` (:func:`source_of`) is materialised, after checking the
    source digest and the tool's version against the pin (unless ``write_pin``: a maintainer re-making the pin).

    Raises:
        PinError: the source's digest or the installed tool's version differs from the pin's, or a
            recipe argument ``mlx_lm.convert`` does not take; one line naming the pin file and field.
    """
    root, digest, called = source
    recipe = pin.recipe or {}
    if not write_pin and pin.source_sha256 != digest:
        raise PinError(f"{pin.path}: field 'source_sha256' is {pin.source_sha256} but the source {pin.source!r} has "
                       f"digest {digest}")
    if pin.source_parts()["derived"] == "litert-convert":  # its converter is in its own env (pins/litert.py)
        from oracles.pins.litert import litert_builder

        return litert_builder(pin, root, write_pin), digest, {}
    if pin.source_parts()["derived"] == "executorch-convert":  # its exporter is in its own env (pins/executorch.py)
        from oracles.pins.executorch import executorch_builder

        return executorch_builder(pin, root, write_pin), digest, {}
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


#: twin:NAME -> (builder module with ``build(seed, out, tokenizer_root) -> class name``, the pin
#: whose verified snapshot lends its tokenizer files, or None for a twin that trains its own).
TWINS: dict[str, tuple[str, str | None]] = {
    "llama-draft": ("oracles.twins.draft", "smollm2-135m-instruct"),
    "qwen35-hybrid": ("oracles.twins.hybrid", "smollm2-135m-instruct"),
    "qwen35-vl": ("oracles.twins.qwen35_vl", None),
    "lfm2-vl-d1": ("oracles.twins.lfm2_vl", "smollm2-135m-instruct"),
    "inkling-mtp": ("oracles.twins.mtp", "smollm2-135m-instruct"),
    "deepseek-v4": ("oracles.twins.deepseek_v4", "smollm2-135m-instruct"),
    "qwen25-0.5b-shapes": ("oracles.twins.qwen25_shapes", "smollm2-135m-instruct"),
}


def _twin_builder(pin: Pin, parts: dict[str, str | None]) -> Any:
    """The build function of a ``twin:NAME#SEED`` source; verifies the tokenizer-lending snapshot first.

    Raises:
        PinError: unknown twin name (known ones listed), a SEED that is not an int, or the lending
            snapshot missing or not matching its pin.
    """
    import importlib

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
    elif parts["derived"] == "onnx-export":
        from oracles.pins import onnx_export

        obj["recipe"] = onnx_export.recipe_fields(obj["recipe"], root)
    elif parts["derived"] == "executorch-convert":
        from oracles.pins.executorch import written_fields

        obj = written_fields(obj, root)
    elif parts["derived"]:
        dist = TOOL_DISTRIBUTIONS[str(tool)]
        obj["recipe"] = {**obj["recipe"], "version": versions((dist,))[dist]}
    if parts["kind"] == "twin" and "precision" in obj and obj["precision"] == {"weights": "float32", "compute": "float32"}:
        del obj["precision"]  # the default: a twin's pin file stays as it was
    pin.path.write_text(json.dumps(obj, indent=2) + "\n")
