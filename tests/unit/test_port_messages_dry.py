"""Threshold failure messages of ``oracles.checks.port``: a value just over a threshold never prints as
equal to it."""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from oracles.checks.port import compared, readout_failures, threshold_failures
from oracles.checks.tolerance import FLOAT32

KEY_MARGIN, MAX_ABS_DP, MAX_ABS_LOGIT = FLOAT32.key_margin, FLOAT32.max_abs_dp, FLOAT32.max_abs_logit
MAX_KL, MAX_NMSE, NEAR_TIE = FLOAT32.max_kl, FLOAT32.max_nmse, FLOAT32.near_tie

pytestmark = pytest.mark.dry


def within() -> dict[str, Any]:
    """Figures inside every logit threshold (what :func:`port_figures` returns for a faithful port)."""
    return {"max_abs": 1e-4, "max_abs_at": [0, 0], "nmse": 1e-9, "kl_max": 1e-10, "kl_argmax_row": 0,
            "disagreements": []}


def readout_within() -> dict[str, Any]:
    return {"max_abs_dp": 1e-6, "max_abs_dp_key": "A", "key_equal": True, "ref_key": "A", "port_key": "A",
            "ref_top2_gap": 0.5}


def pair(message: str, op: str) -> tuple[str, str]:
    """The value and threshold text around `` op `` in a failure message."""
    match = re.search(rf"(\S+) {re.escape(op)} (\S+)", message)
    assert match, message
    return match.group(1), match.group(2)


def test_nmse_just_over_its_threshold_shows_the_difference() -> None:
    """The trial's case: NMSE 1.0003e-06 printed as ``1.000e-06 > 1e-06``, which reads as a tie."""
    fig = {**within(), "nmse": 1.0003e-06}
    assert threshold_failures(fig) == ["NMSE 1.0003e-06 > 1e-06"]


def over(limit: float, ulps: int) -> float:
    value = limit
    for _ in range(ulps):
        value = math.nextafter(value, math.inf)
    return value


@pytest.mark.parametrize("ulps", [1, 1000])
@pytest.mark.parametrize(("name", "limit", "op", "fig"), [
    ("max |Δlogit|", MAX_ABS_LOGIT, ">", lambda v: {**within(), "max_abs": v}),
    ("NMSE", MAX_NMSE, ">", lambda v: {**within(), "nmse": v}),
    ("KL", MAX_KL, ">", lambda v: {**within(), "kl_max": v}),
    ("argmax", NEAR_TIE, ">=", lambda v: {**within(), "disagreements": [{"row": 0, "ref": 1, "port": 2, "ref_top2_gap": v}]}),
    ("max |Δp|", MAX_ABS_DP, ">", lambda v: {**readout_within(), "max_abs_dp": v}),
    ("answer", KEY_MARGIN, ">", lambda v: {**readout_within(), "key_equal": False, "port_key": "B", "ref_top2_gap": v}),
])
def test_every_threshold_message_shows_a_value_just_over_as_over(name: str, limit: float, op: str, fig: Any,
                                                                  ulps: int) -> None:
    """Each threshold message, for a value 1 and 1000 float64 ULPs over its threshold: the printed value
    reads back as greater than the printed threshold, and the threshold prints as the module states it."""
    figures = fig(over(limit, ulps))
    failures = threshold_failures(figures) if "max_abs" in figures else readout_failures(figures)
    assert len(failures) == 1 and failures[0].startswith(name), failures
    value_text, limit_text = pair(failures[0], op)
    assert float(limit_text) == limit and limit_text == f"{limit:g}"
    assert float(value_text) > float(limit_text), failures[0]


@pytest.mark.parametrize(("value", "limit", "text"), [
    (9.96, MAX_ABS_LOGIT, "9.960e+00 > 0.005"),  # a clear failure keeps its short form
    (3.116e-02, MAX_ABS_LOGIT, "3.116e-02 > 0.005"),
    (1.0003e-06, MAX_NMSE, "1.0003e-06 > 1e-06"),
    (1.25001e-05, MAX_KL, "1.25001e-05 > 1.25e-05"),
    (0.3000000000000001, 0.1 + 0.2, "3.000000000000001e-01 > 0.30000000000000004"),  # a threshold :g would round
])
def test_compared(value: float, limit: float, text: str) -> None:
    assert compared(value, ">", limit) == text


def test_compared_shows_an_exact_tie_as_equal() -> None:
    """``>=`` fails on a tie: then the two numbers are equal, and read so."""
    assert compared(NEAR_TIE, ">=", NEAR_TIE) == "1.000e-02 >= 0.01"
