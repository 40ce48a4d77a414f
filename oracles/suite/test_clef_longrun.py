"""A long clef run stops at ``--deadline`` and ``--resume`` continues it without redoing finished rows.

Two in-process sessions (``pytest.main``) of ``test_clef.py`` on the reference (``--port none``, the
rows of two records): the first with ``--deadline``, cut after its first row's tests by a helper plugin
that waits out the deadline there (so the cut does not depend on how fast this machine is); the second
with ``--resume=`` the first's receipt. In process, so torch is imported once (the reference is loaded
before the clock runs) and each session costs the twin's load (~0.2 s) and its rows. Not ``pytester``:
it removes every module imported during the test at teardown, and torch does not survive being
imported a second time in one process.

Proved: the first session exits 2 (interrupted) with the first row's tests passed and the rest listed
as not run; the second carries those over as resumed and runs every other test; no test of the second
session computed the first row's run again (each test records ``run_made``: whether its call made the
row's forward or read the session memo), and each unfinished row's run was made exactly once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from oracles.plugin.fixtures import Engines
from oracles.plugin.state import state_of
from oracles.receipts.table import FAILING

pytestmark = [pytest.mark.clef, pytest.mark.slow]

SUITE = Path(__file__).resolve().parent / "test_clef.py"
SUBSET = "txt_count or img_word"
#: Seconds after session start when the first session stops starting tests. In process the first row
#: (pin check, twin load, nine tests) was done 0.53 s after session start here; 3 s leaves ~6x for a
#: loaded machine, and the helper plugin sleeps out the rest after that row.
DEADLINE = 3.0

class CutAfterFirstRow:
    """Waits out the deadline after the first row's last test, so the next test does not start."""

    def __init__(self) -> None:
        self.cut_at: float | None = None  # seconds after session start when the first row was done

    @staticmethod
    def _row(item: pytest.Item) -> str | None:
        params = getattr(getattr(item, "callspec", None), "params", {})
        return params["row"].label if "row" in params else None

    @pytest.hookimpl(trylast=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: pytest.Item | None) -> None:
        first = self._row(item.session.items[0])
        if self.cut_at is not None or self._row(item) != first or (nextitem is not None and self._row(nextitem) == first):
            return
        state = state_of(item.config)
        self.cut_at = time.time() - state.started_wall
        time.sleep(max(0.0, (state.deadline or 0.0) - self.cut_at) + 0.05)


def _receipt(folder: Path) -> dict[str, Any]:
    (path,) = sorted(folder.rglob("*.json"))
    return json.loads(path.read_text())


def _row_of(t: dict[str, Any]) -> str | None:
    return (t.get("data") or {}).get("row")


def test_deadline_then_resume(pin: str, verified_snapshot: Callable[[str], Path], engines: Engines,
                              pytestconfig: pytest.Config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """On each clef pin (a ``pin`` parameter: the same xdist group, so the same loaded reference, as
    ``test_clef.py``)."""
    reference = pytestconfig.getoption("reference")
    root = verified_snapshot(pin)
    engines(reference, pin)  # torch imported in this process before the clock runs
    monkeypatch.chdir(tmp_path)
    common = [str(SUITE), "--runslow", "--port", "none", "--pin", pin, "-k", SUBSET, "--oracle-threads", "1", "-q",
              "-p", "no:cacheprovider", "--reference", reference, f"--snapshot={pin}={root}"]
    cut = CutAfterFirstRow()
    start = time.perf_counter()
    status = pytest.main([*common, "--deadline", str(DEADLINE), "--receipts-dir=one"], plugins=[cut])
    print(f"first session: {time.perf_counter() - start:.2f} s, first row done at {cut.cut_at} s")
    assert status == pytest.ExitCode.INTERRUPTED, f"the cut session exited {status}"
    one = _receipt(tmp_path / "one")
    passed = [t for t in one["tests"] if t["outcome"] == "passed"]
    rows_one = {_row_of(t) for t in passed}
    assert len(rows_one) == 1 and one["not_run"], \
        f"the first session should finish exactly its first row and leave the rest; rows {rows_one}, " \
        f"{len(one['not_run'])} not run; the first row was done at {cut.cut_at} s of a {DEADLINE} s deadline"
    (finished,) = rows_one
    failed = [t["nodeid"] for t in one["tests"] if t["outcome"] in FAILING]
    assert not failed, f"the cut session failed {failed}"
    receipt_one = next(str(p) for p in (tmp_path / "one").rglob("*.json"))

    start = time.perf_counter()
    status = pytest.main([*common, f"--resume={receipt_one}", "--receipts-dir=two"])
    print(f"second session: {time.perf_counter() - start:.2f} s")
    assert status == pytest.ExitCode.OK, f"the resumed session exited {status}"
    two = _receipt(tmp_path / "two")
    resumed = {t["nodeid"] for t in two["tests"] if t.get("resumed_from")}
    ran = [t for t in two["tests"] if not t.get("resumed_from")]
    assert resumed == {t["nodeid"] for t in passed}, "the resumed session did not carry over exactly the first's passes"
    assert not two["not_run"] and two["all_ok"], f"the resumed session left {len(two['not_run'])} tests or failed"
    assert all(t["outcome"] == "passed" for t in ran)
    assert finished not in {_row_of(t) for t in ran}, f"the resumed session ran tests of the finished row {finished}"
    made = [str(_row_of(t)) for t in ran if (t.get("data") or {}).get("run_made")]
    rows_two = {str(_row_of(t)) for t in ran if _row_of(t)}
    assert sorted(made) == sorted(rows_two), \
        f"each unfinished row's run is made once: made {sorted(made)}, rows {sorted(rows_two)}"
