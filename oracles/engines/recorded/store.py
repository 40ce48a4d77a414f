"""A recording on disk (``docs/recordings.md``, "Layout"), layout version :data:`LAYOUT`::

    DIR/store.json                      {"format": "oracles-recording", "layout": 1}
    DIR/contexts/<C>.json               one recorded engine on one pin: identity (C = its digest), facts,
                                        describe(), provenance
    DIR/entries/<C>/<KEY>.orwp          one call's answer: a wire frame (oracles.engines.wire.frame)

Every file is created whole or not at all (written to a temporary name, then hard-linked to its own name,
which is never overwritten), so two processes (xdist workers) may fill one store: an entry is named by its
request, and a second answer to a request is held to the first (:func:`same_answer`). Read back, a store is
untrusted input: every size is checked against the wire's limits before it is read, every entry's digest,
key, context and call against its name, and each refusal is one line naming the file.
"""

from __future__ import annotations

import hashlib
import json
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.engines.recorded.keys import jcs, sha256_hex
from oracles.engines.wire.frame import PREFIX, Frame, FrameError, Limits, dtype_name, encode, parse, read_prefix, wire_array
from oracles.errors import OracleError

FORMAT = "oracles-recording"
#: The layout this package writes and reads (``store.json``'s ``layout``, every entry's and context's).
LAYOUT = 1
#: A context file's largest size (its describe() and chat template are kilobytes).
CONTEXT_BYTES = 16 << 20
#: Result fields a second answer to one request may change: wall seconds (``generation``'s).
VOLATILE = ("prefill_seconds", "decode_seconds")


class StoreError(OracleError):
    """A store that cannot be read or written: one line naming the file and what is wrong."""


class Conflict(OracleError):
    """An engine answered one request two ways (a second answer unlike the recorded one): naming call and file."""


@dataclass(frozen=True)
class Context:
    """One recorded engine on one pin: ``digest`` (C), ``identity`` (what C is the digest of: engine, pin
    name and digest, threads, constructor options, versions, machine, device), ``facts`` (the engine's
    members: sizes, stop ids, chat template), ``describe`` (its ``describe()``), ``provenance`` (when, where)."""

    digest: str
    identity: dict[str, Any]
    facts: dict[str, Any]
    describe: dict[str, Any]
    provenance: dict[str, Any]

    @property
    def engine(self) -> str:
        return str(self.identity["engine"])

    @property
    def pin(self) -> tuple[str, str]:
        """(name, digest) of the pin it was recorded on."""
        pin = self.identity["pin"]
        return str(pin["name"]), str(pin["digest"])

    def to_json(self) -> dict[str, Any]:
        return {"layout": LAYOUT, "context": self.digest, "identity": self.identity, "facts": self.facts,
                "describe": self.describe, "provenance": self.provenance}


def context_digest(identity: dict[str, Any]) -> str:
    """C of an identity: sha256 of its RFC 8785 form."""
    return sha256_hex(jcs(identity))


def write_once(path: Path, chunks: Sequence[bytes | memoryview]) -> bool:
    """Create ``path`` holding ``chunks``: a temporary file beside it, hard-linked to ``path``, unlinked; True
    when this call made it, False when it existed (left as it is). Not fsynced: a file cut short by a crash
    fails its digest when read.

    Raises:
        StoreError: the folder cannot be written (the path named).
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "xb") as fh:
            for chunk in chunks:
                fh.write(chunk)
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    except OSError as exc:
        raise StoreError(f"{path}: cannot be written: {exc.strerror or exc}") from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def entry_digest(header: dict[str, Any], arrays: Sequence[np.ndarray]) -> str:
    """An entry's ``sha256``: of the RFC 8785 form of its header without ``sha256`` (``arrays`` described as
    the frame describes them), then the body's bytes."""
    described = [{"dtype": dtype_name(a), "shape": list(a.shape), "nbytes": int(a.nbytes)} for a in arrays]
    h = hashlib.sha256(jcs({**{k: v for k, v in header.items() if k != "sha256"}, "arrays": described}))
    for a in arrays:
        h.update(a.data.cast("B") if a.nbytes else b"")
    return h.hexdigest()


class Store:
    """The recording at ``root`` (module docstring); ``limits`` bound what is read back."""

    def __init__(self, root: Path, limits: Limits | None = None) -> None:
        self.root, self.limits = Path(root), limits or Limits()

    # -- the store -----------------------------------------------------------------------------------
    @property
    def marker(self) -> Path:
        return self.root / "store.json"

    def check(self, must_exist: bool = True) -> None:
        """Refuse a folder that is not a store of this layout (a missing one too, with ``must_exist``).

        Raises:
            StoreError: one line naming the file.
        """
        if not self.marker.exists():
            if must_exist or (self.root.exists() and not self.root.is_dir()):
                what = "is not a folder" if self.root.exists() and not self.root.is_dir() else "holds no store.json"
                raise StoreError(f"{self.root}: {what}; not a recording (made by a session with --record ENGINE=DIR)")
            return
        doc = self._json(self.marker, 4096)
        if doc.get("format") != FORMAT or doc.get("layout") != LAYOUT:
            raise StoreError(f"{self.marker}: format {doc.get('format')!r} layout {doc.get('layout')!r}; this suite reads "
                             f"{FORMAT!r} layout {LAYOUT}")

    def create(self) -> None:
        """Make the store's folder and ``store.json`` (once; a store already there is checked).

        Raises:
            StoreError: the folder holds something else, or cannot be written.
        """
        self.check(must_exist=False)
        write_once(self.marker, [json.dumps({"format": FORMAT, "layout": LAYOUT}).encode()])

    def _json(self, path: Path, limit: int) -> dict[str, Any]:
        try:
            size = path.stat().st_size
            if size > limit:
                raise StoreError(f"{path}: {size} bytes passes the limit of {limit}")
            doc = json.loads(path.read_bytes().decode("utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise StoreError(f"{path}: cannot be read as JSON: {exc}") from None
        if not isinstance(doc, dict):
            raise StoreError(f"{path}: a JSON {type(doc).__name__}, not an object")
        return doc

    # -- contexts --------------------------------------------------------------------------------------
    def contexts(self) -> list[Context]:
        """Every context of the store, each checked (its digest against its identity and its name).

        Raises:
            StoreError: a context file that is malformed (file and field named).
        """
        folder = self.root / "contexts"
        paths = sorted(folder.glob("*.json")) if folder.is_dir() else []
        return [self._context(p) for p in paths]

    def _context(self, path: Path) -> Context:
        doc = self._json(path, CONTEXT_BYTES)
        for name in ("identity", "facts", "describe", "provenance"):
            if not isinstance(doc.get(name), dict):
                raise StoreError(f"{path}: field {name} is missing or not an object")
        identity = doc["identity"]
        pin = identity.get("pin")
        if not (isinstance(identity.get("engine"), str) and isinstance(pin, dict) and isinstance(pin.get("name"), str)
                and isinstance(pin.get("digest"), str)):
            raise StoreError(f"{path}: field identity needs engine and pin {{name, digest}} strings")
        digest = context_digest(identity)
        if doc.get("context") != digest or path.stem != digest or doc.get("layout") != LAYOUT:
            raise StoreError(f"{path}: field context {doc.get('context')!r} (layout {doc.get('layout')!r}) is not the "
                             f"digest of its identity ({digest}) and its file name")
        return Context(digest, identity, doc["facts"], doc["describe"], doc["provenance"])

    def add_context(self, context: Context) -> None:
        """Write ``context`` (once: a context of that digest is the same identity).

        Raises:
            StoreError: the store cannot be written.
        """
        self.create()
        path = self.root / "contexts" / f"{context.digest}.json"
        write_once(path, [json.dumps(context.to_json(), indent=1, sort_keys=True).encode()])

    # -- entries ---------------------------------------------------------------------------------------
    def entry_path(self, context: str, key: str) -> Path:
        return self.root / "entries" / context / f"{key}.orwp"

    def count(self, context: str) -> int:
        folder = self.root / "entries" / context
        return sum(1 for _ in folder.glob("*.orwp")) if folder.is_dir() else 0

    def put(self, context: str, key: str, header: dict[str, Any], arrays: Sequence[np.ndarray]) -> Frame | None:
        """Write one entry (``header`` without ``sha256``, ``arrays`` its body); None when written, else the
        entry already there (read back and checked), for the caller to hold the answer to.

        Raises:
            StoreError: the store cannot be written, or the entry there cannot be read.
        """
        arrays = [wire_array(a) for a in arrays]
        header = {**header, "sha256": entry_digest(header, arrays)}
        path = self.entry_path(context, key)
        if write_once(path, encode(header, arrays)):
            return None
        return self.get(context, key, str(header.get("call")))

    def get(self, context: str, key: str, call: str) -> Frame | None:
        """The entry of ``key`` (None when not recorded), checked: its size within the limits, a frame, its
        digest, and its key, context and call those it is filed under.

        Raises:
            StoreError: one line naming the file and what is wrong.
        """
        path = self.entry_path(context, key)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreError(f"{path}: cannot be read: {exc.strerror or exc}") from None
        return read_entry(path, size, self.limits, {"key": key, "context": context, "call": call})


def read_entry(path: Path, size: int, limits: Limits, expect: dict[str, str]) -> Frame:
    """The entry at ``path`` (``size`` bytes), checked as :meth:`Store.get` says.

    Raises:
        StoreError: one line naming the file and the field.
    """
    if size < PREFIX.size or size > PREFIX.size + limits.header + limits.body:
        raise StoreError(f"{path}: {size} bytes is not a frame within the limits (16-byte prefix, header <= "
                         f"{limits.header}, body <= {limits.body})")
    try:
        data = path.read_bytes()
        hlen, blen = read_prefix(data[:PREFIX.size], limits)
        if PREFIX.size + hlen + blen != len(data):
            raise FrameError(f"the prefix says {PREFIX.size + hlen + blen} bytes; the file holds {len(data)}")
        frame = parse(data[PREFIX.size:PREFIX.size + hlen], bytearray(data[PREFIX.size + hlen:]), limits)
    except (OSError, FrameError) as exc:
        raise StoreError(f"{path}: not an entry: {exc}") from None
    header = frame.header
    if header.get("layout") != LAYOUT:
        raise StoreError(f"{path}: field layout {header.get('layout')!r}; this suite reads layout {LAYOUT}")
    for name, want in expect.items():
        if header.get(name) != want:
            raise StoreError(f"{path}: field {name} is {header.get(name)!r}; it is filed as {want!r}")
    if ("result" in header) == ("error" in header):
        raise StoreError(f"{path}: holds {'both' if 'result' in header else 'neither'} of result and error")
    if not isinstance(header.get("args"), dict):
        raise StoreError(f"{path}: field args is missing or not an object")
    if header.get("sha256") != entry_digest(header, frame.arrays):
        raise StoreError(f"{path}: field sha256 {str(header.get('sha256'))[:16]}... is not the digest of its header "
                         "and body: the entry was changed after it was written")
    return frame


def same_answer(a: Frame, b: Frame) -> str | None:
    """None when two entries of one request hold the same answer (the same error kind and capability, or
    results equal but for :data:`VOLATILE` fields, arrays equal bit for bit), else what differs."""
    ea, eb = a.header.get("error"), b.header.get("error")
    if ea is not None or eb is not None:
        pick = lambda e: None if not isinstance(e, dict) else (e.get("kind"), e.get("capability"), e.get("type"))  # noqa: E731
        return None if pick(ea) == pick(eb) and ea is not None and eb is not None else (
            f"one answer is {_said(ea)}, the other {_said(eb)}")
    if _steady(a.header["result"]) != _steady(b.header["result"]):
        return "the results' JSON differ"
    if len(a.arrays) != len(b.arrays):
        return f"{len(a.arrays)} arrays vs {len(b.arrays)}"
    for i, (x, y) in enumerate(zip(a.arrays, b.arrays)):
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return f"array {i} ({dtype_name(x)} {list(x.shape)}) differs"
    return None


def _said(error: Any) -> str:
    return f"the error {error.get('kind')!r}" if isinstance(error, dict) else "a result"


def _steady(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _steady(v) for k, v in value.items() if k not in VOLATILE}
    if isinstance(value, list):
        return [_steady(v) for v in value]
    return value
