"""Port-vs-reference figures and their thresholds (pure numpy): ids, argmax agreement, max |Δlogit|,
NMSE, KL(reference‖port), first divergent generated token. Used by ``oracles/suite/test_port.py``, the
fault matrix and ``oracles compare``.

The thresholds are a :class:`oracles.checks.tolerance.Tolerance`'s (its port fields, each derived
there): the port's own in a port test (``port.tolerance()``), :data:`~oracles.checks.tolerance.FLOAT32`
by default.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oracles.checks.close import kl_divergence, log_softmax64, nmse
from oracles.checks.tolerance import FLOAT32, Tolerance


def _shown(limit: float) -> str:
    """A threshold as :data:`FLOAT32` writes it (``1e-06``, ``0.005``); its full repr if ``:g`` would round it."""
    short = f"{limit:g}"
    return short if float(short) == limit else repr(float(limit))


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def compared(value: float, op: str, limit: float) -> str:
    """``"<value> <op> <limit>"`` for a threshold message: the value to 4 significant digits, more when
    fewer would not show it on its side of the threshold, so a failure never reads as a tie (1.0003e-06
    over 1e-06 would otherwise print ``1.000e-06 > 1e-06``). A value equal to the threshold (``>=``)
    shows equal."""
    limit_text = _shown(limit)  # float(limit_text) == limit, so the shown pair compares as the true pair
    side = _sign(value - limit)
    for digits in range(3, 17):  # .16e is 17 significant digits: enough to tell any two doubles apart
        text = f"{value:.{digits}e}"
        if _sign(float(text) - limit) == side:
            break
    return f"{text} {op} {limit_text}"


def first_divergence(ref: Sequence[int], port: Sequence[int]) -> int | None:
    """First position where two token lists differ (a shorter list differs at its end), None if equal."""
    n = min(len(ref), len(port))
    for i in range(n):
        if int(ref[i]) != int(port[i]):
            return i
    return None if len(ref) == len(port) else n


def compared_rows(ref_tokens: Sequence[int], port_tokens: Sequence[int]) -> int:
    """How many leading step rows of two greedy runs come from the same prefix: every row while the
    generated tokens agree, through the row that chose the first divergent token (its prefix is still
    shared; later rows condition on different tokens), and no more rows than either run holds (one
    row per token). ``oracles/suite/test_port.py``, the fault matrix and ``oracles compare`` hold these
    rows of a decode or generation to the thresholds."""
    d = first_divergence(ref_tokens, port_tokens)
    n = min(len(ref_tokens), len(port_tokens))
    return n if d is None else min(d + 1, n)


def top2_gap(logits: Any) -> np.ndarray:
    """Per row, the largest logit minus the second largest (float64)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1, np.shape(logits)[-1])
    part = np.partition(x, -2, axis=-1)
    return part[:, -1] - part[:, -2]


def port_figures(ref_logits: Any, port_logits: Any) -> dict[str, Any]:
    """Every figure of two ``[T, V]`` (or ``[V]``) float32 logit arrays, JSON-safe.

    Keys: rows, argmax_agreement, disagreements (rows where the argmax differs, with the reference's
    top-2 gap), max_abs, argmax_row_max_abs, nmse, kl_mean, kl_max, kl_argmax_row, bit_equal.

    Raises:
        ValueError: shapes differ, or a value is not finite (row and column named).
    """
    r = np.asarray(ref_logits, dtype=np.float32)
    p = np.asarray(port_logits, dtype=np.float32)
    if r.shape != p.shape:
        raise ValueError(f"logit shapes differ: reference {list(r.shape)} vs port {list(p.shape)}")
    r2, p2 = r.reshape(-1, r.shape[-1]), p.reshape(-1, p.shape[-1])
    for name, a in (("reference", r2), ("port", p2)):
        bad = ~np.isfinite(a)
        if bad.any():
            row, col = (int(i) for i in np.argwhere(bad)[0])
            raise ValueError(f"{name} logits hold {int(bad.sum())} non-finite values; first at position {row}, "
                             f"token id {col}: {float(a[row, col])}")
    ra, pa = r2.argmax(-1), p2.argmax(-1)
    gaps = top2_gap(r2)
    kl = kl_divergence(r2, p2)
    dis = [{"row": int(i), "ref": int(ra[i]), "port": int(pa[i]), "ref_top2_gap": float(gaps[i])}
           for i in np.flatnonzero(ra != pa)]
    absd = np.abs(r2.astype(np.float64) - p2)
    return {"rows": int(r2.shape[0]), "argmax_agreement": float((ra == pa).mean()), "disagreements": dis,
            "max_abs": float(absd.max()), "max_abs_at": [int(i) for i in np.unravel_index(int(absd.argmax()), absd.shape)],
            "nmse": nmse(r2, p2), "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "kl_argmax_row": int(kl.argmax()), "bit_equal": bool(np.array_equal(r2.view("<u4"), p2.view("<u4")))}


def threshold_failures(fig: dict[str, Any], *, tolerance: Tolerance = FLOAT32) -> list[str]:
    """The thresholds of ``tolerance`` that ``fig`` (from :func:`port_figures`) passes, each as one line;
    [] when within all: max |Δlogit| over ``max_abs_logit``, NMSE over ``max_nmse``, KL max over
    ``max_kl``, an argmax that differs where the reference's top-2 gap is at least ``near_tie``."""
    t = tolerance
    out = []
    if fig["max_abs"] > t.max_abs_logit:
        out.append(f"max |Δlogit| {compared(fig['max_abs'], '>', t.max_abs_logit)} at (row, token) {fig['max_abs_at']}")
    if fig["nmse"] > t.max_nmse:
        out.append(f"NMSE {compared(fig['nmse'], '>', t.max_nmse)}")
    if fig["kl_max"] > t.max_kl:
        out.append(f"KL(ref‖port) max {compared(fig['kl_max'], '>', t.max_kl)} nats at row {fig['kl_argmax_row']}")
    hard = [d for d in fig["disagreements"] if d["ref_top2_gap"] >= t.near_tie]
    if hard:
        d = hard[0]
        out.append(f"argmax differs at row {d['row']}: reference {d['ref']} vs port {d['port']} with a reference "
                   f"top-2 gap {compared(d['ref_top2_gap'], '>=', t.near_tie)} (not a near tie); {len(hard)} such rows")
    return out


def readout_figures(keys: Sequence[str], ref_probs: Sequence[float], port_probs: Sequence[float]) -> dict[str, Any]:
    """Figures of one question's read-out probabilities, reference vs port, JSON-safe.

    ``keys`` name the options (one per probability, the same order on both sides). Keys:
    max_abs_dp, max_abs_dp_key (the option where it is reached), ref_key / port_key (argmax of each
    side, lowest index on a tie as :func:`oracles.checks.readout.argmax`), key_equal, ref_top2_gap
    (largest minus second-largest reference probability; the whole probability for one option).

    Raises:
        ValueError: the three lengths differ, are zero, or a probability is not finite.
    """
    r = np.asarray(ref_probs, dtype=np.float64)
    p = np.asarray(port_probs, dtype=np.float64)
    if not (len(keys) == r.size == p.size) or r.size == 0 or r.ndim != 1 or p.ndim != 1:
        raise ValueError(f"read-out lengths differ or are empty: {len(keys)} keys, reference {r.size} and "
                         f"port {p.size} probabilities")
    if not (np.isfinite(r).all() and np.isfinite(p).all()):
        raise ValueError("a read-out probability is not finite")
    d = np.abs(r - p)
    ordered = np.sort(r)[::-1]
    ri, pi = int(np.argmax(r)), int(np.argmax(p))
    return {"max_abs_dp": float(d.max()), "max_abs_dp_key": str(keys[int(d.argmax())]),
            "ref_key": str(keys[ri]), "port_key": str(keys[pi]), "key_equal": ri == pi,
            "ref_top2_gap": float(ordered[0] - (ordered[1] if r.size > 1 else 0.0))}


def readout_failures(fig: dict[str, Any], *, tolerance: Tolerance = FLOAT32) -> list[str]:
    """The read-out thresholds of ``tolerance`` that ``fig`` (from :func:`readout_figures`) passes, one
    line each; [] when within: max |Δp| over ``max_abs_dp``, an answer that differs where the
    reference's top-2 gap is over ``key_margin``."""
    out = []
    if fig["max_abs_dp"] > tolerance.max_abs_dp:
        out.append(f"max |Δp| {compared(fig['max_abs_dp'], '>', tolerance.max_abs_dp)} at option {fig['max_abs_dp_key']!r}")
    if not fig["key_equal"] and fig["ref_top2_gap"] > tolerance.key_margin:
        out.append(f"answer differs: reference {fig['ref_key']!r} vs port {fig['port_key']!r} with a reference "
                   f"top-2 gap {compared(fig['ref_top2_gap'], '>', tolerance.key_margin)} (not a near tie)")
    return out


def held_figures(what: str, ref_logits: Any, port_logits: Any) -> dict[str, Any]:
    """:func:`port_figures`, a bad input (shape, NaN) raised as AssertionError prefixed with ``what``
    (the record), so a test fails naming the record and the position."""
    __tracebackhide__ = True
    try:
        return port_figures(ref_logits, port_logits)
    except ValueError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def assert_within_thresholds(what: str, fig: dict[str, Any], *, tolerance: Tolerance = FLOAT32) -> None:
    """Raise AssertionError listing every threshold of ``tolerance`` that ``fig`` passes, prefixed with
    ``what``."""
    __tracebackhide__ = True
    failures = threshold_failures(fig, tolerance=tolerance)
    if failures:
        raise AssertionError(f"{what}: " + "; ".join(failures))


__all__ = ["assert_within_thresholds", "compared", "compared_rows", "first_divergence", "held_figures", "log_softmax64",
           "port_figures", "readout_failures", "readout_figures", "threshold_failures", "top2_gap"]
