"""The band a reduced-precision port is held to (oracles.checks.judgment), and the judge's messages."""

from __future__ import annotations

import pytest

from oracles.checks.judgment import BAND_RATIO, Judgment, band_tolerance
from oracles.checks.port import threshold_failures
from oracles.checks.tolerance import FLOAT32
from oracles.families.execution.judged import Judge, teacher_forced

pytestmark = [pytest.mark.dry]

BAND = {"max_abs": 0.5, "nmse": 1e-4, "kl_max": 2e-3}


def _fig(max_abs: float, nmse: float, kl_max: float) -> dict:
    return {"max_abs": max_abs, "max_abs_at": [0, 0], "nmse": nmse, "kl_max": kl_max, "kl_argmax_row": 0,
            "disagreements": []}


def test_band_bounds_are_the_ratio_of_the_band() -> None:
    t = band_tolerance(FLOAT32, BAND, ratio=3.0)
    # worked by hand: 3 x 0.5, 9 x 1e-4, 9 x 2e-3, near tie 2 x 1.5, max |dp| 1.5 / 2
    assert (t.max_abs_logit, t.max_nmse, t.max_kl, t.near_tie, t.max_abs_dp) == pytest.approx((1.5, 9e-4, 1.8e-2, 3.0, 0.75))
    assert t.name == "band x3" and t.cache_atol == FLOAT32.cache_atol  # the engine's own checks keep float32's


def test_a_port_inside_the_band_passes_and_one_past_it_fails() -> None:
    t = band_tolerance(FLOAT32, BAND)
    inside = _fig(BAND_RATIO * 0.5 * 0.9, 1e-4, 2e-3)
    outside = _fig(BAND_RATIO * 0.5 * 1.1, 1e-4, 2e-3)
    assert threshold_failures(inside, tolerance=t) == []
    assert threshold_failures(outside, tolerance=t) and threshold_failures(inside, tolerance=FLOAT32)


def test_band_figures_missing_is_named() -> None:
    with pytest.raises(ValueError, match="'nmse' is missing"):
        band_tolerance(FLOAT32, {"max_abs": 1.0, "kl_max": 1.0})


def test_band_bisect_floor_when_measured() -> None:
    t = band_tolerance(FLOAT32, {**BAND, "stage_nmse_max": 4e-6}, ratio=2.0)
    assert (t.bisect_floor_at_0, t.bisect_floor_per_layer, t.bisect_margin) == (4e-6, 0.0, 4.0)


def test_the_judge_names_band_and_translations() -> None:
    exact = Judge(Judgment("exact", "same weights"), FLOAT32)
    band = Judge(Judgment("band", "bf16", dtype="bfloat16"), FLOAT32, band=lambda: None,  # type: ignore[arg-type,return-value]
                 translations=("rope_theta 100000.0 from rope_parameters (mlx-lm reads 10000.0)",))
    assert exact.label("ping: logits") == "ping: logits"
    assert band.label("ping: logits") == ("ping: logits [judged by the bfloat16 band, port loaded with rope_theta "
                                          "100000.0 from rope_parameters (mlx-lm reads 10000.0)]")
    assert exact.bounds(lambda k, f: f(), "k", None, lambda e: None) == (FLOAT32, None)


class _Rows:
    """An engine whose forward records what it was fed and returns one row per kept position."""

    def __init__(self) -> None:
        self.fed: list[int] = []

    def forward(self, ids: list[int], keep: int = 0) -> object:
        import numpy as np

        self.fed = list(ids)
        return type("S", (), {"logits": np.zeros((keep, 3), "<f4")})()


def test_teacher_forced_feeds_the_prompt_and_all_but_the_last_token() -> None:
    engine = _Rows()
    rows = teacher_forced(engine, [1, 2], [7, 8, 9], 2)  # type: ignore[arg-type]
    assert engine.fed == [1, 2, 7] and rows.shape == (2, 3)
    with pytest.raises(ValueError, match="rows 4"):
        teacher_forced(engine, [1], [7, 8, 9], 4)  # type: ignore[arg-type]
