"""The kinds of artifact file a pin may list (a ``.gguf``, ``.tflite``, ``.pte`` or ``.onnx``): the table of
them, what a kind module defines, what a file says about itself, and a pin's declared precision against its
artifact files (what every verification of such a pin runs).

:data:`KINDS` maps a file suffix to the one module that reads such a file's facts without its runtime.
Each kind module defines:

- ``ENGINE``: the id of the engine that loads the artifact (``"llamacpp"``, ``"litert"``, ...);
- ``COMPANIONS``: the files of the reference's snapshot the pin's snapshot carries beside the artifact
  (a GGUF: the tokenizer files and chat template; a ``.tflite``: those and ``config.json``,
  ``generation_config.json``);
- ``read_facts(path) -> ArtifactFacts``: what the file says about itself (architecture, vocabulary,
  hidden width, layers, precision), refusing a truncated file or one its engine cannot serve;
- ``check_reference(facts, reference_root) -> None``: what only that kind can hold against the
  reference's snapshot (a GGUF's vocabulary strings against its tokenizer.json);
- ``read_precision(path) -> Precision``: the precision alone, what every verification of a pin listing
  such a file holds its declared ``precision`` to (:func:`check_artifact_precision`);
- optionally ``side_files(path) -> list[str]``: the files the artifact itself needs beside it, relative to
  its folder (an ``.onnx``'s external-data file); none where the kind does not define it (:func:`side_files`).

Adding a kind is one entry here and one module (:mod:`oracles.pins.artifacts` pins such a file). Below
:mod:`oracles.pins.pin`: the kind modules are imported by name when a file of theirs is read, and nothing
here knows a :class:`~oracles.pins.pin.Pin`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Sequence

from oracles.errors import PinError
from oracles.pins.precision import Precision

#: File suffix -> the module reading that kind of artifact (module docstring).
KINDS = {".gguf": "oracles.pins.gguf_artifact", ".tflite": "oracles.pins.tflite_artifact",
         ".pte": "oracles.pins.pte_artifact", ".onnx": "oracles.pins.onnx_artifact"}


@dataclass(frozen=True)
class ArtifactFacts:
    """What an artifact file says about itself, read without its runtime.

    path: the file; kind: its suffix without the dot; architecture: the format's own name for it (a
    GGUF's ``general.architecture``; None where the format has none); vocab_size, hidden_size,
    num_layers: the widths of its logits and hidden state and its layer count (None where the file does
    not say); precision: its weights and compute; fields: for each of those facts, the field of the file
    it was read from (for messages); extra: what the kind module keeps for its own checks (a parsed header).
    """

    path: Path
    kind: str
    architecture: str | None
    vocab_size: int | None
    hidden_size: int | None
    num_layers: int | None
    precision: Precision
    fields: dict[str, str] = field(default_factory=dict)
    extra: Any = None

    def describe(self) -> str:
        """One phrase for the command's output: kind, architecture, sizes."""
        sizes = ", ".join(f"{k} {v}" for k, v in (("vocab", self.vocab_size), ("hidden", self.hidden_size),
                                                   ("layers", self.num_layers)) if v is not None)
        return f"{self.kind}{f' {self.architecture}' if self.architecture else ''} ({sizes})"


def kind_of(path: Path) -> ModuleType | None:
    """The kind module of ``path``'s suffix (:data:`KINDS`), None for a suffix no kind reads."""
    name = KINDS.get(path.suffix.lower())
    return importlib.import_module(name) if name else None


def side_files(kind: ModuleType, path: Path) -> list[str]:
    """The files the artifact at ``path`` needs beside it, relative to its folder: the kind's ``side_files``
    (module docstring), none where the kind does not define it.

    Raises:
        PinError: as the kind's ``side_files`` (a side file the artifact names is missing, say).
    """
    names = getattr(kind, "side_files", None)
    return list(names(path)) if names is not None else []


def check_artifact_precision(declared: Precision, root: Path, files: Sequence[str], pin_path: Path) -> None:
    """The precision ``declared`` by the pin at ``pin_path`` against what each of its ``files`` (snapshot-relative
    paths) that is an artifact (a suffix of :data:`KINDS`) holds in the snapshot at ``root``.

    Raises:
        PinError: a declared field (weights, compute, gguf_type, bits, group_size, mode) differs: one line
            naming the pin file, the field and both values.
    """
    for rel in sorted(f for f in files if Path(f).suffix in KINDS):
        kind = kind_of(root / rel)
        assert kind is not None  # its suffix is a kind's
        got = kind.read_precision(root / rel)
        for key in ("weights", "compute", "gguf_type", "bits", "group_size", "mode"):
            want, have = getattr(declared, key), getattr(got, key)
            if want != have:
                raise PinError(f"{pin_path}: field 'precision.{key}' is {want!r} but {root / rel} holds {have!r}")
