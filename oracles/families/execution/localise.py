"""Localising a port's divergence on one prompt: both engines' per-layer states and the first stage
over its budget (:mod:`oracles.checks.bisect` holds the rule and the budgets). Used by ``oracles
bisect`` and by the port family, which attaches the report to a failed record's receipt entry.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from oracles.checks.tolerance import FLOAT32, Tolerance
from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.engines.taps import Taps
    from oracles.engines.types import Step


class Localisable(Protocol):
    """What localising reads of an engine: its id and pin, its layer states (``taps``, else
    ``forward(..., layers=True)``) and what its adapter translated to load the artifact
    (``translation_notes``). Every :class:`oracles.engines.base.Engine` is one."""

    @property
    def id(self) -> str: ...

    @property
    def pin(self) -> str: ...

    def translation_notes(self) -> tuple[str, ...]: ...

    def taps(self, prompt: Sequence[int], /) -> Taps: ...

    def forward(self, prompt: Sequence[int], /, *, layers: bool) -> Step: ...


class CannotLocalise(OracleError):
    """An engine without per-layer states (``forward(layers=True)`` refused); ``engine`` names it."""

    def __init__(self, engine: str, why: str) -> None:
        super().__init__(f"engine {engine!r} cannot be localised: {why}")
        self.engine, self.why = engine, why


def capture(engine: Localisable, ids: Sequence[int]) -> dict[str, Any]:
    """One cold prefill's arrays: ``stream``, ``hidden``, ``logits``, and ``attn``/``mlp`` where the
    engine taps inside its layers (``Engine.taps``), with ``attn_norm``/``mlp_norm`` where it taps the
    norms too; the stream alone where it only has ``forward(layers=True)``.

    Raises:
        CannotLocalise: the engine has neither.
    """
    from oracles.engines.base import Unsupported

    try:
        t = engine.taps(list(ids))
        norms = {k: v for k, v in (("attn_norm", t.attn_norm), ("mlp_norm", t.mlp_norm)) if v is not None}
        return {"stream": t.stream, "attn": t.attn, "mlp": t.mlp, "hidden": t.hidden, "logits": t.logits, **norms}
    except Unsupported:
        pass
    try:
        step = engine.forward(list(ids), layers=True)
    except Unsupported as exc:
        raise CannotLocalise(engine.id, exc.why or str(exc)) from None
    if step.layers is None:
        raise CannotLocalise(engine.id, "forward(layers=True) returned no layer states")
    return {"stream": step.layers, "hidden": step.hidden, "logits": step.logits}


def localise(reference: Localisable, port: Localisable, ids: Sequence[int], record: str, *,
             tolerance: Tolerance = FLOAT32) -> dict[str, Any]:
    """Both engines on ``ids``; the JSON-safe report: every stage, the named one (``divergent``, or
    None), the block inside it (:func:`oracles.checks.bisect.inside_layer`) where both sides tap them,
    or ``cannot_localise`` naming the engine without layer states (then no stages). The budgets are
    ``tolerance``'s (the port's own, from the caller), named with its margin under ``tolerance``;
    ``translations`` are the port's (``translation_notes()``): what its adapter changed to load the
    artifact, which every verdict on it needed."""
    from oracles.checks.bisect import first_divergent, inside_layer, stages

    report: dict[str, Any] = {"pin": reference.pin, "record": record, "reference": reference.id, "port": port.id,
                              "tokens": len(ids), "stages": [], "divergent": None, "inside": None, "cannot_localise": None,
                              "tolerance": {"name": tolerance.name, "margin": tolerance.bisect_margin},
                              "translations": list(port.translation_notes())}
    try:
        ref, got = capture(reference, ids), capture(port, ids)
    except CannotLocalise as exc:
        report["cannot_localise"] = {"engine": exc.engine, "why": exc.why}
        return report
    found = stages(ref, got, tolerance=tolerance)
    report["stages"] = [s.to_json() for s in found]
    i = first_divergent(found)
    if i is not None:
        report["divergent"] = found[i].name
        if found[i].name.startswith("layer ") and "attn" in ref and "attn" in got:
            report["inside"] = inside_layer(int(found[i].name.split()[1]), ref, got, tolerance=tolerance)
    return report
