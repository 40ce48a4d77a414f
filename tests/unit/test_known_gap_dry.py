"""The plugin expects an engine's measured library failures: its ``engine`` and ``port`` fixtures ask
``Engine.known_gap`` with the test's name and parameters, and a note makes the test a strict xfail
quoting it (so a fixed library fails the run until the note is removed). No engine is built here: a
stand-in answers ``known_gap`` and records what it was asked."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from oracles.plugin.fixtures import _expect_known_gap

pytestmark = pytest.mark.dry


class Gaps:
    """An engine stand-in: ``id``, ``pin`` and a ``known_gap`` answering from a table of test names."""

    id, pin = "my-port", "my-pin"

    def __init__(self, table: dict[str, str]) -> None:
        self.table, self.asked = table, list[str]()

    def known_gap(self, oracle: str, any_pin: bool = False) -> str | None:
        self.asked.append(oracle)
        return self.table.get(oracle)


def request_for(name: str) -> Any:
    marks: list[pytest.MarkDecorator] = []
    return SimpleNamespace(node=SimpleNamespace(name=name), applymarker=marks.append, marks=marks)


def test_a_measured_gap_is_a_strict_xfail_quoting_it() -> None:
    engine, request = Gaps({"test_decode[arith-my-pin-my-port]": "1.2e-2 from position 151"}), request_for(
        "test_decode[arith-my-pin-my-port]")
    _expect_known_gap(engine, request)  # type: ignore[arg-type]
    (mark,) = request.marks
    assert (mark.name, mark.kwargs) == ("xfail", {"strict": True, "reason": "my-port on my-pin: 1.2e-2 from position 151"})
    assert engine.asked == ["test_decode[arith-my-pin-my-port]"]


def test_no_gap_no_mark() -> None:
    """The positive control: another test's name (another record) is not expected to fail."""
    engine, request = Gaps({"test_decode[arith-my-pin-my-port]": "1.2e-2"}), request_for("test_decode[ping-my-pin-my-port]")
    _expect_known_gap(engine, request)  # type: ignore[arg-type]
    assert request.marks == [] and engine.asked == ["test_decode[ping-my-pin-my-port]"]
