"""Engine registry: the built-in adapters plus any a user plugs in through the entry-point group
``oracles.engines`` (``name = "package.module:Class"``, the class a subclass of
:class:`oracles.engines.base.Engine` whose ``id`` is ``name``). An engine is built as
``Class(root: Path, pin: oracles.pins.pin.Pin, threads: int)``.

Resolving an id imports the adapter's module, which is light: adapters import their framework when an
engine is built, so ``unavailable_reason`` (a classmethod) answers without torch or mlx.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from typing import TYPE_CHECKING

from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.engines.base import Engine

BUILTIN: dict[str, str] = {
    "torch": "oracles.engines.torch.reference:TorchReference",
    "torch-cuda": "oracles.engines.torch.cuda:TorchCuda",
    "mlx": "oracles.engines.mlx.lm:MlxPort",
    "mlx-vlm": "oracles.engines.mlx.vlm:MlxVlmPort",
    "mtplx": "oracles.engines.mlx.mtplx:MtplxPort",
}
GROUP = "oracles.engines"


@functools.lru_cache(maxsize=1)
def registry() -> dict[str, str]:
    """Engine id -> ``"module:Class"``: the built-ins, then entry points (which may add ids, not replace one)."""
    out = dict(BUILTIN)
    for ep in importlib.metadata.entry_points(group=GROUP):
        out.setdefault(ep.name, ep.value)
    return out


@functools.cache
def _load(engine_id: str) -> "type[Engine] | str":
    """The class of ``engine_id``, or a one-line reason it cannot be had (unknown, import failed, wrong class)."""
    from oracles.engines.base import Engine

    table = registry()
    if engine_id not in table:
        return f"unknown engine {engine_id!r}; known: {', '.join(sorted(table))}"
    where = table[engine_id]
    module, _, name = where.partition(":")
    origin = "built-in" if engine_id in BUILTIN else f"entry point {GROUP}:{engine_id}"
    try:
        cls = getattr(importlib.import_module(module), name)
    except Exception as exc:  # noqa: BLE001 - a plugged engine's import error, named in one line
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return f"{origin} {where} cannot be imported: {type(exc).__name__}: {first}"
    if not (isinstance(cls, type) and issubclass(cls, Engine)):
        return f"{origin} {where} is not a subclass of oracles.engines.base.Engine"
    if cls.id != engine_id:
        return f"{origin} {where} has id {cls.id!r}, not its entry-point name {engine_id!r}"
    return cls


def unavailable_reason(engine_id: str) -> str | None:
    """Why ``engine_id`` cannot run here (unknown, not importable, not an Engine, an id that is not its
    name, or its own ``unavailable_reason()``), else None."""
    cls = _load(engine_id)
    if isinstance(cls, str):
        return cls
    return cls.unavailable_reason()


def engine_class(engine_id: str) -> "type[Engine]":
    """The adapter class of ``engine_id``.

    Raises:
        OracleError: the id cannot be resolved (the reason named).
    """
    cls = _load(engine_id)
    if isinstance(cls, str):
        raise OracleError(f"engine {engine_id!r}: {cls}")
    return cls


def forget() -> None:
    """Drop the resolved registry and classes (a new session, which may see other entry points)."""
    registry.cache_clear()
    _load.cache_clear()


def plugged_errors() -> dict[str, str]:
    """Entry-point engines that cannot be used (import error, wrong class or id), with the reason."""
    out = {}
    for engine_id in registry():
        if engine_id not in BUILTIN and isinstance(reason := _load(engine_id), str):
            out[engine_id] = reason
    return out


def resolve_ports(value: str, reference: str) -> list[str]:
    """``--port`` -> engine ids.

    ``none``: no port. ``auto``: every registered engine (built-in or plugged) other than the reference
    that can run here. Otherwise a comma-separated list, each of which must run here.

    Raises:
        OracleError: a named engine that cannot run here (unknown, not importable, unavailable), with why.
    """
    if value == "none":
        return []
    if value == "auto":
        return [e for e in registry() if e != reference and unavailable_reason(e) is None]
    out = []
    for engine_id in (v.strip() for v in value.split(",")):
        if not engine_id or engine_id == reference or engine_id in out:
            continue
        if engine_id not in registry():
            raise OracleError(f"--port {engine_id!r}: unknown engine; known: {', '.join(sorted(registry()))}")
        if (reason := unavailable_reason(engine_id)) is not None:
            raise OracleError(f"--port {engine_id!r}: engine cannot run here: {reason}; drop it, or use --port auto "
                              "to run the ports that can")
        out.append(engine_id)
    return out
