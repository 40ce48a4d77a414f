"""What a session's options ask of recordings, refused at session start in one line naming the option
(:mod:`oracles.plugin.options` calls these): ``--record ENGINE=DIR`` and a ``recorded:DIR`` engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from oracles.engines.recorded.replay import PREFIX
from oracles.engines.recorded.store import Store
from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.pins.pin import PinStore


def parse_records(values: Sequence[str], engines: Sequence[str], base: Path) -> dict[str, Path]:
    """``["ENGINE=DIR", ...]`` -> {engine id: store folder}, each ``ENGINE`` an engine this run uses.

    Raises:
        OracleError: ``--record VALUE: ...``: no ``=``, an engine the session does not run (those it runs
            named), a recording (``recorded:DIR``: its answers are recorded already), an engine or a folder
            named twice, a folder that is a ``recorded:`` engine of this run, or a folder that holds
            something other than a store of this layout.
    """
    out: dict[str, Path] = {}
    replayed = {Path(e.removeprefix(PREFIX)).expanduser().resolve() for e in engines if e.startswith(PREFIX)}
    for value in values:
        engine, sep, folder = value.partition("=")
        if not sep or not engine or not folder:
            raise OracleError(f"--record {value!r}: expected ENGINE=DIR")
        if engine.startswith(PREFIX):
            raise OracleError(f"--record {value!r}: {engine} is a recording already; record the engine it replays")
        if engine not in engines:
            raise OracleError(f"--record {value!r}: this run does not run engine {engine!r} (it runs "
                              f"{', '.join(engines)}); name the reference or a --port")
        root = (base / Path(folder).expanduser()).resolve()
        if engine in out or root in out.values():
            raise OracleError(f"--record {value!r}: one folder an engine, one engine a folder")
        if root in replayed:
            raise OracleError(f"--record {value!r}: {root} is the store this run replays")
        Store(root).check(must_exist=False)
        out[engine] = root
    return out


def recorded_refusal(engine_id: str, pins: "PinStore", named: Sequence[str]) -> str | None:
    """Why the recording ``recorded:DIR`` cannot serve this run, else None: the store cannot be read or
    holds nothing, one of its pins is another digest than the pin store's (a snapshot changed since), or a
    pin ``--pin`` names has no recording in it (a family's default pins are asked when an engine is built)."""
    store = Store(Path(engine_id.removeprefix(PREFIX)).expanduser().resolve())
    try:
        store.check()
        held = store.contexts()
    except OracleError as exc:
        return str(exc)
    if not held:
        return f"{store.root} holds no recording yet"
    for c in held:
        name, digest = c.pin
        if pins.path(name) is not None and pins.load(name).digest != digest:
            return (f"{store.root} recorded {c.engine} on pin {name} of digest {digest}; the pin's digest is now "
                    f"{pins.load(name).digest}: record again")
    have = {c.pin[0] for c in held}
    missing = [p for p in named if p not in have]
    if missing:
        return f"{store.root} holds no recording of pin(s) {', '.join(missing)} (it holds {', '.join(sorted(have))})"
    return None
