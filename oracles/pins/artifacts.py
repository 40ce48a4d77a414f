"""A user's own artifact file beside its reference's files (a ``.gguf``, ``.tflite``, ``.pte`` or ``.onnx``):
finding it, holding it against the reference, its snapshot and its rebuild by ``oracles materialize``.
The kinds and what each reads are :mod:`oracles.pins.artifact_kinds`; ``oracles pin NAME --from FILE
--reference PIN`` writes such a pin (:mod:`oracles.pins.artifact_pin`).

Every kind gets the same checks of its sizes against the reference's ``config.json`` (:func:`check_sizes`).

The pin: source ``file:<absolute path>``, ``source_sha256`` the file's sha256, ``reference`` the pin it is
held against, the reference's model class and ``trained`` flag, the precision read from the file, and
the digests of every file of its snapshot. The snapshot, ``$ORACLES_HOME/snapshots/NAME``, holds the
artifact and its side files as symbolic links to the user's files (verified by digest by every session,
never copied: a GGUF can be many GB) and copies of the reference's companion files, so the engine loads
it as it loads a built-in conversion and its tokenizer is held to the reference's recorded ids by the
canary check. ``oracles materialize NAME`` rebuilds the snapshot from the file while its sha256 is the pinned one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import ModuleType
from typing import Callable, Sequence

from oracles.errors import PinError
from oracles.pins.artifact_kinds import KINDS, ArtifactFacts, kind_of, side_files
from oracles.pins.digests import sha256_file
from oracles.pins.pin import Pin

#: Weights files that make a folder a model snapshot (pinned whole by :func:`oracles.pins.writer.write_pin`).
SNAPSHOT_WEIGHTS = ("*.safetensors", "pytorch_model*.bin")


def find_artifact(spec: str) -> Path | None:
    """The artifact file ``--from spec`` names: the file itself when its suffix is a kind's, or the one such
    file directly inside a folder that holds no model snapshot weights; None when ``spec`` is a snapshot
    folder (or anything else: :func:`oracles.pins.writer.locate` then says what it is not).

    Raises:
        PinError: a file of a suffix no kind reads, or a folder holding several artifacts (listed).
    """
    path = Path(spec.removeprefix("local:")).expanduser().resolve()
    if path.is_file():
        if kind_of(path) is None:
            raise PinError(f"--from {spec}: {path} is a file but not an artifact oracles pin reads "
                           f"({', '.join(KINDS)}); a model snapshot is a folder (config.json and weights)")
        return path
    if not path.is_dir() or any(next(path.glob(w), None) for w in SNAPSHOT_WEIGHTS):
        return None
    found = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in KINDS and not p.name.startswith("."))
    if len(found) > 1:
        raise PinError(f"--from {spec}: {path} holds {len(found)} artifacts ({', '.join(p.name for p in found)}); "
                       "name the one to pin: --from FILE")
    return found[0] if found else None


def check_sizes(facts: ArtifactFacts, reference: Pin, reference_root: Path) -> None:
    """The artifact's vocabulary, hidden width and layer count against the reference's ``config.json``
    (``vocab_size``, ``hidden_size``, ``num_hidden_layers``; of its ``text_config`` when it has one).

    Raises:
        PinError: one differs: one line naming the file and its field, the reference's config and both values.
    """
    config_path = reference_root / "config.json"
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise PinError(f"{config_path}: the reference pin {reference.name}'s config cannot be read: {exc}") from None
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    for fact, key in (("vocab_size", "vocab_size"), ("hidden_size", "hidden_size"), ("num_layers", "num_hidden_layers")):
        have, want = getattr(facts, fact), config.get(key)
        if have is not None and want is not None and int(have) != int(want):
            raise PinError(f"{facts.path}: field '{facts.fields.get(fact, fact)}' is {have} but the reference pin "
                           f"{reference.name} has {key} {want} ({config_path}): not a conversion of that model")


def read_checked(path: Path, reference: Pin, reference_root: Path) -> tuple[ModuleType, ArtifactFacts]:
    """(kind module, facts) of the artifact at ``path``, held against the reference: every refusal of
    :func:`pin_artifact` before a byte is written.

    Raises:
        PinError: as the kind's ``read_facts`` and ``check_reference``, and :func:`check_sizes`.
    """
    kind = kind_of(path)
    if kind is None:
        raise PinError(f"{path}: not an artifact oracles pin reads ({', '.join(KINDS)})")
    facts: ArtifactFacts = kind.read_facts(path)
    check_sizes(facts, reference, reference_root)
    kind.check_reference(facts, reference_root)
    return kind, facts


def build_snapshot(artifact: Path, companions: list[str], reference_root: Path, out: Path,
                   sides: Sequence[str] = ()) -> None:
    """Fill the empty folder ``out``: ``artifact`` and each of its ``sides`` (:func:`side_files`) as a symbolic
    link by its own name, and a copy of each of ``companions`` from ``reference_root`` (module docstring)."""
    os.symlink(artifact, out / artifact.name)
    for name in sides:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(artifact.parent / name, out / name)
    for name in companions:
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(reference_root / name, out / name)


def snapshot_files(kind: ModuleType, artifact: Path, reference: Pin) -> tuple[list[str], list[str]]:
    """(side files, companions) of the artifact's snapshot: the files the artifact names beside it
    (:func:`side_files`), and the kind's companion files the reference pins (a reference without a chat
    template has none to lend).

    Raises:
        PinError: as :func:`side_files`, or a side file named as a companion (the copy would overwrite it).
    """
    sides = side_files(kind, artifact)
    companions = [name for name in kind.COMPANIONS if name in reference.files]
    if clash := sorted(set(sides) & {artifact.name, *companions}):
        raise PinError(f"{artifact}: its side file {clash[0]!r} has the name of a file the snapshot takes from the "
                       f"reference pin {reference.name}; the snapshot cannot hold both (save the side file under another name)")
    return sides, companions


def artifact_source(pin: Pin, write_pin: bool) -> tuple[Path, str]:
    """(the artifact file, its sha256) of a ``file:PATH`` pin, for ``oracles materialize``: the file's sha256
    must still be the pinned ``source_sha256``, and the pin must name the reference its companion files
    come from (which the caller materialises: :func:`artifact_build`).

    Raises:
        PinError: ``write_pin`` (such a pin is written by ``oracles pin --from``), the file is missing or
            changed since it was pinned, or the pin names no reference.
    """
    if write_pin:
        raise PinError(f"{pin.path}: source {pin.source!r} is a file you pinned with `oracles pin --from`; "
                       "--write-pin rewrites built-in pins only")
    path = Path(pin.source_parts()["artifact_path"] or "")
    if not path.is_file():
        raise PinError(f"{pin.path}: field 'source': {path} does not exist; pin {pin.name!r} pins that file")
    got = sha256_file(path)
    if got != pin.source_sha256:
        raise PinError(f"{path}: sha256 mismatch: expected {pin.source_sha256}, actual {got}; the file changed since "
                       f"pin {pin.name!r} was written ({pin.path}): pin the new one under another name with "
                       "`oracles pin --from`, or restore the file")
    if pin.reference is None:
        raise PinError(f"{pin.path}: field 'reference' is missing: a file: pin takes its companion files from it")
    return path, got


def artifact_build(pin: Pin, path: Path, reference: Pin, reference_root: Path) -> Callable[[Path], str]:
    """The build function ``out -> model class`` of the ``file:PATH`` pin ``pin`` whose file is ``path``
    (:func:`artifact_source`), beside the companion files of its reference ``reference``, whose verified
    snapshot is at ``reference_root``.

    Raises:
        PinError: ``path`` is not of a kind :data:`~oracles.pins.artifact_kinds.KINDS` reads, or as
            :func:`snapshot_files`.
    """
    kind = kind_of(path)
    if kind is None:
        raise PinError(f"{pin.path}: field 'source': {path} is not an artifact oracles pin reads ({', '.join(KINDS)})")

    sides, companions = snapshot_files(kind, path, reference)

    def build(out: Path) -> str:
        build_snapshot(path, companions, reference_root, out, sides)
        return pin.model_class

    return build
