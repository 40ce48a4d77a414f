"""Port-vs-reference thresholds and figures (pure numpy): ids, argmax agreement, max |Δlogit|, NMSE,
KL(reference‖port), first divergent generated token. Used by ``oracles/suite/test_port.py`` and
``oracles compare``.

The thresholds are float32 thresholds: a port that computes the same float32 graph in another order
(other BLAS blocking, fused kernels, another attention kernel) and nothing else. Measured here, MLX
(CPU) against transformers on SmolLM2-135M-Instruct: max |Δlogit| 1.5e-4 on the 31-token "ping"
prefill, logits of magnitude up to ~30, so about 40 float32 ULPs at that magnitude after 30 layers.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oracles.checks.close import kl_divergence, log_softmax64, nmse

#: max |Δlogit|: 30x the measured 1.5e-4, room for longer contexts (the error grows with the number
#: of attended positions) yet 100x below the 0.5+ a real bug gives (a wrong RoPE base measured 9.96).
MAX_ABS_LOGIT = 5e-3
#: NMSE: (5e-3 / typical |logit| of ~5)^2 = 1e-6; a sign or scale error gives >1e-2.
MAX_NMSE = 1e-6
#: KL(ref‖port) in nats, per row: for small logit noise e, KL ~ Var_p(e)/2 <= (5e-3)^2 / 2 = 1.25e-5.
MAX_KL = 1.25e-5
#: An argmax may differ only where the reference's top-2 gap is below this (a near tie that float32
#: reordering can flip): twice the max |Δlogit| allowed.
NEAR_TIE = 2 * MAX_ABS_LOGIT


#: max |Δp| over one question's read-out probabilities (d1). With p = softmax(s) over the group
#: scores s_g = logsumexp(x[G_g]) - logsumexp(x) (:mod:`oracles.checks.readout`), a logit error of at
#: most e moves each logsumexp by at most e, so every s_g - s_h by at most 2e; to first order
#: dp_g = p_g * sum_h p_h (ds_g - ds_h), so |dp_g| <= p_g (1 - p_g) 2e <= e / 2. A port within
#: MAX_ABS_LOGIT therefore moves no probability by more than MAX_ABS_LOGIT / 2 = 2.5e-3; this bound is
#: the threshold, so Δp and Δlogit hold a port to the same float32 standard.
MAX_ABS_DP = MAX_ABS_LOGIT / 2
#: The argmax *key* of a question (the answer) may differ only where the reference's top-2 gap of the
#: read-out probabilities is at most this: two options each moved by at most MAX_ABS_DP, in opposite
#: directions, close a gap of at most 2 * MAX_ABS_DP = 5e-3, so a larger gap flips only when the
#: port is outside the Δp threshold too (the key failure then names the answer that changed).
#: Measured MLX (CPU) vs torch on the d1 port sample (4 rows + 2 tree branches, receipt tag d1cmp):
#: max |Δp| 7.5e-6 (max |Δlogit| 8.0e-5), so the margin is ~670x the measured noise; a gap at most the
#: margin is a near tie that float32 reordering may flip, and is recorded, not failed.
KEY_MARGIN = 2 * MAX_ABS_DP


def _shown(limit: float) -> str:
    """A threshold as written in this module (``1e-06``, ``0.005``); its full repr if ``:g`` would round it."""
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


def threshold_failures(fig: dict[str, Any]) -> list[str]:
    """The thresholds ``fig`` (from :func:`port_figures`) passes, each as one line; [] when within all."""
    out = []
    if fig["max_abs"] > MAX_ABS_LOGIT:
        out.append(f"max |Δlogit| {compared(fig['max_abs'], '>', MAX_ABS_LOGIT)} at (row, token) {fig['max_abs_at']}")
    if fig["nmse"] > MAX_NMSE:
        out.append(f"NMSE {compared(fig['nmse'], '>', MAX_NMSE)}")
    if fig["kl_max"] > MAX_KL:
        out.append(f"KL(ref‖port) max {compared(fig['kl_max'], '>', MAX_KL)} nats at row {fig['kl_argmax_row']}")
    hard = [d for d in fig["disagreements"] if d["ref_top2_gap"] >= NEAR_TIE]
    if hard:
        d = hard[0]
        out.append(f"argmax differs at row {d['row']}: reference {d['ref']} vs port {d['port']} with a reference "
                   f"top-2 gap {compared(d['ref_top2_gap'], '>=', NEAR_TIE)} (not a near tie); {len(hard)} such rows")
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


def readout_failures(fig: dict[str, Any]) -> list[str]:
    """The read-out thresholds ``fig`` (from :func:`readout_figures`) passes, one line each; [] when within."""
    out = []
    if fig["max_abs_dp"] > MAX_ABS_DP:
        out.append(f"max |Δp| {compared(fig['max_abs_dp'], '>', MAX_ABS_DP)} at option {fig['max_abs_dp_key']!r}")
    if not fig["key_equal"] and fig["ref_top2_gap"] > KEY_MARGIN:
        out.append(f"answer differs: reference {fig['ref_key']!r} vs port {fig['port_key']!r} with a reference "
                   f"top-2 gap {compared(fig['ref_top2_gap'], '>', KEY_MARGIN)} (not a near tie)")
    return out


def held_figures(what: str, ref_logits: Any, port_logits: Any) -> dict[str, Any]:
    """:func:`port_figures`, a bad input (shape, NaN) raised as AssertionError prefixed with ``what``
    (the record), so a test fails naming the record and the position."""
    __tracebackhide__ = True
    try:
        return port_figures(ref_logits, port_logits)
    except ValueError as exc:
        raise AssertionError(f"{what}: {exc}") from None


def assert_within_thresholds(what: str, fig: dict[str, Any]) -> None:
    """Raise AssertionError listing every threshold ``fig`` passes, prefixed with ``what``."""
    __tracebackhide__ = True
    failures = threshold_failures(fig)
    if failures:
        raise AssertionError(f"{what}: " + "; ".join(failures))


__all__ = ["held_figures", "assert_within_thresholds", "MAX_ABS_LOGIT", "MAX_NMSE", "MAX_KL", "NEAR_TIE", "first_divergence",
           "compared_rows",
           "port_figures", "threshold_failures", "top2_gap", "log_softmax64", "MAX_ABS_DP", "KEY_MARGIN", "readout_figures",
           "readout_failures"]
