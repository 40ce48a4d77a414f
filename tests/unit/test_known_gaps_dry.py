"""A library's measured gap is expected (strict xfail) only on the pins it was measured on.

A user's pin can hide a library bug (an untrained model repeating one token gives equal tokens even
from a stale cache): a strict xfail there would XPASS and fail a correct run. Elsewhere the note is
only quoted as the likely cause of a failure.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oracles.engines.base import Engine
from oracles.engines.mlx.hybrid import KNOWN_GAPS
from oracles.engines.mlx.lm import MlxPort
from oracles.families.execution.runs import WINDOW_ORACLE

pytestmark = pytest.mark.dry


def _gap(pin: str, oracle: str = WINDOW_ORACLE, any_pin: bool = False) -> str | None:
    # known_gap reads only the engine's pin: no model is loaded for it
    return MlxPort.known_gap(SimpleNamespace(pin=pin), oracle, any_pin)  # type: ignore[arg-type]


def test_the_test_and_the_table_name_the_same_oracle() -> None:
    assert WINDOW_ORACLE in KNOWN_GAPS


def test_gap_is_expected_only_on_a_measured_pin() -> None:
    pins, note = KNOWN_GAPS[WINDOW_ORACLE]
    assert "smollm2-135m-instruct" in pins
    assert _gap("smollm2-135m-instruct") == note
    assert _gap("mymodel") is None


def test_gap_note_is_at_hand_for_any_pin_when_asked() -> None:
    assert _gap("mymodel", any_pin=True) == KNOWN_GAPS[WINDOW_ORACLE][1]
    assert _gap("mymodel", oracle="no such oracle", any_pin=True) is None


def test_engine_default_knows_no_gap() -> None:
    assert Engine.known_gap(SimpleNamespace(pin="smollm2-135m-instruct"), WINDOW_ORACLE, True) is None  # type: ignore[arg-type]
