"""``oracles pin NAME --from FILE --reference PIN``: a user's own artifact file (a ``.gguf``, ``.tflite``, ``.pte``
or ``.onnx``) checked against its reference, its snapshot built and its pin written
(:mod:`oracles.pins.artifacts` says what such a pin and its snapshot hold).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.errors import PinError
from oracles.pins.artifacts import build_snapshot, read_checked, snapshot_files
from oracles.pins.convert import building, versions
from oracles.pins.digests import FileDigest, sha256_file
from oracles.pins.materialize import reference_snapshot
from oracles.pins.pin import Pin, PinStore, oracles_home, store, verify_snapshot
from oracles.pins.writer import Snapshot, check_name, hash_files, write_pin_file

#: Distributions whose versions an artifact pin records (those installed).
VERSIONED = ("pytest-oracles", "gguf", "llama-cpp-py-sync", "ai-edge-litert", "flatbuffers", "onnx")


def pin_artifact(name: str, artifact: Path, reference_name: str | None, pins_dir: Path | None = None, *,
                 trained: bool | None = None, progress: Any = None) -> Pin:
    """``oracles pin NAME --from FILE --reference PIN``: check the artifact ``artifact`` against the reference,
    build its snapshot under ``$ORACLES_HOME/snapshots/NAME`` and write the pin (module docstring) in
    ``pins_dir`` (default: the active store's first folder). ``trained`` None: the reference's.

    Returns the written pin, verified against the built snapshot.

    Raises:
        PinError: no ``--reference``, a bad or taken name, an artifact refused (truncated, an architecture
            its engine does not know, a vocabulary or sizes other than the reference's, signatures or
            inputs no family can use, a side file missing or short or named as a companion: one line
            naming file and field), or the pin cannot be written. Nothing is
            written before every check passed; the pin is created whole or not at all.
    """
    where = store() if pins_dir is None else PinStore.with_project(pins_dir)
    check_name(name, where)
    if reference_name is None:
        raise PinError(f"--from {artifact}: a {artifact.suffix} artifact needs --reference PIN, the float32 pin it is "
                       "held against (its dequantized reference, for a quantized one): its tokenizer and config "
                       "come from that pin")
    reference, reference_root = reference_snapshot(reference_name, where)
    kind, facts = read_checked(artifact, reference, reference_root)
    sides, companions = snapshot_files(kind, artifact, reference)
    digests = _hash(artifact, [artifact.name, *sides], progress)
    dest = oracles_home() / "snapshots" / name
    with building(dest) as tmp:
        build_snapshot(artifact, companions, reference_root, tmp, sides)
        files = {**digests, **{c: FileDigest((tmp / c).stat().st_size, sha256_file(tmp / c)) for c in companions}}
        doc: dict[str, Any] = {
            "name": name, "source": f"file:{artifact}", "source_sha256": digests[artifact.name].sha256,
            "model_class": reference.model_class, "reference": reference.name,
            "files": {k: {"bytes": v.bytes, "sha256": v.sha256} for k, v in sorted(files.items())},
            "precision": facts.precision.to_json(), "built_with": versions(VERSIONED)}
        chosen = reference.trained if trained is None else trained
        if not chosen:
            doc["trained"] = False
        pin = write_pin_file((pins_dir or where.dirs[0]) / f"{name}.json", doc)
    verify_snapshot(pin, dest)
    return pin


def _hash(artifact: Path, names: list[str], progress: Any) -> dict[str, FileDigest]:
    """Size and sha256 of each of ``names`` in the artifact's folder (the artifact and its side files), each
    read once with progress (:func:`oracles.pins.writer.hash_files`)."""
    snap = Snapshot(root=artifact.parent, source="", files=tuple(names), model_class="")
    return hash_files(snap, progress)
