"""oracles.checks.cache (cached vs cold logits) and oracles.checks.cohort.serial_gap_failure: the bounds
the suite's self-consistency tests and the fault panel share.

The case that made the NMSE bound: an untrained pin's logits are small (std ~0.16), and a decode
position off by one moved them by ~1e-3, inside the 2e-3 absolute bound.
"""

from __future__ import annotations

import numpy as np
import pytest

from oracles.checks.cache import cache_failure, cache_figures
from oracles.checks.cohort import serial_gap_failure
from oracles.checks.tolerance import FLOAT32
from oracles.faults.matrix import decode_recompute

CACHE_ATOL, CACHE_NMSE, COHORT_ATOL = FLOAT32.cache_atol, FLOAT32.cache_nmse, FLOAT32.cohort_atol

pytestmark = pytest.mark.dry

V = 4096


def _small_logits(seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(V) * 0.16).astype(np.float32)


def test_float32_reordering_noise_passes() -> None:
    cold = _small_logits() * 200  # SmolLM2-sized logits, std ~30
    cached = cold + np.float32(1e-4) * np.sign(np.random.default_rng(1).standard_normal(V)).astype(np.float32)
    assert cache_failure("step 3", cached, cold) is None
    fig = cache_figures(cached, cold)
    assert fig["argmax_agree"] and not fig["bit_equal"] and fig["max_abs"] < CACHE_ATOL and fig["nmse"] < CACHE_NMSE


def test_small_logits_moved_inside_the_absolute_bound_fail_by_nmse() -> None:
    cold = _small_logits()
    cached = cold + (np.random.default_rng(2).standard_normal(V) * 3e-4).astype(np.float32)
    fig = cache_figures(cached, cold)
    assert fig["max_abs"] < CACHE_ATOL < 10 * fig["max_abs"], fig  # inside the absolute bound, as measured
    msg = cache_failure("step 3 (prefix 40 tokens)", cached, cold)
    assert msg is not None and msg.startswith("step 3 (prefix 40 tokens): NMSE ") and "> 1e-06" in msg, msg
    assert "differ by more than" not in msg  # the absolute bound held: only the NMSE is named


def test_large_logits_over_the_absolute_bound_name_the_first_index() -> None:
    cold = _small_logits() * 200
    cached = cold.copy()
    cached[17] += np.float32(0.5)
    msg = cache_failure("turn 2 (88 ids), warm", cached, cold)
    assert msg is not None and "1 of 4096 values differ by more than 0.002" in msg and "first at index [17]" in msg, msg


def test_argmax_moved_is_named() -> None:
    cold = np.zeros(V, dtype=np.float32)
    cold[5], cold[9] = 1.0, 1.0 - 1e-7
    cached = cold.copy()
    cached[9] = 1.0 + 1e-7
    msg = cache_failure("step 0", cached, cold)
    assert msg is not None and msg.endswith("argmax cached 9 vs cold 5"), msg


def test_shapes_differ_is_an_error() -> None:
    with pytest.raises(ValueError, match="shapes differ"):
        cache_failure("step 0", np.zeros(3, np.float32), np.zeros(4, np.float32))


class _Run:
    def __init__(self, step_logits: np.ndarray, recomputed: dict[int, np.ndarray]) -> None:
        self.step_logits, self.recomputed, self.prompt = step_logits, recomputed, [1, 2, 3]


def test_the_panel_holds_the_port_to_the_suites_cache_check() -> None:
    """The detection matrix's decode:recompute cell fails exactly where the suite's check fails."""
    cold = _small_logits()
    moved = cold + (np.random.default_rng(2).standard_normal(V) * 3e-4).astype(np.float32)
    steps = np.stack([cold, cold])
    assert decode_recompute(None, _Run(steps, {0: cold, 1: cold})) is None  # type: ignore[arg-type]
    msg = decode_recompute(None, _Run(steps, {0: cold, 1: moved}))  # type: ignore[arg-type]
    assert msg == "arith: decode step 1 (prefix 4 ids): " + (cache_failure("x", cold, moved) or "")[len("x: "):]


def test_serial_gap_holds_within_the_bound_and_names_the_first_step_over() -> None:
    serial = np.stack([_small_logits(s) * 200 for s in range(6)])
    assert serial_gap_failure("lane0", serial, serial + np.float32(COHORT_ATOL / 2)) is None
    cohort = serial.copy()
    cohort[3, 7] += 0.01
    cohort[5, 2] += 0.02
    msg = serial_gap_failure("lane0", serial, cohort)
    assert msg is not None and "at 2 of 6 steps, first step 3 (1.000e-02), worst step 5 (2.000e-02)" in msg, msg


def test_serial_gap_names_a_moved_argmax_and_a_nan() -> None:
    serial = np.zeros((4, 8), dtype=np.float32)
    serial[:, 1], serial[:, 3] = 1.0, 1.0 - COHORT_ATOL / 4  # a near tie
    cohort = serial.copy()
    cohort[2, 3] = 1.0 + COHORT_ATOL / 4  # moved by half the bound, past the tie: the argmax moves
    assert serial_gap_failure("lane1", serial, cohort) == "lane1: argmax differs at 1 of 4 steps, first step 2"
    cohort[1, 0] = np.nan
    msg = serial_gap_failure("lane1", serial, cohort)
    assert msg is not None and "first step 1 (nan)" in msg, msg
