"""Verdicts from logit rows stored to a stated error: the figures' bounds, and which thresholds they decide.

A receipt stores a unit's logits to within ``e`` of the float32 rows its test attached
(:mod:`oracles.checks.logit_codec`), with the rows' exact argmax, top-2 gap and sha256. A reader that
holds a reference (stored to ``ea``) against a port (``eb``) computes :func:`oracles.checks.port.port_figures`
on the stored rows; this module bounds the figures of the attached rows from them, so a threshold is
passed or failed only where the bound decides it, the verdict float32 rows would give:

* argmax agreement, the disagreements and the reference's top-2 gaps, bit equality: exact, from the
  statistics (rows whose sha256 agree on both sides are equal: every figure is then 0).
* max |Δlogit|: within ``g`` of the stored figure, ``g`` the bound on each stored difference's distance
  from the attached one: ``ea + eb`` (each logit of each side moved by at most its e), or less where the
  port was coded on the reference (:func:`oracles.receipts.logit_store.difference_error`).
* NMSE ``|r - p|² / |r|²``: the norms are within ``sqrt(N) g`` and ``sqrt(N) ea`` (triangle inequality
  over the ``N`` held logits).
* KL(ref‖port) per row: with ``d = r - p``, KL ≤ range(d)² / 8 (Hoeffding's lemma: KL = E_P[d] +
  log E_P[exp(-d)]), and along the segment from the stored to the attached rows its derivative is
  ``P (d - E_P d)`` in the reference's logits and ``Q - P`` in the port's, so
  |ΔKL| ≤ ea · R + eb · 2 TV(P, Q) ≤ ea · R + eb · min(2, R / 2), ``R = range(d_stored) + 2 g`` (Pinsker:
  TV ≤ sqrt(KL / 2) ≤ R / 4).

A threshold is *failed* where the lower bound is over it, *undecided* where only the upper bound is;
under a band, the band's own figures are bounds too, so the failed side uses the band's upper bounds
and the undecided side its lower. With ``g = 0`` the bounds are the figures and the verdict is
:func:`oracles.checks.port.threshold_failures`'s, word for word. Pure numpy.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from oracles.checks.close import kl_divergence
from oracles.checks.logit_codec import Stats
from oracles.checks.port import threshold_failures
from oracles.checks.tolerance import Tolerance

#: Absolute slack on a KL bound for float64 rounding in computing KL itself (values of tens of nats
#: summed over ~10^5 terms round at ~1e-14); far below any KL threshold (1.25e-5).
KL_SLACK = 1e-12
#: The figures a stored error widens, and the prefix of the failure line :func:`threshold_failures` writes for each.
PREFIXES = {"max_abs": "max |Δlogit|", "nmse": "NMSE", "kl_max": "KL(ref‖port)", "argmax": "argmax differs"}


def exact_from_stats(fig: dict[str, Any], ref: Stats, port: Stats) -> dict[str, Any]:
    """``fig`` (:func:`oracles.checks.port.port_figures` of stored rows) with the figures the exact
    statistics decide set from them: ``argmax_agreement``, ``disagreements`` (rows, both argmaxes, the
    reference's top-2 gap), ``bit_equal``; and every figure 0 where every row's sha256 agrees.

    ``ref``, ``port``: the statistics of the same held rows (as many rows as ``fig["rows"]``).
    """
    n = fig["rows"]
    ra, pa = ref.argmax[:n], port.argmax[:n]
    out = {**fig, "argmax_agreement": float((ra == pa).mean()) if n else 1.0,
           "disagreements": [{"row": int(i), "ref": int(ra[i]), "port": int(pa[i]), "ref_top2_gap": float(ref.gap[i])}
                             for i in np.flatnonzero(ra != pa)],
           "bit_equal": bool(np.array_equal(ref.sha[:n], port.sha[:n]))}
    if out["bit_equal"]:
        out.update(max_abs=0.0, nmse=0.0, kl_mean=0.0, kl_max=0.0)
    return out


def figure_bounds(a: np.ndarray, b: np.ndarray, ea: float, eb: float, g: float,
                  fig: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Lower and upper bounds of the attached rows' figures: copies of ``fig`` with ``max_abs``,
    ``nmse`` and ``kl_max`` replaced (module docstring; ``fig`` as :func:`exact_from_stats` gives it).

    Args:
        a, b: the stored held rows ``[n, V]`` (or ``[V]``) float32, reference and port.
        ea, eb: their stored errors (logit units, >= 0).
        g: the bound on |(a - b) - (attached difference)| elementwise: at most ``ea + eb``, less where
            both were coded on one anchor (:func:`oracles.receipts.logit_store.difference_error`).
    """
    if (ea == 0 and eb == 0) or fig.get("bit_equal"):
        return dict(fig), dict(fig)
    r = a.reshape(-1, a.shape[-1]).astype(np.float64)
    p = b.reshape(-1, b.shape[-1]).astype(np.float64)
    root_n = math.sqrt(r.size)
    num, den = float(np.sqrt(((r - p) ** 2).sum())), float(np.sqrt((r * r).sum()))
    nmse_lo = max(num - root_n * g, 0.0) ** 2 / (den + root_n * ea) ** 2 if den + root_n * ea > 0 else 0.0
    den_lo = den - root_n * ea
    nmse_hi = (num + root_n * g) ** 2 / den_lo ** 2 if den_lo > 0 else math.inf
    d = r - p
    spread = d.max(-1) - d.min(-1) + 2 * g
    kl = kl_divergence(r, p)
    delta = ea * spread + eb * np.minimum(2.0, spread / 2) + KL_SLACK
    kl_hi = np.minimum(kl + delta, spread ** 2 / 8 + KL_SLACK)
    kl_lo = np.maximum(kl - delta, 0.0)
    lo = {**fig, "max_abs": max(fig["max_abs"] - g, 0.0), "nmse": nmse_lo, "kl_max": float(kl_lo.max())}
    hi = {**fig, "max_abs": fig["max_abs"] + g, "nmse": nmse_hi, "kl_max": float(kl_hi.max())}
    return lo, hi


def _which(line: str) -> str:
    return next((k for k, prefix in PREFIXES.items() if line.startswith(prefix)), line)


def bounded_failures(lo: dict[str, Any], hi: dict[str, Any], tolerance: Tolerance,
                     tolerance_hi: Tolerance | None = None, error: float | None = None) -> tuple[list[str], list[str]]:
    """The thresholds the bounds decide failed, and those they leave undecided, one line each.

    Args:
        lo, hi: :func:`figure_bounds`.
        tolerance: the thresholds; ``tolerance_hi`` their upper ends where they are bounds too (a band
            computed from stored rows: ``tolerance`` from the band's lower figures, this from its upper).
        error: the stored difference's error ``g`` (:func:`figure_bounds`), named in the lines; None
            for rows stored as attached.

    Returns:
        ``(failed, undecided)``: a failed line is :func:`oracles.checks.port.threshold_failures`'s on the
        lower bounds against the upper thresholds; an undecided one its line on the upper bounds against
        the lower thresholds, for a threshold not failed. With rows stored as attached (``lo == hi``,
        one tolerance, ``error`` None): ``(threshold_failures(lo, tolerance), [])``.
    """
    upper = tolerance_hi or tolerance
    failed = threshold_failures(lo, tolerance=upper)
    seen = {_which(line) for line in failed}
    maybe = [line for line in threshold_failures(hi, tolerance=tolerance) if _which(line) not in seen]
    if error is None and tolerance_hi is None:
        return failed, maybe
    note = f"the stored logit differences are within {error or 0:.2e} of the attached float32 rows'"
    failed = [f"{line} (a lower bound: {note})" for line in failed]
    undecided = [f"undecided: {line} at most, and may be within it ({note}; the port test that attached them "
                 f"held the float32 rows)" for line in maybe]
    return failed, undecided


__all__ = ["KL_SLACK", "bounded_failures", "exact_from_stats", "figure_bounds"]
