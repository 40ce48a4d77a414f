"""What a recording and a replay share: handles named by their lineage, the requests' keys, the refusals as
the wire writes them (:mod:`oracles.engines.recorded.keys` says what a key and a lineage are)."""

from __future__ import annotations

import copy
from typing import Any

from oracles.engines.recorded.keys import canonical_args, changed, lineage_of, request_key
from oracles.engines.types import ContextTooShort, Unsupported


class Tracked:
    """A cache or snapshot of a recording or recorded engine: ``live`` (the engine's own object; None in a
    replay, which holds no state), its ``lineage`` (a sha256 hex, advanced by each call that changes it) and
    its ``owner`` (the engine it belongs to). A deep copy copies ``live`` and keeps the lineage: the copy
    holds what the original holds."""

    __slots__ = ("live", "lineage", "owner")

    def __init__(self, live: Any, lineage: str, owner: object) -> None:
        self.live, self.lineage, self.owner = live, lineage, owner

    def __deepcopy__(self, memo: dict[int, Any]) -> "Tracked":
        return Tracked(copy.deepcopy(self.live, memo), self.lineage, self.owner)

    def __copy__(self) -> "Tracked":
        return Tracked(copy.copy(self.live), self.lineage, self.owner)

    def __repr__(self) -> str:
        return f"<recorded handle {self.lineage[:12]} of {getattr(self.owner, 'id', '?')}>"


def recorded_name(engine: Any) -> dict[str, str]:
    """A draft engine as a key names it: the engine its answers come from, and its pin."""
    return {"engine": str(getattr(engine, "recorded_engine", None) or engine.id), "pin": str(engine.pin)}


class Calls:
    """The keys of one engine's calls in one context (``context``: its digest) and its handles' lineages."""

    def __init__(self, owner: Any, context: str) -> None:
        self.owner, self.context = owner, context

    def lineage(self, handle: Any) -> str:
        """The lineage of a handle of this engine.

        Raises:
            TypeError: not a handle this engine made (another engine's cache, a bare object).
        """
        if not isinstance(handle, Tracked) or handle.owner is not self.owner:
            raise TypeError(f"{handle!r:.80} is not a cache or snapshot of engine {getattr(self.owner, 'id', '?')}")
        return handle.lineage

    def key(self, name: str, args: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """(canonical arguments, key) of call ``name`` with ``args`` (by the table's names).

        Raises:
            TypeError, FrameError: an argument its kind cannot hold, or a handle of another engine.
        """
        canonical = canonical_args(name, args, self.lineage, recorded_name)
        return canonical, request_key(self.context, name, canonical)

    def advance(self, name: str, key: str, args: dict[str, Any]) -> None:
        """Rename each handle call ``key`` changed in place (:func:`oracles.engines.recorded.keys.changed`)."""
        for role, handle in changed(name, args):
            if isinstance(handle, Tracked) and handle.owner is self.owner:
                handle.lineage = lineage_of(key, role)

    def made(self, key: str, live: Any) -> Tracked:
        """The handle call ``key`` returned (``live``: the engine's object, None in a replay)."""
        return Tracked(live, lineage_of(key, "result"), self.owner)


def unwrap(value: Any) -> Any:
    """The engine's own object of a handle (and of each handle of a list), anything else as it is."""
    if isinstance(value, Tracked):
        return value.live
    if isinstance(value, list) and any(isinstance(v, Tracked) for v in value):
        return [v.live if isinstance(v, Tracked) else v for v in value]
    return value


def refusal_of(exc: BaseException) -> dict[str, Any] | None:
    """What an engine raised, as the wire's ``error`` object (``docs/wire.md``, section 2) with the exception's
    ``type``; None for what is not the engine's answer (a test's time-out, Ctrl-C, pytest's outcomes)."""
    if isinstance(exc, ContextTooShort):
        return {"kind": "context", "capability": exc.capability, "why": exc.why}
    if isinstance(exc, Unsupported):
        return {"kind": "unsupported", "capability": exc.capability, "why": exc.why}
    if not isinstance(exc, Exception):
        return None
    first = (str(exc).strip().splitlines() or [""])[0]
    kind = "value" if isinstance(exc, ValueError) else "error"
    return {"kind": kind, "type": type(exc).__name__, "message": first}
