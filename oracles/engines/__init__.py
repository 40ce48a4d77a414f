"""Engine registry: the built-in adapters plus any a user plugs in through the entry-point group
``oracles.engines`` (``name = "package.module:Class"``, the class a subclass of
:class:`oracles.engines.base.Engine` whose ``id`` is ``name``). An engine is built as
``Class(root: Path, pin: oracles.pins.pin.Pin, threads: int)``.

A :class:`Registry` is a value: the test session and the ``oracles`` command each make one
(:class:`oracles.pins.project.Project`) and pass it where engines are resolved; the entry points are
read once per registry, each class imported once per registry. The module functions
(:func:`engine_class`, :func:`unavailable_reason`, ...) answer from the registry of the run in
progress (:func:`current`), or from a fresh one outside any run.

Two kinds of id are made by the run rather than listed: ``wire:NAME`` (a far side the project's ini names) and
``recorded:DIR`` (a recording as an engine, :mod:`oracles.engines.recorded`); an engine ``--record`` names
resolves to its class recording every answer (:meth:`Registry.record`).

Resolving an id imports the adapter's module, which is light: adapters import their framework when an
engine is built, so ``unavailable_reason`` (a classmethod) answers without torch or mlx.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from oracles.active import Active
from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.engines.base import Engine
    from oracles.engines.wire.config import Target

BUILTIN: dict[str, str] = {
    "torch": "oracles.engines.torch.reference:TorchReference",
    "torch-cuda": "oracles.engines.torch.cuda:TorchCuda",
    "mlx": "oracles.engines.mlx.lm:MlxPort",
    "mlx-vlm": "oracles.engines.mlx.vlm:MlxVlmPort",
    "mlx-vlm-d1": "oracles.engines.mlx.d1:MlxVlmD1",
    "mlx-vlm-dsv4": "oracles.engines.mlx.deepseek_v4:MlxDeepseekV4Port",
    "mlx-vlm-mtp": "oracles.engines.mlx.mtp:MlxVlmMtp",
    "mtplx": "oracles.engines.mlx.mtplx:MtplxPort",
    "llamacpp": "oracles.engines.llamacpp.engine:LlamaCppPort",
    "litert": "oracles.engines.litert.engine:LiteRtPort",
    "onnxruntime": "oracles.engines.onnx.engine:OnnxRuntimePort",
    "executorch": "oracles.engines.executorch.engine:ExecuTorchPort",  # issue 27
}
GROUP = "oracles.engines"
#: The id prefix of a recording as an engine: ``recorded:DIR`` (:mod:`oracles.engines.recorded.replay`).
RECORDED = "recorded:"


class Registry:
    """Engine id -> ``"module:Class"`` of one run, and the classes resolved from it (each imported once).

    ``Registry()`` reads :data:`BUILTIN` and the entry points of :data:`GROUP` (:func:`plugged`: read again
    when the import path changed; an entry point may add an id, never replace a built-in one);
    ``Registry(table)`` takes ``table`` as it is. ``ini``: the project's ini file, whose ``oracles_wire``
    lines add the far sides ``wire:NAME`` (:mod:`oracles.engines.wire.config`).

    Raises (from ``__init__``):
        OracleError: a malformed ``oracles_wire`` line (file and line named).
    """

    def __init__(self, table: dict[str, str] | None = None, ini: Path | None = None) -> None:
        if table is None:
            table = dict(BUILTIN)
            for name, value in plugged():
                table.setdefault(name, value)
        # issue 25 (wire): the project's far sides, each an engine wire:NAME of its own class
        self.wire = _wire_targets(ini)
        table.update({engine_id: f"{t.origin}: {t.address}" for engine_id, t in self.wire.items()})
        self.table = table
        self._classes: dict[str, type[Engine] | str] = {}
        #: issue 26 (recordings): engine id -> the store its answers are written to (``--record ENGINE=DIR``)
        self.recordings: dict[str, Path] = {}

    def record(self, engine_id: str, folder: Path) -> None:
        """Write every answer of ``engine_id`` to the store at ``folder`` from now on
        (:func:`oracles.engines.recorded.recorder.recording_class`)."""
        self.recordings[engine_id] = folder
        self._classes.pop(engine_id, None)

    def knows(self, engine_id: str) -> bool:
        """Whether ``engine_id`` names an engine: one of the table, or a recording ``recorded:DIR``."""
        return engine_id in self.table or engine_id.startswith(RECORDED)

    def close(self) -> int:
        """Close every far side this registry's wire engines started (the run's end); returns how many."""
        if not self.wire:
            return 0
        from oracles.engines.wire.transport import close_owned

        return close_owned(self)

    def load(self, engine_id: str) -> "type[Engine] | str":
        """The class of ``engine_id``, or a one-line reason it cannot be had (unknown, import failed,
        not an Engine, an id other than its name); a recorded engine's recording class."""
        if engine_id not in self._classes:
            cls = self._import(engine_id)
            if engine_id in self.recordings and not isinstance(cls, str):
                from oracles.engines.recorded.recorder import recording_class

                cls = recording_class(cls, self.recordings[engine_id])
            self._classes[engine_id] = cls
        return self._classes[engine_id]

    def _import(self, engine_id: str) -> "type[Engine] | str":
        from oracles.engines.base import Engine

        if engine_id.startswith(RECORDED):  # issue 26: a recording as an engine
            from oracles.engines.recorded.replay import recorded_class

            return recorded_class(engine_id)
        if engine_id not in self.table:
            return f"unknown engine {engine_id!r}; known: {', '.join(sorted(self.table))}"
        if engine_id in self.wire:  # issue 25 (wire): a far side's class, made here
            from oracles.engines.wire.client import wire_class

            return wire_class(self.wire[engine_id], owner=self)
        where = self.table[engine_id]
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

    def unavailable_reason(self, engine_id: str) -> str | None:
        """Why ``engine_id`` cannot run here (:meth:`load`'s reason, or the class's own
        ``unavailable_reason()``), else None."""
        cls = self.load(engine_id)
        return cls if isinstance(cls, str) else cls.unavailable_reason()

    def engine_class(self, engine_id: str) -> "type[Engine]":
        """The adapter class of ``engine_id``.

        Raises:
            OracleError: ``"engine 'ID': <reason>"``, the id cannot be resolved.
        """
        cls = self.load(engine_id)
        if isinstance(cls, str):
            raise OracleError(f"engine {engine_id!r}: {cls}")
        return cls

    def plugged_errors(self) -> dict[str, str]:
        """Entry-point engines that cannot be used (import error, wrong class or id), with the reason."""
        return {engine_id: reason for engine_id in self.table
                if engine_id not in BUILTIN and isinstance(reason := self.load(engine_id), str)}

    def resolve_ports(self, value: str, reference: str) -> list[str]:
        """``--port`` -> engine ids.

        ``none``: no port. ``auto``: every registered engine (built-in or plugged) other than the
        reference that can run here. Otherwise a comma-separated list, each of which must run here.

        Raises:
            OracleError: ``"--port 'ID': ..."``, a named engine that is unknown or cannot run here (why).
        """
        if value == "none":
            return []
        if value == "auto":
            return [e for e in self.table if e != reference and self.unavailable_reason(e) is None]
        out: list[str] = []
        for engine_id in (v.strip() for v in value.split(",")):
            if not engine_id or engine_id == reference or engine_id in out:
                continue
            if not self.knows(engine_id):
                raise OracleError(f"--port {engine_id!r}: unknown engine; known: {', '.join(sorted(self.table))}, "
                                  f"{RECORDED}DIR")
            if (reason := self.unavailable_reason(engine_id)) is not None:
                raise OracleError(f"--port {engine_id!r}: engine cannot run here: {reason}; drop it, or use --port "
                                  "auto to run the ports that can")
            out.append(engine_id)
        return out


#: The entry points of :data:`GROUP` last read, and the state of the import path they were read in (:func:`plugged`).
_PLUGGED: list[tuple[tuple[tuple[str, int], ...], tuple[tuple[str, str], ...]]] = []


def plugged() -> tuple[tuple[str, str], ...]:
    """(name, ``module:Class``) of each ``oracles.engines`` entry point installed, in the order
    ``importlib.metadata`` gives them. Read again only when the import path changed: a folder of ``sys.path``
    added, dropped or modified (a distribution installed into it); a reading opens every installed
    distribution's metadata (about 5 ms with 90 installed), and a process opens a registry per command and
    per session. A folder's modification time moves when an entry is added to it or taken out, within the
    file system's clock granularity (a few ms on ext4)."""
    state = tuple((folder, _mtime_ns(folder)) for folder in sys.path)
    if not _PLUGGED or _PLUGGED[0][0] != state:
        _PLUGGED[:] = [(state, tuple((ep.name, ep.value) for ep in importlib.metadata.entry_points(group=GROUP)))]
    return _PLUGGED[0][1]


def _mtime_ns(folder: str) -> int:
    """The modification time of ``folder`` (``""``: the current folder, by its absolute path), -1 where it is none."""
    try:
        return os.stat(os.path.abspath(folder or ".")).st_mtime_ns
    except OSError:
        return -1


def _wire_targets(ini: Path | None) -> "dict[str, Target]":
    """The far sides an ini file names (none without one, or without the key)."""
    if ini is None:
        return {}
    from oracles.engines.wire.config import read_ini

    return read_ini(ini)


#: The engine registries of the runs in progress (:mod:`oracles.active`): a run nested in another sees its own.
_RUNS: Active[Registry] = Active()
#: Make a Registry the current one for a run, until :data:`left`.
entered = _RUNS.enter
#: Undo :data:`entered` (a run that ends).
left = _RUNS.leave


def current() -> Registry:
    """The registry of the run in progress, else a fresh one (entry points read now, nothing kept)."""
    return _RUNS.current(Registry)


def registry() -> dict[str, str]:
    """Engine id -> ``"module:Class"`` of :func:`current`."""
    return current().table


def unavailable_reason(engine_id: str) -> str | None:
    """:meth:`Registry.unavailable_reason` of :func:`current`."""
    return current().unavailable_reason(engine_id)


def engine_class(engine_id: str) -> "type[Engine]":
    """:meth:`Registry.engine_class` of :func:`current`.

    Raises:
        OracleError: the id cannot be resolved (the reason named).
    """
    return current().engine_class(engine_id)


def plugged_errors() -> dict[str, str]:
    """:meth:`Registry.plugged_errors` of :func:`current`."""
    return current().plugged_errors()


def resolve_ports(value: str, reference: str) -> list[str]:
    """:meth:`Registry.resolve_ports` of :func:`current`.

    Raises:
        OracleError: as :meth:`Registry.resolve_ports`.
    """
    return current().resolve_ports(value, reference)
