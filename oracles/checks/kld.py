"""llama-perplexity's ``--kl-divergence`` statistics of a port against a reference, in pure numpy.

Every formula follows llama.cpp ``tools/perplexity/perplexity.cpp`` at commit
:data:`LLAMA_CPP_COMMIT` (read there, not recalled): the per-token figures of the
``log_softmax(int n_vocab, const float * logits, const uint16_t * base_log_prob, int tok,
kl_divergence_result & kld)`` overload, the sums of the ``kl_divergence_result`` struct, and the
print-out of ``kl_divergence(llama_context *, const common_params &)`` (its ``mean_and_uncertainty``,
``covariance`` and ``percentile`` lambdas, the median, the PPL, KLD and "Token probability" blocks).

The reference plays llama.cpp's "base" (its ``--kl-divergence-base`` log-probs), the port plays the
model being measured ("Q"). Where llama.cpp accumulates in float32 (each token's ``nll``, ``p_diff``,
the KL terms) this computes in float64; its sums are float64 there too. Three cases llama.cpp prints
as NaN are defined here so the figures stay JSON-safe: an uncertainty whose squared value rounds
below zero is 0, the RMS uncertainty of an all-zero delta-p is 0, a correlation with a zero spread is
None. llama.cpp's per-chunk lines are running totals over the chunks so far; :func:`statistics` of one
chunk's :class:`Positions` gives that chunk alone, of :meth:`Positions.concat` the pooled figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

#: The llama.cpp commit whose ``tools/perplexity/perplexity.cpp`` these formulas follow.
LLAMA_CPP_COMMIT = "050fc7f32de16858ac667d775b43a51ed8976e6f"

#: ``if (p_log_base > -16.f)``: a vocabulary entry enters the KL sum only where the reference's
#: log-probability is above -16 (the quantised base file holds nothing below ``max - 16`` either).
KL_FLOOR = -16.0

#: The KLD percentiles llama.cpp prints (``percentile(kld_values, f)``), by the key they get here.
KLD_PERCENTILES = {"p99_9": 0.999, "p99": 0.990, "p95": 0.950, "p90": 0.900,
                   "p10": 0.100, "p5": 0.050, "p1": 0.010, "p0_1": 0.001}
#: The delta-p percentiles it prints (``percentile(p_diff_values, f)``).
DELTA_P_PERCENTILES = {"p99_9": 0.999, "p99": 0.990, "p95": 0.950, "p90": 0.900, "p75": 0.750,
                       "p25": 0.250, "p10": 0.100, "p5": 0.050, "p1": 0.010, "p0_1": 0.001}
#: ``if (kld.count < 100) return;``: below this many positions llama.cpp prints no pooled block.
MIN_FOR_STATISTICS = 100

#: Rows per float64 block: [64, 152k] float64 is 78 MB, so a [N, V] float32 input is never widened whole.
BLOCK_ROWS = 64


@dataclass(frozen=True)
class Positions:
    """What one scored position contributes, for N positions (all ``[N]``).

    kld: float64, ``sum_i p_ref_i * (log p_ref_i - log p_port_i)`` over ``log p_ref_i > KL_FLOOR``, nats.
    p_diff: float64, ``p_port(tok) - p_ref(tok)`` of the actual next token (a probability, not percent).
    nll: float64, the port's ``-log p_port(tok)``; nll_base: float64, the reference's ``-log p_ref(tok)``.
    ref_top, port_top: int64, each side's first argmax (llama.cpp's ``imax_base`` / ``imax``).
    """

    kld: np.ndarray
    p_diff: np.ndarray
    nll: np.ndarray
    nll_base: np.ndarray
    ref_top: np.ndarray
    port_top: np.ndarray

    def __len__(self) -> int:
        return int(self.kld.shape[0])

    @staticmethod
    def concat(parts: Sequence["Positions"]) -> "Positions":
        """The positions of ``parts`` one after another (the pooled set over chunks)."""
        names = ("kld", "p_diff", "nll", "nll_base", "ref_top", "port_top")
        return Positions(*(np.concatenate([getattr(p, n) for p in parts]) for n in names))

    def receipt_arrays(self) -> dict[str, np.ndarray]:
        """The per-position arrays a receipt's npz holds: four float32 figures and two int32 top ids,
        24 bytes a position (24 kB per 1,000 tokens before compression), whatever the vocabulary."""
        return {"kld": self.kld.astype(np.float32), "p_diff": self.p_diff.astype(np.float32),
                "nll": self.nll.astype(np.float32), "nll_base": self.nll_base.astype(np.float32),
                "ref_top": self.ref_top.astype(np.int32), "port_top": self.port_top.astype(np.int32)}


def positions(ref_logprobs: Any, port_logprobs: Any, tokens: Any, *, kl_floor: float | None = KL_FLOOR) -> Positions:
    """The per-position figures of llama.cpp's ``log_softmax(..., kl_divergence_result & kld)``.

    Args:
        ref_logprobs: ``[N, V]`` float, the reference's log-softmax rows (or a base file's dequantised
            rows), used as given, as llama.cpp uses the base file's.
        port_logprobs: ``[N, V]`` float, the port's log-softmax rows, used as given (llama.cpp computes
            them from logits as ``logit - max - log(sum exp)``; pass rows already normalised).
        tokens: ``[N]`` int, the actual next token of each row (``tokens[i+1]`` in llama.cpp).
        kl_floor: the reference log-prob a term must exceed to enter the KL sum (:data:`KL_FLOOR`);
            None sums the whole vocabulary.

    Returns:
        :class:`Positions` of N positions, computed in float64 by blocks of :data:`BLOCK_ROWS` rows.

    Raises:
        ValueError: the shapes disagree, a token id is outside ``[0, V)``, or a row is not finite
            (row and side named).
    """
    ref, port = np.asarray(ref_logprobs), np.asarray(port_logprobs)
    tok = np.asarray(tokens).astype(np.int64).reshape(-1)
    if ref.ndim != 2 or ref.shape != port.shape or tok.shape[0] != ref.shape[0]:
        raise ValueError(f"kld positions: shapes reference {list(ref.shape)}, port {list(port.shape)}, "
                         f"tokens {list(tok.shape)}; expected [N, V], [N, V], [N]")
    if tok.size and (tok.min() < 0 or tok.max() >= ref.shape[1]):
        bad = int(np.flatnonzero((tok < 0) | (tok >= ref.shape[1]))[0])
        raise ValueError(f"kld positions: tokens[{bad}] = {int(tok[bad])} is outside the vocabulary [0, {ref.shape[1]})")
    parts = [_block(ref[s:s + BLOCK_ROWS], port[s:s + BLOCK_ROWS], tok[s:s + BLOCK_ROWS], s, kl_floor)
             for s in range(0, ref.shape[0], BLOCK_ROWS)]
    if not parts:
        empty, ints = np.zeros(0, np.float64), np.zeros(0, np.int64)
        return Positions(empty, empty, empty, empty, ints, ints)
    return Positions.concat(parts)


def _block(ref32: np.ndarray, port32: np.ndarray, tok: np.ndarray, start: int, kl_floor: float | None) -> Positions:
    """:func:`positions` of one block of rows (``start``: the first row's index, for the error)."""
    ref, port = ref32.astype(np.float64), port32.astype(np.float64)
    for side, rows in (("reference", ref), ("port", port)):
        finite = np.isfinite(rows).all(axis=1)
        if not finite.all():
            raise ValueError(f"kld positions: {side} row {start + int(np.argmin(finite))} is not finite")
    at = np.arange(ref.shape[0])
    # sum += p_base * (p_log_base - logits[i] + max_logit), over p_log_base > -16.f
    terms = np.exp(ref) * (ref - port)
    if kl_floor is not None:
        terms = np.where(ref > kl_floor, terms, 0.0)
    nll, nll_base = -port[at, tok], -ref[at, tok]
    # p_diff = expf(-nll) - expf(-nll_base)
    return Positions(kld=terms.sum(axis=1), p_diff=np.exp(-nll) - np.exp(-nll_base), nll=nll, nll_base=nll_base,
                     ref_top=ref.argmax(axis=1).astype(np.int64), port_top=port.argmax(axis=1).astype(np.int64))


def mean_and_uncertainty(total: float, total2: float, count: int) -> tuple[float, float]:
    """llama.cpp's ``mean_and_uncertainty(sum, sum2, count)``: ``f = sum/count``, and the standard
    error ``sqrt((sum2/count - f^2) / (count - 1))``, 0 when that is not positive or ``count <= 10``."""
    if count < 1:
        return 0.0, 0.0
    f = total / count
    df = total2 / count - f * f
    return f, (math.sqrt(df / (count - 1)) if df > 0 and count > 10 else 0.0)


def covariance(sum_a: float, sum_b: float, sum_ab: float, count: int) -> float:
    """llama.cpp's ``covariance(suma, sumb, sumab, count)``: the covariance of the two means,
    ``(sumab/count - (suma/count)(sumb/count)) / (count - 1)``; 0 below 10 values."""
    if count < 10:
        return 0.0
    return (sum_ab / count - (sum_a / count) * (sum_b / count)) / (count - 1)


def percentile(sorted_values: np.ndarray, fraction: float) -> float:
    """llama.cpp's ``percentile(values, fraction)`` on ascending values: linear interpolation at
    ``fraction * (n - 1)``; the first value at ``fraction <= 0``, the last at ``>= 1``."""
    if fraction <= 0:
        return float(sorted_values[0])
    if fraction >= 1:
        return float(sorted_values[-1])
    p = fraction * (len(sorted_values) - 1)
    ip = int(p)
    p -= ip
    return float((1 - p) * sorted_values[ip] + p * sorted_values[min(ip + 1, len(sorted_values) - 1)])


def median(sorted_values: np.ndarray) -> float:
    """llama.cpp's median: the middle value, or the mean of the two middle values of an even count."""
    n = len(sorted_values)
    return float(0.5 * (sorted_values[n // 2] + sorted_values[n // 2 - 1]) if n % 2 == 0 else sorted_values[n // 2])


def statistics(pos: Positions) -> dict[str, Any]:
    """Every figure llama.cpp's ``kl_divergence`` prints, for the positions ``pos`` (JSON-safe).

    Keys: ``count``; ``ppl``, ``ppl_base``, ``ln_ppl_ratio``, ``ppl_ratio``, ``ppl_diff`` (each
    ``{"value", "unc"}``) and ``ln_ppl_correlation`` (the "Cor(ln(PPL(Q)), ln(PPL(base)))" as a
    fraction, None with a zero spread); ``kld`` (``mean``, ``unc``, ``max``, ``median``, ``min`` and the
    :data:`KLD_PERCENTILES` keys, nats); ``delta_p`` (``mean``, ``unc``, ``rms``, ``rms_unc``, ``max``,
    ``median``, ``min`` and the :data:`DELTA_P_PERCENTILES` keys, probabilities: llama.cpp prints them
    times 100); ``same_top_p`` (``{"value", "unc"}``, a fraction); ``llama_cpp_prints_pooled``:
    ``count >= 100`` (llama.cpp withholds the percentile blocks below it; they are given here anyway).

    Raises:
        ValueError: ``pos`` holds no position.
    """
    n = len(pos)
    if n == 0:
        raise ValueError("kld statistics: no scored position")
    s_nll, s_nll2 = float(pos.nll.sum()), float((pos.nll ** 2).sum())
    s_base, s_base2 = float(pos.nll_base.sum()), float((pos.nll_base ** 2).sum())
    log_ppl, log_ppl_base = mean_and_uncertainty(s_nll, s_nll2, n), mean_and_uncertainty(s_base, s_base2, n)
    cov = covariance(s_nll, s_base, float((pos.nll * pos.nll_base).sum()), n)
    ppl, ppl_base = math.exp(log_ppl[0]), math.exp(log_ppl_base[0])
    ratio = log_ppl[0] - log_ppl_base[0]
    ratio_unc = _root(log_ppl[1] ** 2 + log_ppl_base[1] ** 2 - 2.0 * cov)
    spread = log_ppl[1] * log_ppl_base[1]
    ppl_unc, ppl_base_unc = ppl * log_ppl[1], ppl_base * log_ppl_base[1]
    same = float(np.count_nonzero(pos.ref_top == pos.port_top)) / n
    return {
        "count": n, "llama_cpp_prints_pooled": n >= MIN_FOR_STATISTICS,
        "ppl": _vu(ppl, ppl_unc), "ppl_base": _vu(ppl_base, ppl_base_unc),
        "ln_ppl_correlation": cov / spread if spread > 0 else None,
        "ln_ppl_ratio": _vu(ratio, ratio_unc), "ppl_ratio": _vu(math.exp(ratio), math.exp(ratio) * ratio_unc),
        "ppl_diff": _vu(ppl - ppl_base, _root(ppl_unc ** 2 + ppl_base_unc ** 2 - 2.0 * ppl * ppl_base * cov)),
        "kld": _kld_block(pos.kld),
        "delta_p": _delta_p_block(pos.p_diff),
        "same_top_p": _vu(same, math.sqrt(same * (1.0 - same) / (n - 1)) if n > 1 else 0.0),
    }


def _kld_block(kld: np.ndarray) -> dict[str, float]:
    """The "KL divergence statistics" block: mean with uncertainty, max, percentiles, median, min."""
    mean, unc = mean_and_uncertainty(float(kld.sum()), float((kld ** 2).sum()), len(kld))
    ordered = np.sort(kld)
    out = {"mean": mean, "unc": unc, "max": float(ordered[-1]), "median": median(ordered), "min": float(ordered[0])}
    out.update({k: percentile(ordered, f) for k, f in KLD_PERCENTILES.items()})
    return out


def _delta_p_block(p_diff: np.ndarray) -> dict[str, float]:
    """The "Token probability statistics" block: mean, percentiles, RMS with its uncertainty
    (``rms = sqrt(mean(dp^2))``, ``rms_unc = 0.5 / rms * unc(mean(dp^2))``, from ``sum_p_diff2`` and
    ``sum_p_diff4``)."""
    n = len(p_diff)
    mean, unc = mean_and_uncertainty(float(p_diff.sum()), float((p_diff ** 2).sum()), n)
    mse, mse_unc = mean_and_uncertainty(float((p_diff ** 2).sum()), float((p_diff ** 4).sum()), n)
    rms = math.sqrt(mse)
    ordered = np.sort(p_diff)
    out = {"mean": mean, "unc": unc, "rms": rms, "rms_unc": 0.5 / rms * mse_unc if rms > 0 else 0.0,
           "max": float(ordered[-1]), "median": median(ordered), "min": float(ordered[0])}
    out.update({k: percentile(ordered, f) for k, f in DELTA_P_PERCENTILES.items()})
    return out


def _root(x: float) -> float:
    """``sqrt`` of an uncertainty's square, 0 where rounding took it below zero (llama.cpp: NaN)."""
    return math.sqrt(x) if x > 0 else 0.0


def _vu(value: float, unc: float) -> dict[str, float]:
    return {"value": float(value), "unc": float(unc)}


def summary_line(stats: dict[str, Any]) -> str:
    """One line of the headline figures, as llama.cpp prints them (KLD in nats; delta-p and same top
    p in percent)."""
    k, d, t, r = stats["kld"], stats["delta_p"], stats["same_top_p"], stats["ppl_ratio"]
    return (f"n={stats['count']} KLD mean {k['mean']:.6f} ± {k['unc']:.6f} median {k['median']:.6f} "
            f"p99 {k['p99']:.6f} max {k['max']:.6f}; Δp mean {100 * d['mean']:.3f} ± {100 * d['unc']:.3f} % "
            f"RMS {100 * d['rms']:.3f} ± {100 * d['rms_unc']:.3f} %; same top p {100 * t['value']:.3f} ± "
            f"{100 * t['unc']:.3f} %; PPL(Q)/PPL(base) {r['value']:.6f} ± {r['unc']:.6f}")
