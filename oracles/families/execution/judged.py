"""The bounds a port test holds one record's logits to: the port's own (an exact judgment), or the
band of that record (:mod:`oracles.checks.judgment`): the reference's code run in the port's dtype on
the same rows, held against the float32 reference, times :data:`~oracles.checks.judgment.BAND_RATIO`.

The band engine's runs are memoised in the session's ``runs`` like every other run (its id is
``torch@bfloat16``), so a record's band is computed once per worker.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

from oracles.checks.judgment import BAND_RATIO, Judgment, band_tolerance
from oracles.checks.port import port_figures

if TYPE_CHECKING:
    from oracles.checks.tolerance import Tolerance
    from oracles.engines.base import Engine
    from oracles.families.callables import Runs


@dataclass
class Judge:
    """One port test's judgment: ``judgment``, the port's own bounds ``own``, and ``band``: a callable
    building the band engine (None for an exact judgment). ``translations``: what the port's adapter
    translated to load the artifact (named in every verdict: :meth:`label`)."""

    judgment: Judgment
    own: Tolerance
    band: Callable[[], Engine] | None = None
    translations: tuple[str, ...] = ()

    def label(self, what: str) -> str:
        """``what`` with the band and the translations the verdict needed, for a message."""
        notes = [] if self.judgment.exact else [f"judged by the {self.judgment.dtype} band"]
        if self.translations:
            notes.append("port loaded with " + "; ".join(self.translations))
        return f"{what} [{', '.join(notes)}]" if notes else what

    def bounds(self, runs: Runs, key: Any, ref_logits: Any,
               band_logits: Callable[[Engine], Any]) -> tuple[Tolerance, dict[str, Any] | None]:
        """The bounds for these reference logits, and the band's figures (None when exact).

        ``band_logits(engine)`` computes the band engine's logits on the same rows (memoised under
        ``key`` in ``runs``).
        """
        if self.band is None:
            return self.own, None
        engine = self.band()
        logits = runs(("band", key, engine.id, engine.pin), lambda: band_logits(engine))
        figures = port_figures(ref_logits, logits)
        return band_tolerance(self.own, figures), _brief(figures)


    def bisect_tolerance(self, runs: Runs, reference: Engine, ids: Sequence[int], tolerance: Tolerance) -> Tolerance:
        """``tolerance`` with bisect's noise floor calibrated on the band: the band engine's layer states
        against the reference's on ``ids`` (:func:`oracles.checks.bisect.stages`) give each depth's NMSE,
        and the floor is their linear upper envelope (``floor_at_0`` the embedding's NMSE, ``per_layer``
        the largest excess per depth after it), the margin :data:`BAND_RATIO` squared (NMSE is a
        square). The tolerance itself for an exact judgment, whose floors are float32's.
        """
        if self.band is None:
            return tolerance
        from dataclasses import replace

        from oracles.checks.bisect import stages
        from oracles.families.execution.localise import capture

        engine = self.band()
        ref = runs(("capture", tuple(ids), reference.id, reference.pin), lambda: capture(reference, ids))
        band = runs(("capture", tuple(ids), engine.id, engine.pin), lambda: capture(engine, ids))
        found = stages(ref, band, tolerance=tolerance)
        at_0 = found[0].nmse
        per_layer = max((s.nmse - at_0) / s.depth for s in found[1:])
        inside = [s.nmse for s in found if s.name.startswith("layer")]
        return replace(tolerance, bisect_floor_at_0=at_0, bisect_floor_per_layer=max(per_layer, 0.0),
                       bisect_margin=BAND_RATIO ** 2, bisect_sublayer_floor=max(inside, default=at_0))


def teacher_forced(engine: Engine, prompt: Sequence[int], tokens: Sequence[int], rows: int) -> Any:
    """``[rows, V]`` logits of ``engine`` on ``prompt`` followed by ``tokens``, the rows that predict
    ``tokens[0..rows-1]`` (a greedy run's step logits, computed by one cold forward).

    Raises:
        ValueError: ``rows`` is not in 1..len(tokens).
    """
    if not 1 <= rows <= len(tokens):
        raise ValueError(f"rows {rows}: expected 1..{len(tokens)}")
    ids = [*prompt, *tokens[: rows - 1]]
    return engine.forward(ids, keep=rows).logits


def _brief(fig: dict[str, Any]) -> dict[str, Any]:
    """The band's figures the receipt keeps (not its per-row disagreements)."""
    return {k: fig[k] for k in ("rows", "max_abs", "nmse", "kl_mean", "kl_max", "argmax_agreement")}


__all__ = ["Judge", "teacher_forced"]
