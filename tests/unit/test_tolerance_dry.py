"""Tolerances as one object (oracles/checks/tolerance.py): the float32 values the checks applied before
there was a seam, the seam used by every pure check, and no bound written anywhere else."""

from __future__ import annotations

import ast
import dataclasses
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cohort_fake import FakeEngine

from oracles.checks.bisect import budget, noise_floor, sublayer_budget
from oracles.checks.cache import cache_failure
from oracles.checks.cohort import serial_gap_failure
from oracles.checks.port import port_figures, readout_failures, readout_figures, threshold_failures
from oracles.checks.tolerance import FLOAT32, Tolerance
from oracles.engines.base import Step
from oracles.faults.matrix import forward_port

pytestmark = pytest.mark.dry

ORACLES = Path(__file__).resolve().parents[2] / "oracles"

#: Every bound as the suite, the checks and the fault matrix applied it when each was a module constant.
TODAY = {
    "max_abs_logit": 5e-3, "max_nmse": 1e-6, "max_kl": 1.25e-5, "near_tie": 1e-2, "max_abs_dp": 2.5e-3,
    "key_margin": 5e-3, "pixel_atol": 3e-7, "head_rerun_atol": 1e-5, "vision_head_rerun_atol": 1e-6,
    "logz_f64_atol": 1e-5, "prob_sum_atol": 1e-12, "tree_row_dp": 1e-4, "cache_atol": 2e-3, "cache_nmse": 1e-6,
    "cohort_atol": 1e-3, "self_draft_acceptance": 0.9, "bisect_floor_at_0": 5e-12, "bisect_floor_per_layer": 1e-12,
    "bisect_margin": 1000.0, "bisect_sublayer_floor": 1.5e-10, "readout_near_tie": 0.02, "red_arm_min": 0.02,
}


def test_float32_holds_the_bounds_the_checks_applied() -> None:
    got = {f.name: getattr(FLOAT32, f.name) for f in dataclasses.fields(FLOAT32) if f.name != "name"}
    assert got == TODAY and FLOAT32.name == "float32"


def test_every_bound_is_described_and_derived() -> None:
    """Each field is named in the class docstring (what it bounds) and has its derivation as a comment
    directly above its value in FLOAT32."""
    lines = (ORACLES / "checks" / "tolerance.py").read_text().splitlines()
    doc = Tolerance.__doc__ or ""
    for name in TODAY:
        assert f"``{name}``" in doc, f"Tolerance's docstring does not say what {name} bounds"
        at = next(i for i, line in enumerate(lines) if line.strip().startswith(f"{name}="))
        above = lines[at - 1].strip()  # its comment, or the bound it shares one with (the bisect floors)
        assert above.startswith(("#", *(f"{n}=" for n in TODAY))), f"FLOAT32.{name} has no derivation (line {at + 1})"


@pytest.mark.parametrize("value", [-1e-6, math.nan, math.inf, True, "1e-6"])
def test_a_bound_that_cannot_bound_is_refused_naming_the_field(value: Any) -> None:
    with pytest.raises(ValueError) as err:
        dataclasses.replace(FLOAT32, name="bad", max_nmse=value)
    assert str(err.value).startswith("Tolerance 'bad': field 'max_nmse' is ") and "\n" not in str(err.value)


def test_engine_answers_float32_by_default() -> None:
    assert FakeEngine().tolerance() is FLOAT32


# -- the seam: every pure check applies the tolerance it is given -------------------------------------------

TIGHT = dataclasses.replace(FLOAT32, name="tight", max_abs_logit=1e-6, max_nmse=1e-15, max_kl=1e-15, near_tie=1e-9,
                            max_abs_dp=1e-9, key_margin=0.0, cache_atol=1e-7, cache_nmse=1e-16, cohort_atol=1e-7,
                            bisect_margin=1.0)


def _noisy(shape: tuple[int, ...], scale: float) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(shape).astype("<f4") * 5
    return ref, (ref + np.float32(scale) * rng.standard_normal(shape).astype("<f4")).astype("<f4")


def test_port_thresholds_follow_the_tolerance() -> None:
    """A port inside the float32 bounds (max |Δlogit| ~1e-4) fails a tighter tolerance, on each bound."""
    ref, port = _noisy((4, 64), 3e-5)
    fig = port_figures(ref, port)
    assert threshold_failures(fig) == [] and threshold_failures(fig, tolerance=FLOAT32) == []
    tight = threshold_failures(fig, tolerance=TIGHT)
    assert [line.split(" ")[0] for line in tight] == ["max", "NMSE", "KL(ref‖port)"], tight
    assert "> 1e-06 at (row, token)" in tight[0]


def test_readout_thresholds_follow_the_tolerance() -> None:
    fig = readout_figures(["A", "B"], [0.6, 0.4], [0.4001, 0.5999])  # the answer flips on a gap of 0.2
    assert readout_failures(fig, tolerance=dataclasses.replace(FLOAT32, max_abs_dp=0.3, key_margin=0.3)) == []
    assert [line.split(" ")[0] for line in readout_failures(fig)] == ["max", "answer"]


def test_cache_and_cohort_bounds_follow_the_tolerance() -> None:
    cold, cached = _noisy((64,), 1e-5)
    assert cache_failure("row", cached, cold) is None
    assert "differ by more than 1e-07" in str(cache_failure("row", cached, cold, tolerance=TIGHT))
    serial, cohort = _noisy((3, 64), 1e-5)
    assert serial_gap_failure("lane0", serial, cohort) is None
    assert "over 1e-07 at 3 of 3 steps" in str(serial_gap_failure("lane0", serial, cohort, tolerance=TIGHT))


def test_bisect_budgets_follow_the_tolerance() -> None:
    assert budget(30) == pytest.approx(3.5e-8) and sublayer_budget() == pytest.approx(1.5e-7)
    assert budget(30, tolerance=TIGHT) == noise_floor(30, tolerance=TIGHT) == pytest.approx(3.5e-11)
    assert sublayer_budget(tolerance=TIGHT) == pytest.approx(1.5e-10)


def test_fault_matrix_holds_a_port_to_its_tolerance() -> None:
    ref, port = _noisy((31, 64), 3e-5)
    hidden = np.zeros((31, 4), "<f4")
    assert forward_port(Step(ref, hidden), Step(port, hidden)) is None
    assert str(forward_port(Step(ref, hidden), Step(port, hidden), tolerance=TIGHT)).startswith(
        "ping: prefill logits [row, token]: max |Δlogit|")


# -- one place: no bound written outside oracles/checks/tolerance.py -----------------------------------------

#: Where a family, a check, the fault matrix, compare or bisect applies a bound.
APPLIERS = sorted({*ORACLES.glob("suite/*.py"), *ORACLES.glob("checks/*.py"), *ORACLES.glob("families/**/*.py"),
                   ORACLES / "faults" / "matrix.py", ORACLES / "receipts" / "compare.py",
                   ORACLES / "commands" / "compare.py", ORACLES / "commands" / "bisect.py"}
                  - {ORACLES / "checks" / "tolerance.py"})


def _number(node: ast.AST) -> bool:
    """A float literal, or arithmetic of literals (``2 * 5e-3``)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, float)
    if isinstance(node, ast.BinOp):
        return _number(node.left) or _number(node.right)
    if isinstance(node, ast.UnaryOp):
        return _number(node.operand)
    return False


#: The comparisons a bound is applied with (an equality with an expected value is not a bound).
ORDER = (ast.Lt, ast.LtE, ast.Gt, ast.GtE)


def _bounds_written(where: str, source: str) -> list[str]:
    """``where:line`` of each float literal an ordering comparison, an ``atol=`` or ``assert_within``'s
    tolerance argument holds in ``source``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        held: list[ast.AST] = []
        if isinstance(node, ast.Compare) and any(isinstance(op, ORDER) for op in node.ops):
            held = [node.left, *node.comparators]
        elif isinstance(node, ast.Call):
            held = [k.value for k in node.keywords if k.arg in ("atol", "tolerance", "limit")]
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name == "assert_within" and len(node.args) > 2:
                held.append(node.args[2])
        out += [f"{where}:{getattr(node, 'lineno', '?')}" for h in held if _number(h)]
    return out


def test_no_bound_is_written_outside_the_tolerance() -> None:
    assert len(APPLIERS) > 40, APPLIERS
    written = [w for path in APPLIERS for w in _bounds_written(str(path.relative_to(ORACLES.parent)), path.read_text())]
    assert not written, f"bounds written outside oracles/checks/tolerance.py (use the engine's tolerance): {written}"


def test_the_guard_sees_a_written_bound() -> None:
    """Positive control: each shape of a written bound is found, and a bound read from a tolerance is not."""
    source = ("assert a < 1e-12\nassert_within(a, b, 1e-5, 'x')\ndiff(a, b, atol=2 * 5e-3)\nok = rate >= 0.9\n"
              "ok = rate >= engine.tolerance().self_draft_acceptance\nassert figure == 5.0\n")
    assert _bounds_written("probe.py", source) == ["probe.py:1", "probe.py:2", "probe.py:3", "probe.py:4"]
