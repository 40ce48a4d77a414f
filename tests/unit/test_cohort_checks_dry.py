"""oracles.checks.cohort (lane maps, bitwise lane comparison, the tally), the benchmark's statistics and
/proc readers, and the terminal table of benchmark sections."""

from __future__ import annotations

import numpy as np
import pytest

from oracles.checks.cohort import (
    Tally,
    check_lane_map,
    compare_bits,
    compare_cohort,
    compose,
    first_unequal,
    fixed_lanes,
    kind_of,
    layer_and_buffer,
    to_physical,
)
from oracles.families.cohort import bench
from oracles.receipts.report import format_benchmarks

pytestmark = pytest.mark.dry


def test_lane_maps() -> None:
    assert to_physical(["a", "b", "c", "d"], (2, 0, 3, 1)) == ["c", "a", "d", "b"]
    assert compose((2, 0, 3, 1), (2, 0, 3, 1)) == [3, 2, 1, 0]
    assert fixed_lanes((2, 0, 3, 1)) == [] and fixed_lanes((1, 0, 2)) == [2]
    for bad in ((0, 0, 1), (0, 1, 3)):
        with pytest.raises(ValueError, match=r"not a permutation of 0\.\.2"):
            check_lane_map(bad)


def test_names_and_kinds() -> None:
    assert layer_and_buffer("layers.12.recurrent_state.1") == (12, "recurrent_state.1")
    assert layer_and_buffer("logits") == (None, "logits")
    assert kind_of("layers.3.recurrent_state.1") == "recurrent_state" and kind_of("hidden") == "hidden"


def test_compare_bits_names_step_lanes_layer_buffer_index_and_both_values() -> None:
    a = np.zeros((1, 2, 3, 4), "<f4")
    b = a.copy()
    b[0, 1, 2, 0], b[0, 1, 2, 3] = np.float32(1e-7), np.float32(-2.0)
    assert compare_bits(a, a.copy(), step="5", logical=2, physical=0, name="layers.3.keys") is None
    m = compare_bits(a, b, step="5", logical=2, physical=0, name="layers.3.keys", sides=("serial", "cohort"))
    assert m is not None and m.count == 2 and m.total == 24 and m.first == (0, 1, 2, 0)
    assert m.values == (0.0, pytest.approx(1e-7)) and m.max_abs == 2.0
    text = m.describe()
    assert text.startswith("step 5, logical lane 2 (physical lane 0), layer 3 keys: 2 of 24 values differ in bits")
    assert "first at index [0, 1, 2, 0]: serial 0.0 vs cohort 1.0000000116860974e-07" in text


def test_compare_bits_sees_the_sign_of_zero_and_nan_payloads() -> None:
    pos, neg = np.zeros(3, "<f4"), -np.zeros(3, "<f4")
    m = compare_bits(pos, neg, step="0", logical=0, physical=0, name="hidden")
    assert m is not None and m.count == 3
    nan = np.array([np.nan], "<f4")
    assert compare_bits(nan, nan.copy(), step="0", logical=0, physical=0, name="hidden") is None


def test_compare_bits_shape_and_presence() -> None:
    a, b = np.zeros((1, 2, 5, 4), "<f4"), np.zeros((1, 2, 6, 4), "<f4")
    m = compare_bits(a, b, step="1", logical=0, physical=3, name="layers.0.values", sides=("serial", "cohort"))
    assert m is not None and "shape [1, 2, 5, 4] (serial) vs [1, 2, 6, 4] (cohort)" in m.describe()
    m = compare_bits(None, a, step="1", logical=0, physical=3, name="layers.0.conv_state")
    assert m is not None and "layer 0 conv_state: missing on the expected side" in m.describe()


def test_compare_cohort_unpermutes_and_can_stop_at_the_first() -> None:
    lanes = [{"hidden": np.full(4, q, "<f4"), "logits": np.full(3, -q, "<f4")} for q in range(4)]
    cohort = to_physical(lanes, (2, 0, 3, 1))
    assert compare_cohort(lanes, cohort, (2, 0, 3, 1), step="0") == []
    wrong = compare_cohort(lanes, cohort, (0, 1, 2, 3), step="0")
    assert {(m.logical, m.physical) for m in wrong} == {(0, 0), (1, 1), (2, 2), (3, 3)}
    assert len(wrong) == 8  # hidden and logits of every lane
    assert len(compare_cohort(lanes, cohort, (0, 1, 2, 3), step="0", stop_at_first=True)) == 4


def test_tally_keeps_counts_figures_and_the_first_mismatches() -> None:
    t = Tally(keep=1)
    a = np.zeros(4, "<f4")
    for s in range(3):
        b = a.copy()
        b[s] = np.float32(s + 1)
        m = compare_bits(a, b, step=str(s), logical=1, physical=3, name="logits")
        t.add([m] if m else [], comparisons=4, names=["hidden", "logits"])
    assert t.steps == 3 and t.comparisons == 12 and t.lane_count(1) == 3 and t.lane_count(0) == 0
    assert t.max_abs_by_kind() == {"hidden": 0.0, "logits": 3.0}
    assert [m.step for m in t.lane_mismatches(1)] == ["0"]
    assert "logical lane 1: 3 mismatching (step, quantity) comparisons over 3 steps" in t.report(1, "x")


def test_first_unequal() -> None:
    assert first_unequal({"a": "1", "b": "2"}, {"a": "1", "b": "2"}) is None
    assert first_unequal({"a": "1", "b": "2"}, {"a": "1", "b": "3"}) == "b"
    assert first_unequal({"a": "1"}, {"a": "1", "c": "4"}) == "c"


def test_summary_statistics() -> None:
    out = bench._summary([10.0, 12.0, 10.0, 14.0], [5.0, 4.0, 5.0, 7.0])
    assert out["serial_median_ms"] == 11.0 and out["cohort_median_ms"] == 5.0 and out["speedup"] == 2.2
    assert out["paired_deltas_ms"] == [5.0, 8.0, 5.0, 7.0]
    assert out["even_speedup"] == 10.0 / 5.0 and out["odd_speedup"] == 13.0 / 5.5
    assert out["paired_ratio_iqr"][0] <= out["paired_ratio_median"] <= out["paired_ratio_iqr"][1]


def test_proc_readers() -> None:
    vm, mem = bench.vm_counters(), bench.process_memory()
    if vm is None:
        pytest.skip("no /proc here (not Linux)")
    assert set(vm) == {"pswpin", "pswpout", "pgmajfault", "process_majflt"} and all(v >= 0 for v in vm.values())
    assert mem is not None and mem["VmRSS"] > 0 and mem["VmHWM"] >= mem["VmRSS"]


def test_benchmark_table() -> None:
    section = {"pin": "p", "engine": "torch", "threads": 1, "pairs": 20, "vm_window": {"disturbed": False},
               "paired": {"serial_median_ms": 12.5, "cohort_median_ms": 5.0, "speedup": 2.5,
                          "paired_ratio_iqr": [2.25, 2.75]},
               "conditioned": {"speedup": 2.4, "even_speedup": 2.3, "odd_speedup": 2.5}}
    lines = format_benchmarks([{"data": {"cohort_benchmark": section}}, {"data": {}}])
    assert len(lines) == 3 and "20 alternating pairs" in lines[0]
    assert lines[2].split() == ["p", "torch", "1", "12.50", "5.00", "2.500x", "2.250-2.750", "2.400x", "2.300/2.500",
                                "no"]
    assert format_benchmarks([{"data": {}}]) == []
