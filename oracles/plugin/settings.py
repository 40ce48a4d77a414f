"""The session's settings: every oracles option resolved once at configure, conflicts refused there
(as pytest-benchmark resolves its options at session start), and the pin/engine parametrization.

Imports stay light (no torch, transformers or mlx): engine classes are imported, but they import their
frameworks only when an engine is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from oracles.engines import engine_class, forget, plugged_errors, resolve_ports, unavailable_reason
from oracles.errors import OracleError
from oracles.families import DEFAULT_PIN, Family
from oracles.pins.pin import load_pin, store
from oracles.plugin.port_scope import PortScope


@dataclass(frozen=True)
class Pairing:
    """An (engine, pin) pair left out of the parametrization, and why (reported, never silent);
    ``engine`` None: a family that cannot take the pin on any engine (a text family on a vision pin)."""

    engine: str | None
    pin: str
    reason: str


@dataclass
class Settings:
    """What a session runs on. ``pins``: the ``--pin`` names, or empty for each family's defaults."""

    enabled: bool
    reference: str
    ports: list[str]
    pins: list[str]
    port_scope: PortScope
    reference_device: str = "cpu"
    left_out: dict[tuple[str | None, str], Pairing] = field(default_factory=dict)
    _compat: dict[tuple[str, str], str | None] = field(default_factory=dict)

    @classmethod
    def resolve(cls, opt: Any, enabled: bool) -> "Settings":
        """Resolve ``--reference``, ``--port``, ``--pin`` and ``--port-records`` once.

        Raises:
            OracleError: an unknown engine or pin (the known ones listed), a named port that cannot run
                here (why), a plugged engine that fails to import (its error), a bad ``--port-records``.
        """
        forget()
        try:
            scope = PortScope.parse(opt.port_records)
        except ValueError as exc:
            raise OracleError(str(exc)) from None
        ports = resolve_ports(opt.port, opt.reference)
        pins = [p.strip() for p in (opt.pin or "").split(",") if p.strip()]
        for name in pins:
            load_pin(name)  # unknown -> PinError listing the known pins and the folders searched
        device = getattr(opt, "reference_device", "cpu")
        _check_device(opt.reference, device)
        return cls(enabled=enabled, reference=opt.reference, ports=ports, pins=pins, port_scope=scope,
                   reference_device=device)

    def engine_kwargs(self, engine_id: str) -> dict[str, Any]:
        """Extra constructor arguments of ``engine_id``: the reference's ``device`` when not the CPU."""
        return {"device": self.reference_device} if engine_id == self.reference and self.reference_device != "cpu" else {}

    @property
    def engines(self) -> list[str]:
        """The reference's engine id, then each port's."""
        return [self.reference, *self.ports]

    def pins_for(self, family: Family | None) -> list[str]:
        """The pins a family's tests run on: ``--pin`` (those the family serves), else its defaults.

        Raises:
            OracleError: a default pin of the family is not in the pin store.
        """
        names = self.pins or list(family.default_pins if family else (DEFAULT_PIN,))
        out = []
        for name in names:
            pin = load_pin(name)
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
        if key not in self._compat:
            reason = None
            if unavailable_reason(engine_id) is None:
                reason = engine_class(engine_id).unsupported_pin(load_pin(pin))
            self._compat[key] = reason
            if reason:
                self.left_out[key] = Pairing(engine_id, pin, reason)
        return self._compat[key] is None

    def pairs(self, family: Family | None, engines: list[str]) -> list[tuple[str, str]]:
        """(pin, engine) pairs of a family's tests over ``engines``, compatible ones only."""
        return [(p, e) for p in self.pins_for(family) for e in engines if self.compatible(e, p)]

    def header_line(self) -> str:
        """What the report header says about engines and pins."""
        on = f" on {self.reference_device}" if self.reference_device != "cpu" else ""
        return (f"oracles: reference {self.reference}{on}; ports {', '.join(self.ports) or 'none'}; pins "
                f"{', '.join(self.pins) or 'each family default'} (from {store().describe()})")

    def left_out_lines(self) -> list[str]:
        """After collection: plugged engines that cannot be used and (engine, pin) pairs left out, with reasons."""
        lines = [f"oracles: plugged engine {e} not used: {reason}" for e, reason in plugged_errors().items()]
        for p in self.left_out.values():
            who = "a family" if p.engine is None else f"engine {p.engine}"
            lines.append(f"oracles: {who} left out pin {p.pin}: {p.reason}")
        return lines

    def left_out_json(self) -> list[dict[str, str | None]]:
        """The pairs left out, for the receipt."""
        return [{"engine": p.engine, "pin": p.pin, "reason": p.reason} for p in self.left_out.values()]


def _check_device(reference: str, device: str) -> None:
    """Refuse a ``--reference-device`` the reference engine does not run on, or that cannot answer here.

    Raises:
        OracleError: naming the engine, the device, and what was probed.
    """
    if device == "cpu":
        return
    cls = engine_class(reference)
    devices = cls.devices
    if device not in devices:
        raise OracleError(f"--reference-device {device}: engine {reference} runs on {', '.join(devices)} only")
    why = cls.device_unavailable(device)
    if why is not None:
        raise OracleError(f"--reference-device {device}: {why}")


def project_path(config: Any, key: str, default: str) -> Path:
    """An ini path option of the project, relative to the ini file's folder (else the rootdir)."""
    values = config.getini(key)
    if values:
        return Path(values[0])
    base = config.inipath.parent if config.inipath else config.rootpath
    return (base / default).resolve()
