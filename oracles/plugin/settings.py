"""The session's settings: every oracles option parsed and validated once, at activation, into one
frozen typed object (conflicts refused there, as pytest-benchmark resolves its options at session
start), and the pin/engine parametrization those settings give.

The options and their parsers are one table (:mod:`oracles.plugin.options`). Imports stay light (no
torch, transformers or mlx): engine classes are imported, but they import their frameworks only when
an engine is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import pytest

from oracles.families import DEFAULT_PIN, Family
from oracles.families.port_scope import PortScope
from oracles.plugin.options import OPTIONS, Resolving

if TYPE_CHECKING:
    from oracles.engines import Registry
    from oracles.pins.pairing import PortPair
    from oracles.pins.pin import PinStore
    from oracles.pins.project import Project


@dataclass(frozen=True)
class Pairing:
    """An (engine, pin) pair left out of the parametrization, and why (reported, never silent);
    ``engine`` None: a family that cannot take the pin on any engine (a text family on a vision pin)."""

    engine: str | None
    pin: str
    reason: str


@dataclass
class _Pairings:
    """What the parametrization found out: compatibility per (engine, pin), the pairs left out."""

    compat: dict[tuple[str, str], str | None] = field(default_factory=dict)
    left_out: dict[tuple[str | None, str], Pairing] = field(default_factory=dict)


@dataclass(frozen=True)
class Settings:
    """What a session runs on, its fields parsed from the options of :data:`oracles.plugin.options.OPTIONS`.

    ``pins``: the ``--pin`` names (empty: each family's defaults); ``snapshots``: ``--snapshot`` as
    {pin: folder}; ``port``: ``--port`` as given, ``ports``: the engine ids it resolved to; ``record``:
    ``--record`` as {engine id: store folder};
    ``receipts_dir``: relative to the invocation folder; ``deadline``: seconds or None; ``enabled``:
    pytest-oracles is on (the ini's ``oracles = true`` or a receipt option). ``project``: the stores the
    session reads (None: those of the run in progress, :func:`oracles.pins.pin.store`).
    """

    enabled: bool = False
    runslow: bool = False
    pins: tuple[str, ...] = ()
    receipts_dir: Path = Path("receipts")
    receipt_tag: str = "default"
    no_receipt: bool = False
    snapshots: Mapping[str, Path] = field(default_factory=dict)
    reference: str = "torch"
    reference_device: str = "cpu"
    reference_max_memory: int | None = None
    reference_device_map: str | None = None
    port: str = "auto"
    ports: tuple[str, ...] = ()
    oracle_threads: int = 0
    deadline: float | None = None
    port_scope: PortScope = PortScope("sample")
    port_pins: tuple["PortPair", ...] = ()
    port_pins_given: bool = False
    resume: Path | None = None
    record: Mapping[str, Path] = field(default_factory=dict)
    project: "Project | None" = field(default=None, compare=False, repr=False)
    _found: _Pairings = field(default_factory=_Pairings, compare=False, repr=False)

    @classmethod
    def resolve(cls, opt: Any, enabled: bool, project: "Project") -> "Settings":
        """Parse every option of ``opt`` (pytest's ``config.option``) once, in table order, then refuse
        the combinations that cannot both hold.

        Raises:
            pytest.UsageError: one line naming the option and the value (an unknown engine or pin with
                the known ones listed, a named port that cannot run here and why, a plugged engine that
                fails to import, a bad number, tag or scope), or the two options that conflict.
        """
        fields: dict[str, Any] = {}
        for option in OPTIONS:
            fields.update(option.resolve(getattr(opt, option.dest), Resolving(fields, project)))
        if fields["resume"] is not None and fields["no_receipt"]:
            raise pytest.UsageError(f"--resume={fields['resume']} with --no-receipt: the passes --resume carries over "
                                    "are recorded only in this run's receipt; drop one of the two")
        return cls(enabled=enabled, project=project, **fields)

    # -- the stores ---------------------------------------------------------------------------
    @property
    def pin_store(self) -> "PinStore":
        """The pins the session reads: its project's, then the built-in ones."""
        from oracles.pins.pin import store

        return self.project.pins if self.project is not None else store()

    @property
    def registry(self) -> "Registry":
        """The engine registry the session reads."""
        from oracles.engines import current

        return self.project.engines if self.project is not None else current()

    # -- engines and pins ---------------------------------------------------------------------
    def engine_kwargs(self, engine_id: str) -> dict[str, Any]:
        """Extra constructor arguments of ``engine_id``: the reference's ``device`` when not the CPU, and
        its placement (``max_memory``, ``device_map``) when one is given."""
        if engine_id != self.reference:
            return {}
        placed = {"max_memory": self.reference_max_memory, "device_map": self.reference_device_map}
        return {**({"device": self.reference_device} if self.reference_device != "cpu" else {}),
                **{k: v for k, v in placed.items() if v is not None}}

    @property
    def engines(self) -> list[str]:
        """The reference's engine id, then each port's."""
        return [self.reference, *self.ports]

    @property
    def left_out(self) -> dict[tuple[str | None, str], Pairing]:
        """The (engine, pin) pairs the parametrization left out so far, with why."""
        return self._found.left_out

    def pins_for(self, family: Family | None) -> list[str]:
        """The pins a family's tests run on: ``--pin`` (those the family serves), else its defaults.

        Raises:
            PinError: a default pin of the family is not in the pin store.
        """
        names = self.pins or tuple(family.default_pins if family else (DEFAULT_PIN,))
        out = []
        for name in names:
            pin = self.pin_store.load(name)
            reason = family.serves(pin) if family else None
            if reason is None:
                out.append(name)
            else:
                self.left_out[(None, name)] = Pairing(None, name, reason)
        return out

    def compatible(self, engine_id: str, pin: str) -> bool:
        """Whether ``engine_id`` can load ``pin`` (its ``unsupported_pin``); a pair that cannot is
        recorded in :attr:`left_out` with the engine's reason."""
        key = (engine_id, pin)
        compat = self._found.compat
        if key not in compat:
            reason = None
            if self.registry.unavailable_reason(engine_id) is None:
                reason = self.registry.engine_class(engine_id).unsupported_pin(self.pin_store.load(pin))
            compat[key] = reason
            if reason:
                self.left_out[key] = Pairing(engine_id, pin, reason)
        return compat[key] is None

    def in_family(self, engine_id: str, family: Family | None) -> bool:
        """Whether ``engine_id`` runs in ``family``: an engine class whose ``families`` names some (a far side
        the project runs in those only: issue 25's ``oracles_wire NAME.families``) runs in those, every other
        in all; an engine left out of a family is recorded in :attr:`left_out`."""
        if family is None or self.registry.unavailable_reason(engine_id) is not None:
            return True
        named = getattr(self.registry.engine_class(engine_id), "families", None)
        if not named or family.name in named:
            return True
        self.left_out[(engine_id, f"family {family.name}")] = Pairing(engine_id, f"(all) of family {family.name}", (
            f"the project runs it in {', '.join(named)} only"))
        return False

    def pairs(self, family: Family | None, engines: Sequence[str], artifacts: bool = True) -> list[tuple[str, str]]:
        """(pin, engine) pairs of a family's tests over ``engines``, compatible ones only: each engine on
        each pin the family runs on, then (``artifacts``) each port on each artifact of
        :meth:`engine_artifacts` it can load (the port's own checks on what the user ships: its cache, its
        generation, its read-out)."""
        engines = [e for e in engines if self.in_family(e, family)]
        out = [(p, e) for p in self.pins_for(family) for e in engines if self.compatible(e, p)]
        if not artifacts:
            return out
        ports = [e for e in engines if e in self.ports]
        return out + [(a, e) for a in self.engine_artifacts(family) for e in ports if self.compatible(e, a)]

    def engine_artifacts(self, family: Family | None) -> list[str]:
        """The ``--port-pin`` artifacts a family's engine tests also run on: every one ``--port-pin`` names,
        or by default those of :data:`~oracles.families.ENGINE_CONVERSIONS`, in the families with
        :attr:`~oracles.families.Family.default_conversions`; each only where the family serves its
        reference (the artifact's records are its reference's: their tokenizers are equal) and its
        precision (:meth:`~oracles.families.Family.serves_precision`; one it does not is left out, with why)."""
        from oracles.families import ENGINE_CONVERSIONS

        if family is None or not (family.default_conversions or self.port_pins_given):
            return []
        out: list[str] = []
        for pair in self.port_pins:
            if pair.artifact in out or not (self.port_pins_given or pair.artifact in ENGINE_CONVERSIONS):
                continue
            if family.serves(self.pin_store.load(pair.reference)) is not None:
                continue
            if (why := family.serves_precision(self.pin_store.load(pair.artifact))) is not None:
                self.left_out[(None, f"{pair.artifact} in {family.name}")] = Pairing(None, pair.artifact, why)
                continue
            out.append(pair.artifact)
        return out

    def port_triples(self, family: Family | None) -> list[tuple[str, str, str]]:
        """(reference pin, port, port pin) of a family's port tests: each port on each pin the family
        runs on (port pin = pin), then each ``--port-pin`` pair the family serves, on each port that can
        load the artifact (a pair no port can load is left out, with the engine's reason). The default
        pairs (the built-in conversions, no ``--port-pin`` given) run only in the families whose
        :attr:`~oracles.families.Family.default_conversions` is set; the others' leave-out is reported."""
        ports = [e for e in self.ports if self.in_family(e, family)]
        out = [(p, e, p) for p, e in self.pairs(family, ports, artifacts=False)]
        if family is not None and not family.default_conversions and not self.port_pins_given:
            for pair in self.port_pins:
                self.left_out[(None, pair.label)] = Pairing(None, pair.label, (
                    f"the built-in conversions run the port, graded and faults families; family {family.name}'s port "
                    "tests run on them with --port-pin given"))
            return out
        for pair in self.port_pins:
            reference = self.pin_store.load(pair.reference)
            if family is not None and (why := family.serves(reference)) is not None:
                self.left_out[(None, pair.label)] = Pairing(None, pair.label, why)
                continue
            out += [(pair.reference, e, pair.artifact) for e in ports if self.compatible(e, pair.artifact)]
        return out

    # -- what the terminal and the receipt say --------------------------------------------------
    def header_line(self) -> str:
        """What the report header says about engines and pins."""
        on = f" on {self.reference_device}" if self.reference_device != "cpu" else ""
        if self.reference_max_memory is not None:
            on += f", {self.reference_max_memory:,} bytes in memory and the rest on disk"
        elif self.reference_device_map is not None:
            on += f", device_map {self.reference_device_map}"
        artifacts = f"; port pins {', '.join(p.label for p in self.port_pins)}" if self.port_pins else ""
        recording = "".join(f"; recording {e} to {d}" for e, d in self.record.items())
        return (f"oracles: reference {self.reference}{on}; ports {', '.join(self.ports) or 'none'}; pins "
                f"{', '.join(self.pins) or 'each family default'}{artifacts}{recording} (from {self.pin_store.describe()})")

    def left_out_lines(self) -> list[str]:
        """After collection: plugged engines that cannot be used and (engine, pin) pairs left out, with reasons."""
        lines = [f"oracles: plugged engine {e} not used: {reason}" for e, reason in self.registry.plugged_errors().items()]
        for p in self.left_out.values():
            who = "a family" if p.engine is None else f"engine {p.engine}"
            lines.append(f"oracles: {who} left out pin {p.pin}: {p.reason}")
        return lines

    def left_out_json(self) -> list[dict[str, str | None]]:
        """The pairs left out, for the receipt."""
        return [{"engine": p.engine, "pin": p.pin, "reason": p.reason} for p in self.left_out.values()]
