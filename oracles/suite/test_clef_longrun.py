"""A long clef run stops at ``--deadline`` and ``--resume`` continues it without redoing finished rows.

Two in-process sessions of ``test_clef.py`` on the reference (``--port none``, the rows of two records):
the first with ``--deadline``, cut after its first row's tests by a helper plugin that waits out the
deadline there (so the cut does not depend on how fast this machine is); the second with
``--resume=`` the first's receipt. In process, so torch is imported once (the outer session loaded
the reference already) and each session costs the twin's load (~0.2 s) and its rows.

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

from oracles.families import clef
from oracles.receipts import FAILING

pytestmark = [pytest.mark.clef, pytest.mark.slow]

SUITE = Path(__file__).resolve().parent / "test_clef.py"
SUBSET = "txt_count or img_word"
#: Seconds after session start when the first session stops starting tests. In process the first row
#: (pin check, twin load, nine tests) was done 0.53 s after session start here; 3 s leaves ~6x for a
#: loaded machine, and the helper plugin sleeps out the rest after that row.
DEADLINE = 3.0

CUT_PLUGIN = """
import time

import pytest

from oracles.plugin import STATE

_done = []


def _row(item):
    params = getattr(getattr(item, "callspec", None), "params", {})
    return params["row"].label if "row" in params else None


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    first = _row(item.session.items[0])
    if _done or _row(item) != first or (nextitem is not None and _row(nextitem) == first):
        return
    _done.append(item.nodeid)
    state = item.config.stash[STATE]
    elapsed = time.time() - state.started_wall
    with open("clef_cut.txt", "w") as fh:  # read by the outer test (the inner session captures output)
        fh.write(f"{elapsed:.3f}")
    time.sleep(max(0.0, state.deadline - elapsed) + 0.05)
"""


def _receipt(folder: Path) -> dict[str, Any]:
    (path,) = sorted(folder.rglob("*.json"))
    return json.loads(path.read_text())


def _row_of(t: dict[str, Any]) -> str | None:
    return (t.get("data") or {}).get("row")


@pytest.fixture(scope="session")
def clef_root(verified_snapshot: Callable[[str], Path]) -> Path:
    """The verified snapshot, resolved before ``pytester`` points HOME at a temporary folder."""
    return verified_snapshot(clef.CLEF_PIN)


def test_deadline_then_resume(clef_root: Path, pytester: pytest.Pytester, engines: Callable[..., Any],
                              pytestconfig: pytest.Config, monkeypatch: pytest.MonkeyPatch) -> None:
    engines(pytestconfig.getoption("reference"), clef.CLEF_PIN)  # torch imported in this process before the clock runs
    monkeypatch.setenv("ORACLES_HOME", str(clef_root.parent.parent))  # pytester's HOME holds no snapshot
    pytester.makepyfile(clef_cut=CUT_PLUGIN)
    pytester.syspathinsert()
    common = [str(SUITE), "--runslow", "--port", "none", "-k", SUBSET, "--oracle-threads", "1", "-q",
              "-p", "no:cacheprovider", "--reference", pytestconfig.getoption("reference")]
    start = time.perf_counter()
    first = pytester.runpytest(*common, "--deadline", str(DEADLINE), "-p", "clef_cut", "--receipts-dir=one")
    assert first.ret == pytest.ExitCode.INTERRUPTED, f"the cut session exited {first.ret}:\n{first.stdout.str()[-2000:]}"
    cut = (pytester.path / "clef_cut.txt").read_text() if (pytester.path / "clef_cut.txt").is_file() else "never"
    print(f"first session: {time.perf_counter() - start:.2f} s, first row done at {cut} s")
    one = _receipt(pytester.path / "one")
    passed = [t for t in one["tests"] if t["outcome"] == "passed"]
    rows_one = {_row_of(t) for t in passed}
    assert len(rows_one) == 1 and one["not_run"], \
        f"the first session should finish exactly its first row and leave the rest; rows {rows_one}, " \
        f"{len(one['not_run'])} not run; the first row was done at {cut} s of a {DEADLINE} s deadline"
    (finished,) = rows_one
    failed = [t["nodeid"] for t in one["tests"] if t["outcome"] in FAILING]
    assert not failed, f"the cut session failed {failed}"
    receipt_one = next(str(p) for p in (pytester.path / "one").rglob("*.json"))

    start = time.perf_counter()
    second = pytester.runpytest(*common, f"--resume={receipt_one}", "--receipts-dir=two")
    print(f"second session: {time.perf_counter() - start:.2f} s")
    assert second.ret == pytest.ExitCode.OK, f"the resumed session exited {second.ret}:\n{second.stdout.str()[-2000:]}"
    two = _receipt(pytester.path / "two")
    resumed = {t["nodeid"] for t in two["tests"] if t.get("resumed_from")}
    ran = [t for t in two["tests"] if not t.get("resumed_from")]
    assert resumed == {t["nodeid"] for t in passed}, "the resumed session did not carry over exactly the first's passes"
    assert not two["not_run"] and two["all_ok"], f"the resumed session left {len(two['not_run'])} tests or failed"
    assert all(t["outcome"] == "passed" for t in ran)
    assert finished not in {_row_of(t) for t in ran}, f"the resumed session ran tests of the finished row {finished}"
    made = [_row_of(t) for t in ran if (t.get("data") or {}).get("run_made")]
    rows_two = {_row_of(t) for t in ran if _row_of(t)}
    assert sorted(made) == sorted(rows_two), f"each unfinished row's run is made once: made {sorted(made)}, rows {sorted(rows_two)}"
