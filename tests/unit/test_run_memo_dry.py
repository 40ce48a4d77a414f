"""oracles.plugin.memo.RunMemo: a run made once per key while its group runs, dropped when another begins (dry)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oracles.plugin.memo import RunMemo, group_of

pytestmark = pytest.mark.dry


def counting() -> tuple[list[str], RunMemo]:
    made: list[str] = []
    return made, RunMemo()


def test_a_run_is_made_once_within_its_group() -> None:
    made, memo = counting()
    memo.enter("d1:pin:fact_water")
    def make() -> int:
        made.append("k")
        return len(made)

    for _ in range(3):
        assert memo("k", make) == 1
    assert made == ["k"] and memo.dropped == 0


def test_another_group_drops_the_runs_and_makes_them_again() -> None:
    made, memo = counting()
    memo.enter("a")
    memo("k", lambda: made.append("k"))
    memo.enter("a")
    memo("k", lambda: made.append("k"))
    assert made == ["k"], "re-entering the same group dropped its run"
    memo.enter("b")
    assert memo.dropped == 1 and not memo.made
    memo("k", lambda: made.append("k"))
    assert made == ["k", "k"]


def test_without_a_group_nothing_is_dropped() -> None:
    """A serial run (no xdist) or a test of no family: the memo keeps everything for the session."""
    made, memo = counting()
    memo.enter("a")
    memo("k", lambda: made.append("k"))
    memo.enter(None)
    memo("k", lambda: made.append("k"))
    assert made == ["k"] and memo.dropped == 0 and memo.group == "a"


def test_an_exception_is_raised_again_without_running_twice() -> None:
    calls: list[int] = []

    def boom() -> None:
        calls.append(1)
        raise ValueError("no")

    memo = RunMemo()
    for _ in range(2):
        with pytest.raises(ValueError, match="no"):
            memo("k", boom)
    assert calls == [1]


def _item(group: str | None) -> pytest.Item:
    marks = [pytest.mark.xdist_group(group).mark] if group else []
    return SimpleNamespace(get_closest_marker=lambda name: next((m for m in marks if m.name == name), None))  # type: ignore[return-value]


def _config(worker: bool, dist: str) -> pytest.Config:
    """A config as xdist makes it: a worker's own ``dist`` option reads ``no``; what the controller ran with
    arrives in ``workerinput`` (the plugin's ``pytest_configure_node``)."""
    fake = SimpleNamespace(getoption=lambda name, default=None: "no" if name == "dist" else default)
    if worker:
        fake.workerinput = {"workerid": "gw0", "oracles": {"loadgroup": dist == "loadgroup"}}
    return fake  # type: ignore[return-value]


@pytest.mark.parametrize(("worker", "dist", "want"), [
    (True, "loadgroup", "d1:pin:fact_water"),
    (False, "no", None),          # a serial run: xdist installed marks the groups, its tests interleave them
    (False, "loadgroup", None),   # the controller runs no test
    (True, "load", None),         # a worker whose groups are not kept together
])
def test_runs_are_dropped_by_group_only_in_a_loadgroup_worker(worker: bool, dist: str, want: str | None) -> None:
    assert group_of(_item("d1:pin:fact_water"), _config(worker, dist)) == want


def test_a_test_of_no_group_has_none() -> None:
    assert group_of(_item(None), _config(True, "loadgroup")) is None
