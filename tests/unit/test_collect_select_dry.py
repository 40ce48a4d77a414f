""":func:`oracles.plugin.collect.can_select`: whether a ``-m`` expression can be true for a test with
some marks, whatever marks its parameters or the plugin may add. pytest's own ``Expression`` parses and
evaluates; these pin down the search over the marks that may be added (absent and present, with any
arguments), which is what lets ``-m`` skip the parametrization of a test it will deselect."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from _pytest.mark.expression import Expression

from oracles.plugin.collect import MISSING, PLUGIN_MARKS, _parametrize_marks, can_select

pytestmark = pytest.mark.dry

SLOW_MTPLX = [pytest.mark.mtplx.mark, pytest.mark.slow.mark]


def select(expr: str, marks: list[pytest.Mark], free: frozenset[str] = PLUGIN_MARKS) -> bool:
    return can_select(Expression.compile(expr), marks, free)


def test_plugin_marks_are_those_it_attaches() -> None:
    assert PLUGIN_MARKS == {"skip", "xdist_group", MISSING}


@pytest.mark.parametrize("expr, marks, expected", [
    ("dry", SLOW_MTPLX, False),  # what `pytest -m dry` skips expanding: the slow suite
    ("dry", [pytest.mark.dry.mark], True),
    ("not slow", SLOW_MTPLX, False),
    ("not slow", [pytest.mark.mtplx.mark], True),
    ("dry and mtplx", [pytest.mark.mtplx.mark], False),
    ("dry and mtplx", [pytest.mark.dry.mark, pytest.mark.mtplx.mark], True),
    ("port", [pytest.mark.port.mark, pytest.mark.slow.mark], True),
    ("port", SLOW_MTPLX, False),
    ("mtplx or port", SLOW_MTPLX, True),
], ids=lambda v: v if isinstance(v, str) else None)
def test_static_marks_decide_without_free_ones(expr: str, marks: list[pytest.Mark], expected: bool) -> None:
    assert select(expr, marks) is expected


def test_a_mark_that_may_be_added_counts_present() -> None:
    """``skip`` may come from the plugin (a slow test without --runslow): ``-m skip`` can select."""
    assert select("skip", SLOW_MTPLX) is True
    assert select("skip", SLOW_MTPLX, frozenset()) is False  # the control: not free, not there


def test_a_mark_that_may_be_added_counts_absent_too() -> None:
    """``not skip`` is not monotone: a test that may get ``skip`` may also not get it."""
    assert select("not skip", SLOW_MTPLX) is True
    assert select("not xdist_group and not skip and slow", SLOW_MTPLX) is True


def test_a_mark_held_is_never_taken_away() -> None:
    assert select("not slow", SLOW_MTPLX) is False
    assert select("skip and not skip", SLOW_MTPLX) is False  # no assignment satisfies it


def test_each_argument_query_of_a_free_mark_is_its_own_unknown() -> None:
    """An added ``skip`` may carry any reason: ``skip(reason="x")`` and ``not skip(reason="y")`` together."""
    held = [pytest.mark.skip(reason="y").mark]
    assert select('skip(reason="x")', held) is True
    assert select('skip(reason="x")', held, frozenset()) is False  # pytest's own matcher: reason y is not x
    assert select('skip(reason="y")', held, frozenset()) is True


def test_parameter_set_marks_are_read_and_an_iterator_is_not() -> None:
    """``pytest.param(..., marks=...)`` in a parametrize mark may add its marks; an iterator's parameter
    sets cannot be read without using them up, so such a test is never judged (None)."""
    listed = pytest.mark.parametrize("x", [1, pytest.param(2, marks=pytest.mark.dry)]).mark
    assert _parametrize_marks([listed]) == {"dry"}

    def values() -> Iterator[int]:
        yield 1

    one_shot = pytest.mark.parametrize("x", values()).mark
    assert _parametrize_marks([listed, one_shot]) is None
    assert _parametrize_marks([pytest.mark.parametrize(argnames="x", argvalues=(3, 4)).mark]) == set()
