"""Writing a pin for a snapshot a user has: a local folder or a revision in the local Hugging Face cache.

``oracles pin NAME --from PATH|hf:REPO@REVISION`` (:mod:`oracles.commands.pin`) reads every file of
the snapshot once (size and sha256, with progress: a 16 GB snapshot takes minutes), the safetensors
header digest of each weights file (:func:`oracles.pins.pin.safetensors_header`) and the model class
from ``config.json``'s ``architectures``, and writes ``<pins folder>/NAME.json`` exclusively (never
over an existing pin). The source is ``local:<absolute path>`` or ``hf:REPO@<commit>`` (a branch or
tag is resolved to the commit it names now, so the pin stays what was hashed).

Files and folders whose name starts with ``.`` are not pinned: ``.git``, and the ``.cache`` folder
``hf download --local-dir`` keeps its download metadata in, change without the model changing.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol

from oracles.errors import OracleError, PinError
from oracles.pins.digests import FileDigest, safetensors_header
from oracles.pins.pin import Pin, PinStore, load_pin, store

#: A pin name is a file stem: letters, digits, ``.``, ``_``, ``-``, not starting with ``.``.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
#: Weights files transformers' ``from_pretrained`` loads (its ``SAFE_WEIGHTS_NAME`` / ``WEIGHTS_NAME``
#: families, sharded or not).
WEIGHTS = ("*.safetensors", "pytorch_model*.bin")
#: Distributions whose versions a pin records as ``built_with`` (those installed).
VERSIONED = ("pytest-oracles", "transformers", "safetensors", "tokenizers", "huggingface_hub", "torch")
CHUNK = 16 << 20  # bytes read per hash update: large enough that Python's loop costs nothing measurable


@dataclass(frozen=True)
class Snapshot:
    """A snapshot folder ready to pin: where it is, its pin source, its files (relative, sorted)."""

    root: Path
    source: str
    files: tuple[str, ...]
    model_class: str


class Progress(Protocol):
    """What hashing reports to: a file begins, ``n`` more bytes were read, the file ended, all done."""

    def start(self, name: str, size: int) -> None: ...
    def update(self, n: int) -> None: ...
    def finish_file(self) -> None: ...
    def close(self) -> None: ...


class LineProgress:
    """One stderr line per file (bytes, seconds, MB/s), and a total; used where tqdm is not installed."""

    def __init__(self, total: int, out: IO[str] | None = None) -> None:
        self.total, self.out, self.done = total, out or sys.stderr, 0
        self.name, self.size, self.began, self.t0 = "", 0, 0.0, time.perf_counter()

    def start(self, name: str, size: int) -> None:
        self.name, self.size, self.began = name, size, time.perf_counter()

    def update(self, n: int) -> None:
        self.done += n

    def finish_file(self) -> None:
        s = max(time.perf_counter() - self.began, 1e-9)
        print(f"hashed {self.name}: {self.size:,} bytes in {s:.1f} s ({self.size / s / 1e6:.0f} MB/s); "
              f"{self.done:,} of {self.total:,} bytes", file=self.out, flush=True)

    def close(self) -> None:
        s = max(time.perf_counter() - self.t0, 1e-9)
        print(f"hashed {self.done:,} bytes in {s:.1f} s ({self.done / s / 1e6:.0f} MB/s)", file=self.out, flush=True)


class TqdmProgress:
    """A tqdm bar over all bytes (stderr), the current file as its description."""

    def __init__(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="hashing", file=sys.stderr)

    def start(self, name: str, size: int) -> None:
        self.bar.set_description(f"hashing {name}")

    def update(self, n: int) -> None:
        self.bar.update(n)

    def finish_file(self) -> None:
        pass

    def close(self) -> None:
        self.bar.close()


def progress_for(total: int) -> "LineProgress | TqdmProgress":
    """tqdm's bar where tqdm is installed, else :class:`LineProgress`."""
    try:
        return TqdmProgress(total)
    except ImportError:
        return LineProgress(total)


def check_name(name: str, where: PinStore) -> None:
    """Refuse a pin name that is not a plain file stem, or that a pin already has (in any folder searched).

    Raises:
        PinError: naming the existing file.
    """
    if not NAME.fullmatch(name):
        raise PinError(f"pin name {name!r}: use letters, digits, '.', '_' and '-' (it names the file NAME.json)")
    if (existing := where.path(name)) is not None:
        raise PinError(f"pin {name!r} already exists: {existing}; pins are never overwritten (choose another "
                       "name, or delete that file yourself)")


def locate(spec: str) -> tuple[Path, str]:
    """``--from`` -> (snapshot folder, pin source): ``hf:REPO@REV`` from the local HF cache, else a path.

    Raises:
        PinError: the revision is not in the cache (folder named), or the path is not a folder.
    """
    if spec.startswith("hf:"):
        from oracles.pins import hf_cache

        repo, revision = hf_cache.parse(spec)
        commit, root = hf_cache.resolve(repo, revision)
        return root, f"hf:{repo}@{commit}"
    root = Path(spec.removeprefix("local:")).expanduser().resolve()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        raise PinError(f"--from {spec}: {root} {what}; expected a snapshot folder (config.json and weights) or "
                       "hf:REPO@REVISION")
    return root, f"local:{root}"


def scan(root: Path, source: str) -> Snapshot:
    """The files of the snapshot at ``root`` and its model class, after checking it is one.

    Raises:
        PinError: no ``config.json``, a config without an ``architectures`` list, no weights file, or a
            shard named by a weights index that is missing; each naming the folder and what is missing.
    """
    files = tuple(sorted(p.relative_to(root).as_posix() for p in root.rglob("*")
                         if p.is_file() and not any(part.startswith(".") for part in p.relative_to(root).parts)))
    listed = ", ".join(files[:8]) + (", ..." if len(files) > 8 else "") if files else "nothing"
    if "config.json" not in files:
        raise PinError(f"{root}: not a model snapshot: no config.json (found {listed})")
    model_class = _model_class(root / "config.json")
    weights = [f for f in files if any(Path(f).match(w) for w in WEIGHTS)]
    if not weights:
        raise PinError(f"{root}: not a model snapshot: no weights ({' or '.join(WEIGHTS)}; found {listed})")
    for index in (f for f in files if f.endswith(".index.json")):
        shards = _index_shards(root, index)
        if missing := sorted(shards - set(files)):
            raise PinError(f"{root / index}: names weights shard {missing[0]} that is not in the snapshot "
                           f"({len(missing)} missing)")
    return Snapshot(root=root, source=source, files=files, model_class=model_class)


def _model_class(config: Path) -> str:
    try:
        obj = json.loads(config.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PinError(f"{config}: not JSON: {exc}") from None
    archs = obj.get("architectures") if isinstance(obj, dict) else None
    if not (isinstance(archs, list) and archs and all(isinstance(a, str) for a in archs)):
        raise PinError(f"{config}: field 'architectures' is missing or not a list of class names (the model class "
                       "the pin records, e.g. [\"LlamaForCausalLM\"])")
    return archs[0]


def _index_shards(root: Path, rel: str) -> set[str]:
    """The shard files a ``*.index.json`` weights index names, relative to the snapshot."""
    index = root / rel
    try:
        obj = json.loads(index.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PinError(f"{index}: not JSON: {exc}") from None
    weight_map = obj.get("weight_map") if isinstance(obj, dict) else None
    if not isinstance(weight_map, dict):
        raise PinError(f"{index}: field 'weight_map' is missing or not an object")
    return {(Path(rel).parent / str(v)).as_posix() for v in weight_map.values()}


def hash_files(snap: Snapshot, progress: Progress | None = None) -> dict[str, FileDigest]:
    """Size and sha256 of every file of ``snap``, reporting bytes to ``progress`` as they are read."""
    sizes = {f: (snap.root / f).stat().st_size for f in snap.files}
    bar = progress or progress_for(sum(sizes.values()))
    out = {}
    try:
        for rel in snap.files:
            bar.start(rel, sizes[rel])
            h = hashlib.sha256()
            with open(snap.root / rel, "rb") as fh:
                while chunk := fh.read(CHUNK):
                    h.update(chunk)
                    bar.update(len(chunk))
            bar.finish_file()
            out[rel] = FileDigest(sizes[rel], h.hexdigest())
    finally:
        bar.close()
    return out


def pin_document(name: str, snap: Snapshot, digests: dict[str, FileDigest], trained: bool = True,
                 reference: str | None = None) -> dict[str, Any]:
    """The pin file's JSON object (:mod:`oracles.pins.pin` module docstring); ``"trained": false`` only when
    the model is declared untrained (seeded random weights: it never learnt to stop); the ``precision``
    read from the snapshot (:func:`oracles.pins.precision.read_precision`); ``reference`` when given.

    Raises:
        PinError: the snapshot's config and weights disagree on its quantization (file, tensor, field).
    """
    from oracles.pins.precision import read_precision

    weights = sorted(k for k in digests if k.endswith(".safetensors"))
    doc: dict[str, Any] = {
        "name": name, "source": snap.source, "model_class": snap.model_class,
        "files": {k: {"bytes": v.bytes, "sha256": v.sha256} for k, v in sorted(digests.items())},
        "safetensors_headers": {k: hashlib.sha256(safetensors_header(snap.root / k)[2]).hexdigest()
                                for k in sorted(digests) if k.endswith(".safetensors")},
        "built_with": _versions(),
        "precision": read_precision(snap.root, weights).to_json(),
    }
    if not trained:
        doc["trained"] = False
    if reference is not None:
        doc["reference"] = reference
    return doc


def _versions() -> dict[str, str]:
    from oracles.pins.convert import versions

    return versions(VERSIONED)


def write_pin(name: str, spec: str, pins_dir: Path | None = None, *, trained: bool = True,
              progress: Progress | None = None, reference: str | None = None) -> Pin:
    """Pin the snapshot ``spec`` (a folder, ``local:PATH`` or ``hf:REPO@REVISION``) as ``NAME.json`` in
    ``pins_dir`` (default: the active store's first folder, the project's), with the precision read from
    it and, when given, the pin a port on it is held against (``reference``: looked up when used).

    Returns the written pin, read back through :func:`oracles.pins.pin.load_pin`.

    Raises:
        PinError: a bad or taken name, a source that is not a snapshot, or the file cannot be written;
            nothing is left half-written (the file is created whole, by a hard link, or not at all).
    """
    where = store() if pins_dir is None else PinStore.with_project(pins_dir)
    check_name(name, where)
    if pins_dir is not None and (pins_dir / f"{name}.json").exists():
        raise PinError(f"pin {name!r} already exists: {pins_dir / f'{name}.json'}; pins are never overwritten")
    if reference is not None and not NAME.fullmatch(reference):
        raise PinError(f"--reference {reference!r}: not a pin name (letters, digits, '.', '_' and '-')")
    root, source = locate(spec)
    snap = scan(root, source)
    from oracles.pins.precision import quantization

    quantization(snap.root)  # a malformed quantization is refused before minutes of hashing
    doc = pin_document(name, snap, hash_files(snap, progress), trained, reference)
    return write_pin_file((pins_dir or where.dirs[0]) / f"{name}.json", doc)


def write_pin_file(target: Path, doc: dict[str, Any]) -> Pin:
    """Create the pin file ``target`` from ``doc`` whole (never over an existing file) and read it back.

    Raises:
        PinError: the file exists or cannot be written, or ``doc`` is not a valid pin (then no file is left).
    """
    from oracles.receipts.files import write_exclusive

    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        write_exclusive(target, (json.dumps(doc, indent=2) + "\n").encode())
    except OracleError as exc:
        raise PinError(f"{target}: not written: {exc}") from None
    try:
        return load_pin(target)
    except OracleError:
        target.unlink()  # a pin that does not parse is not left behind
        raise
