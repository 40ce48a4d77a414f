"""oracles.checks.kld: llama-perplexity's --kl-divergence statistics on hand-made rows.

Every expected value is worked out here from the probabilities by a closed form (math, statistics),
never by the code under test: KL as ``sum p ln(p/q)``, the uncertainties as the standard error
``stdev / sqrt(n)`` (what llama.cpp's ``sqrt((sum2/n - mean^2)/(n-1))`` equals), the ln-PPL-ratio
uncertainty as the standard error of ``nll - nll_base``, the correlation as Pearson's.
"""

from __future__ import annotations

import math
import statistics as st

import numpy as np
import pytest

from oracles.checks.kld import KL_FLOOR, Positions, median, percentile, positions, statistics

pytestmark = pytest.mark.dry

#: Relative tolerance of figures from float32 log-prob inputs: float32 rounds a log-prob by 2^-24
#: relative (6e-8); the figures sum a handful of such terms, so 1e-6 is far above rounding and far
#: below any formula slip (the smallest difference between two formulas here is > 1e-3 relative).
REL = 1e-6

#: (reference probabilities, port probabilities, next token), V = 3, 4 and 5.
CASES = [
    ([0.5, 0.25, 0.25], [0.25, 0.5, 0.25], 0),
    ([0.5, 0.25, 0.25], [0.25, 0.5, 0.25], 1),
    ([0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], 2),
    ([0.7, 0.1, 0.1, 0.05, 0.05], [0.6, 0.2, 0.1, 0.05, 0.05], 0),
]


def _kl(p: list[float], q: list[float]) -> float:
    return sum(a * math.log(a / b) for a, b in zip(p, q))


def _rows(p: list[float]) -> np.ndarray:
    return np.log(np.asarray([p], dtype=np.float64)).astype(np.float32)


@pytest.mark.parametrize(("p", "q", "tok"), CASES)
def test_one_position_by_hand(p: list[float], q: list[float], tok: int) -> None:
    got = positions(_rows(p), _rows(q), [tok])
    assert got.kld[0] == pytest.approx(_kl(p, q), rel=REL)
    assert got.p_diff[0] == pytest.approx(q[tok] - p[tok], rel=REL, abs=1e-7)
    assert got.nll[0] == pytest.approx(-math.log(q[tok]), rel=REL)
    assert got.nll_base[0] == pytest.approx(-math.log(p[tok]), rel=REL)
    assert got.ref_top[0] == max(range(len(p)), key=lambda i: p[i])
    assert got.port_top[0] == max(range(len(q)), key=lambda i: q[i])


def _dataset() -> tuple[np.ndarray, np.ndarray, list[int], list[tuple[list[float], list[float], int]]]:
    """12 positions of V = 3 (count > 10: llama.cpp gives no uncertainty at 10 or fewer)."""
    rows = [([0.5, 0.25, 0.25], [0.25, 0.5, 0.25], 0), ([0.5, 0.25, 0.25], [0.25, 0.5, 0.25], 1),
            ([0.6, 0.3, 0.1], [0.5, 0.3, 0.2], 0), ([0.2, 0.2, 0.6], [0.1, 0.3, 0.6], 2),
            ([0.2, 0.2, 0.6], [0.1, 0.3, 0.6], 1), ([0.8, 0.1, 0.1], [0.8, 0.15, 0.05], 0)] * 2
    ref = np.concatenate([_rows(p) for p, _, _ in rows])
    port = np.concatenate([_rows(q) for _, q, _ in rows])
    return ref, port, [t for _, _, t in rows], rows


def test_pooled_statistics_by_hand() -> None:
    ref, port, toks, rows = _dataset()
    s = statistics(positions(ref, port, toks))
    n = len(rows)
    kl = [_kl(p, q) for p, q, _ in rows]
    dp = [q[t] - p[t] for p, q, t in rows]
    nll = [-math.log(q[t]) for _, q, t in rows]
    base = [-math.log(p[t]) for p, _, t in rows]
    assert s["count"] == n and s["llama_cpp_prints_pooled"] is False
    assert s["kld"]["mean"] == pytest.approx(st.mean(kl), rel=REL)
    assert s["kld"]["unc"] == pytest.approx(st.stdev(kl) / math.sqrt(n), rel=1e-5)
    assert s["kld"]["max"] == pytest.approx(max(kl), rel=REL)
    assert s["kld"]["min"] == pytest.approx(min(kl), rel=REL)
    assert s["kld"]["median"] == pytest.approx(st.median(kl), rel=REL)
    assert s["kld"]["p90"] == pytest.approx(float(np.percentile(kl, 90)), rel=REL)
    # the mean is 0 here by construction; float32 rounds each probability by up to 6e-8
    assert s["delta_p"]["mean"] == pytest.approx(st.mean(dp), rel=1e-5, abs=1e-7)
    assert s["delta_p"]["unc"] == pytest.approx(st.stdev(dp) / math.sqrt(n), rel=1e-5)
    assert s["delta_p"]["rms"] == pytest.approx(math.sqrt(st.mean([d * d for d in dp])), rel=REL)
    sq = [d * d for d in dp]
    assert s["delta_p"]["rms_unc"] == pytest.approx(
        0.5 / math.sqrt(st.mean(sq)) * st.stdev(sq) / math.sqrt(n), rel=1e-5)
    assert s["delta_p"]["p25"] == pytest.approx(float(np.percentile(dp, 25)), rel=1e-5, abs=1e-8)
    same = sum(max(range(3), key=lambda i: p[i]) == max(range(3), key=lambda i: q[i]) for p, q, _ in rows) / n
    assert s["same_top_p"]["value"] == pytest.approx(same) and 0 < same < 1
    assert s["same_top_p"]["unc"] == pytest.approx(math.sqrt(same * (1 - same) / (n - 1)))
    assert s["ppl"]["value"] == pytest.approx(math.exp(st.mean(nll)), rel=REL)
    assert s["ppl"]["unc"] == pytest.approx(math.exp(st.mean(nll)) * st.stdev(nll) / math.sqrt(n), rel=1e-5)
    assert s["ppl_base"]["value"] == pytest.approx(math.exp(st.mean(base)), rel=REL)
    diff = [a - b for a, b in zip(nll, base)]
    assert s["ln_ppl_ratio"]["value"] == pytest.approx(st.mean(diff), rel=1e-5, abs=1e-7)
    assert s["ln_ppl_ratio"]["unc"] == pytest.approx(st.stdev(diff) / math.sqrt(n), rel=1e-4)
    assert s["ppl_ratio"]["value"] == pytest.approx(math.exp(st.mean(diff)), rel=REL)
    assert s["ln_ppl_correlation"] == pytest.approx(st.correlation(nll, base), rel=1e-5)


def test_reference_against_itself_is_zero() -> None:
    ref, _, toks, _ = _dataset()
    s = statistics(positions(ref, ref.copy(), toks))
    assert s["kld"]["mean"] == 0.0 and s["kld"]["max"] == 0.0 and s["kld"]["unc"] == 0.0
    assert s["same_top_p"] == {"value": 1.0, "unc": 0.0}
    assert s["delta_p"]["mean"] == 0.0 and s["delta_p"]["rms"] == 0.0 and s["delta_p"]["rms_unc"] == 0.0
    assert s["delta_p"]["max"] == 0.0 and s["delta_p"]["min"] == 0.0
    assert s["ln_ppl_ratio"]["value"] == 0.0 and s["ppl_ratio"]["value"] == 1.0
    assert s["ln_ppl_correlation"] == pytest.approx(1.0)


def test_positive_control_a_perturbed_port_shows() -> None:
    """One logit of one row moved by 0.01: KL, delta-p and the PPL ratio leave zero."""
    ref, _, toks, _ = _dataset()
    port = ref.astype(np.float64)
    port[3, 2] += 0.01
    port = port - np.log(np.exp(port).sum(axis=1, keepdims=True))
    s = statistics(positions(ref, port.astype(np.float32), toks))
    assert s["kld"]["max"] > 1e-6 and s["kld"]["mean"] > 0
    assert s["delta_p"]["rms"] > 1e-4 and s["ln_ppl_ratio"]["value"] != 0.0


def test_kl_floor_leaves_out_what_llama_cpp_does() -> None:
    """A reference entry at ln(1e-8) = -18.4 (below -16) is out of llama.cpp's KL sum; None keeps it."""
    p = [1 - 2e-8, 1e-8, 1e-8]
    q = [0.5, 0.25, 0.25]
    ref, port = np.log(np.array([p])), np.log(np.array([q]))
    floor = positions(ref, port, [0])
    assert KL_FLOOR == -16.0
    assert floor.kld[0] == pytest.approx(p[0] * math.log(p[0] / q[0]), rel=1e-12)
    assert positions(ref, port, [0], kl_floor=None).kld[0] == pytest.approx(_kl(p, q), rel=1e-12)
    assert floor.kld[0] != positions(ref, port, [0], kl_floor=None).kld[0]


def test_percentile_and_median_as_llama_cpp() -> None:
    v = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    assert percentile(v, 0.9) == pytest.approx(3.6)  # 0.9 * 4 = 3.6: 0.4 * 3 + 0.6 * 4
    assert percentile(v, 0.0) == 0.0 and percentile(v, 1.0) == 4.0 and percentile(v, 0.999) == pytest.approx(3.996)
    assert median(v) == 2.0 and median(np.array([1.0, 2.0, 4.0, 8.0])) == 3.0


def test_blocks_give_the_same_figures_as_one_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    import oracles.checks.kld as kld

    ref, port, toks, _ = _dataset()
    whole = positions(ref, port, toks)
    monkeypatch.setattr(kld, "BLOCK_ROWS", 5)
    blocked = kld.positions(ref, port, toks)
    for name in ("kld", "p_diff", "nll", "nll_base", "ref_top", "port_top"):
        assert np.array_equal(getattr(whole, name), getattr(blocked, name)), name


def test_receipt_arrays_are_24_bytes_a_position() -> None:
    ref, port, toks, _ = _dataset()
    arrays = positions(ref, port, toks).receipt_arrays()
    assert sum(a.nbytes for a in arrays.values()) == 24 * len(toks)


@pytest.mark.parametrize(("ref", "port", "toks", "message"), [
    (np.zeros((2, 3)), np.zeros((2, 4)), [0, 1], "shapes"),
    (np.zeros((2, 3)), np.zeros((2, 3)), [0], "shapes"),
    (np.zeros((2, 3)), np.zeros((2, 3)), [0, 3], r"tokens\[1\] = 3 is outside the vocabulary \[0, 3\)"),
    (np.array([[0.0, np.nan, 0.0]]), np.zeros((1, 3)), [0], "reference row 0 is not finite"),
    (np.zeros((1, 3)), np.array([[0.0, -np.inf, 0.0]]), [0], "port row 0 is not finite"),
])
def test_bad_input_one_line(ref: np.ndarray, port: np.ndarray, toks: list[int], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        positions(ref, port, toks)


def test_no_position_is_refused() -> None:
    with pytest.raises(ValueError, match="no scored position"):
        statistics(Positions.concat([positions(np.zeros((0, 3)), np.zeros((0, 3)), [])]))
