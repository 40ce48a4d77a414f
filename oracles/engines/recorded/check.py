"""The conformance of a store to its layout (``oracles recording-check DIR``; ``docs/recordings.md``): what
a program that writes a store (in any language) runs before a session replays it.

``store.json``'s format and layout; each context file (its digest the RFC 8785 sha256 of its identity and
its file name, its facts of the right kinds); then every entry: a frame within the limits, filed under a
context that exists, its ``sha256`` that of its header and body, its ``key`` recomputed from its context,
call and canonical arguments (:func:`oracles.engines.recorded.keys.request_key`), a call of the wire's
table, and its ``result`` of the call's kind (a handle: the lineage the key makes) or an ``error`` of a known
kind. One line per failure naming the file, on the wire-check's :class:`~oracles.engines.wire.conformance.Report`.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from oracles.engines.recorded.keys import lineage_of, request_key
from oracles.engines.recorded.store import Context, Store, read_entry
from oracles.engines.wire.calls import CALLS
from oracles.engines.wire.codec import FieldError, decode_value
from oracles.engines.wire.conformance import Report
from oracles.errors import OracleError

#: The ``error`` kinds an entry may hold: the wire's, and ``unrecordable`` (an answer the store could not hold).
ERROR_KINDS = ("unsupported", "context", "value", "error", "unrecordable")
HEX = re.compile(r"[0-9a-f]{64}")
FACTS = {"vocab_size": int, "hidden_size": int, "num_layers": int, "max_context": int, "eos_token_ids": list}


def check_store(root: Path) -> tuple[Report, list[Context], dict[str, int]]:
    """Every check of the module docstring on the store at ``root``: the report, the contexts read, and the
    entries found per context digest."""
    store = Store(root)
    report = Report()
    if report.check("store.json: format and layout", store.check) is None and report.failures:
        return report, [], {}
    contexts = report.check("contexts: identity digests, names, fields", lambda: _contexts(store)) or []
    known = {c.digest for c in contexts}
    counts: dict[str, int] = {}
    folder = store.root / "entries"
    for sub in sorted(folder.iterdir()) if folder.is_dir() else []:
        if sub.name not in known:
            report.failures.append(f"{sub}: entries of context {sub.name}, which has no contexts/{sub.name}.json")
            continue
        counts[sub.name] = 0
        for path in sorted(sub.iterdir()):
            counts[sub.name] += 1
            try:
                _entry(store, sub.name, path)
            except (OracleError, FieldError, AssertionError) as exc:
                report.failures.append(str(exc) if str(exc).startswith(str(path)) else f"{path}: {exc}")
    report.passed.append(f"entries: {sum(counts.values())} read, each checked")
    return report, contexts, counts


def _contexts(store: Store) -> list[Context]:
    out = store.contexts()
    for c in out:
        for name, kind in FACTS.items():
            if not isinstance(c.facts.get(name), kind) or isinstance(c.facts.get(name), bool):
                raise AssertionError(f"{store.root}/contexts/{c.digest}.json: field facts.{name} is "
                                     f"{c.facts.get(name)!r}; expected {kind.__name__}")
    return out


def _entry(store: Store, context: str, path: Path) -> None:
    """One entry's checks (module docstring).

    Raises:
        OracleError, FieldError, AssertionError: the first that fails, naming the file.
    """
    assert path.suffix == ".orwp" and HEX.fullmatch(path.stem), f"{path}: not named <sha256>.orwp"
    frame = read_entry(path, path.stat().st_size, store.limits, {"key": path.stem, "context": context})
    header = frame.header
    call = header.get("call")
    assert call in CALLS, f"{path}: field call {call!r} is not a call of the wire's table"
    key = request_key(context, str(call), header["args"])
    assert key == path.stem, f"{path}: field key is not the request's: its context, call and args give {key}"
    if "error" in header:
        error = header["error"]
        assert isinstance(error, dict) and error.get("kind") in ERROR_KINDS, (
            f"{path}: field error.kind {error.get('kind') if isinstance(error, dict) else error!r} is not one of "
            f"{', '.join(ERROR_KINDS)}")
        return
    kind = CALLS[str(call)].result
    if kind == "handle":
        assert header["result"] == lineage_of(key, "result"), f"{path}: field result is not the lineage this call makes"
        return
    _decoded(kind, header["result"], frame.arrays, path)


def _decoded(kind: str, value: Any, arrays: Any, path: Path) -> None:
    try:
        decode_value(kind, value, arrays, "result", lambda i, f: i)
    except FieldError as exc:
        raise AssertionError(f"{path}: {exc}") from None
