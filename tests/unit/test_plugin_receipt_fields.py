"""Every field of the session receipt, from a pytester run of the project's real conftest fixtures
(the plugin's ``verified_snapshot`` and ``engines``) with a stand-in engine registered in the engine registry.

Not ``dry``: the run verifies the default pin's snapshot under ``$ORACLES_HOME`` (reads its ~540 MB
once, no weights are loaded).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import re
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest
from inner_runs import DRY_TOKENIZER

import oracles.engines
from oracles.pins.pin import BUILTIN_PINS, oracles_home
from oracles.receipts.table import SCHEMA_VERSION

ROOT = Path(__file__).resolve().parents[2]
#: Read at import, before pytester points $HOME at its temporary folder (where ~/.cache/oracles,
#: the default $ORACLES_HOME, holds no snapshot); handed to the inner runs as $ORACLES_HOME.
REAL_ORACLES_HOME = str(oracles_home())
PIN = "smollm2-135m-instruct"
#: The counts of a checks row that none of these tests reach.
NONE_ELSE = {"xfailed": 0, "not_run": 0}

FAKE_ENGINE = DRY_TOKENIZER + """
from oracles.engines.base import Engine


class FakeEngine(Engine):
    id = "fake"
    loads = 0

    def __init__(self, root, pin, threads):
        super().__init__(root, pin, threads)
        FakeEngine.loads += 1
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = 49152, 576, 30, 8192
        self.eos_token_ids, self.tokenizer = frozenset({2}), Tokenizer(root)

    def describe(self):
        return {"kind": "stand-in"}

    def forward(self, prompt, cache=None, keep=0, layers=False):
        raise self._unsupported("forward", "a stand-in that only loads")

    def make_cache(self):
        return []

    def cache_length(self, cache):
        return 0
"""

SUITE = """
import pytest

@pytest.mark.mtplx
@pytest.mark.parametrize("record", ["ping", "readme"])
def test_engine_rows(engines, record, receipt):
    engine = engines("fake", "smollm2-135m-instruct")
    receipt.update(record=record, loads=type(engine).loads, pin=engine.pin)

@pytest.mark.d1
def test_engine_again(engines):
    assert engines("fake", "smollm2-135m-instruct") is engines("fake", "smollm2-135m-instruct")

def test_fails():
    assert 1 == 2, "deliberate failure"

@pytest.mark.skip(reason="deliberately skipped")
def test_skipped():
    pass

def test_not_selected():
    pass
"""


def _pin_digest() -> str:
    """The pin's snapshot digest recomputed from its JSON: sha256 over sorted "path\\0sha256\\n" lines."""
    files = json.loads((BUILTIN_PINS / f"{PIN}.json").read_text())["files"]
    return hashlib.sha256("".join(f"{k}\0{files[k]['sha256']}\n" for k in sorted(files)).encode()).hexdigest()


@pytest.fixture
def fields_run(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
               only_receipt: Callable[..., Any]) -> tuple[pytest.RunResult, Path, dict[str, Any]]:
    monkeypatch.setitem(oracles.engines.BUILTIN, "fake", "fake_engine:FakeEngine")
    monkeypatch.setenv("ORACLES_HOME", REAL_ORACLES_HOME)
    pytester.syspathinsert()
    pytester.makepyfile(fake_engine=FAKE_ENGINE, test_suite=SUITE)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(pytester.path)]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "test_suite.py"], check=True)
    subprocess.run([*git, "commit", "-qm", "suite"], check=True)
    with open(pytester.path / "test_suite.py", "a") as fh:
        fh.write("\n# an uncommitted change: the receipt must say dirty\n")
    result = pytester.runpytest("--receipts-dir", "out", "--receipt-tag", "fields", "-m", "not gpu",
                                "-k", "not not_selected", "--oracle-threads", "1", "--port", "none")
    path, receipt = only_receipt(pytester.path / "out" / "fields")
    return result, path, receipt


def test_receipt_has_every_field(fields_run: tuple[pytest.RunResult, Path, dict[str, Any]],
                                 by_check: Callable[..., Any]) -> None:
    result, path, r = fields_run
    result.assert_outcomes(passed=3, failed=1, skipped=1, deselected=1)
    match = re.fullmatch(r"(\d{8}T\d{6}Z)-([0-9a-f]{8})\.json", path.name)
    assert match and match.group(2) == r["run_id"], path.name
    assert r["schema_version"] == SCHEMA_VERSION
    assert r["started"].startswith(f"{match.group(1)[:4]}-") and r["started"] <= r["finished"]
    assert r["started"].endswith("Z") and r["finished"].endswith("Z")
    assert r["seconds"] > 0 and r["exitstatus"] == 1
    inv = r["invocation"]
    assert inv["markexpr"] == "not gpu" and inv["keyword"] == "not not_selected"
    assert "--receipt-tag" in inv["args"] and inv["reference"] == "torch" and inv["port"] == "none"
    env = r["environment"]
    for name in ("torch", "transformers", "mlx", "numpy"):
        assert env["versions"][name] == importlib.metadata.version(name), name
    assert env["versions"]["python"].count(".") == 2
    assert env["threads"]["oracle_threads"] == 1 and "OMP_NUM_THREADS" in env["threads"]
    assert env["machine"]["system"] and env["machine"]["machine"]
    head = subprocess.run(["git", "-C", str(path.parents[2]), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert env["git"] == {"commit": head.stdout.strip(), "dirty": True}
    (pin,) = r["pins"]
    assert pin["name"] == PIN and pin["digest"] == _pin_digest() and pin["seconds"] > 0
    assert r["not_run"] == [] and r["resumed_from"] is None
    tests = by_check(r)
    assert set(tests) == {"test_engine_rows[ping]", "test_engine_rows[readme]", "test_engine_again", "test_fails",
                          "test_skipped"}
    for rec in tests.values():
        assert set(rec) >= {"nodeid", "family", "check", "record_id", "outcome", "duration", "summary", "data"}
        assert rec["duration"] >= 0
    ping = tests["test_engine_rows[ping]"]
    assert (ping["family"], ping["check"], ping["record_id"], ping["outcome"]) == ("mtplx", "test_engine_rows", "ping",
                                                                                   "passed")
    assert ping["nodeid"] == "test_suite.py::test_engine_rows[ping]"
    assert ping["data"] == {"record": "ping", "loads": 1, "pin": PIN}
    assert tests["test_engine_again"]["family"] == "d1"
    assert tests["test_fails"]["outcome"] == "failed" and "deliberate failure" in tests["test_fails"]["summary"]
    assert tests["test_skipped"]["outcome"] == "skipped" and tests["test_skipped"]["summary"] == "deliberately skipped"
    assert r["checks"] == {
        "test_engine_again": {"family": "d1", "ok": True, "passed": 1, "failed": [], "skipped": 0, **NONE_ELSE},
        "test_engine_rows": {"family": "mtplx", "ok": True, "passed": 2, "failed": [], "skipped": 0, **NONE_ELSE},
        "test_fails": {"family": "unit", "ok": False, "passed": 0, "failed": ["test_suite.py::test_fails"], "skipped": 0,
                       **NONE_ELSE},
        "test_skipped": {"family": "unit", "ok": None, "passed": 0, "failed": [], "skipped": 1, **NONE_ELSE},
    }
    assert r["all_ok"] is False


def test_engine_loaded_once_per_session(fields_run: tuple[pytest.RunResult, Path, dict[str, Any]]) -> None:
    """Three tests ask the ``engines`` fixture for the same engine: one load, recorded once."""
    _, _, r = fields_run
    (row,) = r["engines"]
    assert (row["name"], row["pin"], row["load_count"], row["worker"]) == ("fake", PIN, 1, "main")
    assert len(row["seconds"]) == 1 and row["kind"] == "stand-in"


def test_bad_snapshot_fails_before_any_load(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                            only_receipt: Callable[..., Any], by_check: Callable[..., Any]) -> None:
    """A wrong snapshot fails each test that needs it with one line; no engine is built. (A --snapshot PATH
    that is no folder is refused at configure: tests/unit/test_plugin_guards.py.)"""
    monkeypatch.setitem(oracles.engines.BUILTIN, "fake", "fake_engine:FakeEngine")
    pytester.syspathinsert()
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(fake_engine=FAKE_ENGINE, test_suite=SUITE)
    snap = pytester.path / "snap"
    snap.mkdir()
    (snap / "chat_template.jinja").write_text("{{ not the pinned template }}")  # checked first (sorted)
    result = pytester.runpytest("--receipts-dir", "out", "--snapshot", f"{PIN}={snap}", "-k", "engine")
    result.assert_outcomes(failed=3, deselected=3)  # engines() is called in the test body
    _, r = only_receipt(pytester.path / "out")
    tests = by_check(r)
    want = f"pin {PIN}: {snap}/chat_template.jinja: size mismatch: expected "
    for name in ("test_engine_rows[ping]", "test_engine_rows[readme]", "test_engine_again"):
        assert tests[name]["outcome"] == "failed", tests[name]
        assert tests[name]["summary"].startswith(f"Failed: {want}") and "\n" not in tests[name]["summary"], tests[name]["summary"]
    assert r["engines"] == [] and r["pins"] == [], "nothing may load or count as verified"
    assert r["checks"]["test_engine_rows"]["failed"] == ["ping", "readme"]
