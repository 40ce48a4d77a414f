"""Installed and not enabled, pytest-oracles changes nothing: a project without the ``oracles`` ini key
and without a receipt option gets no receipts folder, partial log or npz, no environment variable, no
oracles line in the header or the terminal summary; and with plain tests, no per-test hook and no
import beyond the plugin's own light modules (the overhead goal: bench/plugin_overhead.py).

Whole pytest processes (the plugin is loaded from its entry point as in any project), each compared with
the same run under ``-p no:oracles`` where pytest's own behaviour is the baseline. A probe plugin given
with ``-p`` is imported before entry-point plugins, so its copy of ``os.environ`` precedes the plugin's
import; it writes what it saw when the session finishes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json
import os
import sys

BEFORE = dict(os.environ)
PER_TEST = ("pytest_runtest_protocol", "pytest_runtest_setup", "pytest_runtest_call", "pytest_runtest_teardown",
            "pytest_runtest_makereport", "pytest_runtest_logreport", "pytest_pyfunc_call", "pytest_fixture_setup",
            "pytest_fixture_post_finalizer", "pytest_runtest_logstart", "pytest_runtest_logfinish",
            "pytest_report_teststatus", "pytest_itemcollected")


def pytest_sessionfinish(session):
    hook = session.config.hook
    ours = {name: sorted(i.plugin_name for i in getattr(hook, name).get_hookimpls() if "oracles" in i.plugin_name)
            for name in PER_TEST}
    after = dict(os.environ)
    changed = {k: after.get(k) for k in set(BEFORE) | set(after) if BEFORE.get(k) != after.get(k)}
    with open(os.environ["ORACLES_PROBE_OUT"], "w") as fh:
        json.dump({"env": changed, "hooks": {k: v for k, v in ours.items() if v},
                   "modules": sorted(m for m in sys.modules if m == "oracles" or m.startswith("oracles.")),
                   "numpy": "numpy" in sys.modules}, fh)
"""
PLAIN = """
import pytest

@pytest.mark.parametrize("i", range(3))
def test_plain(i):
    assert i >= 0
"""
FIXTURES = PLAIN + """

def test_uses_the_fixtures(receipt, runs):
    receipt["kept"] = runs("k", lambda: [1, 2])
"""
#: What a plugin that is off may import (sorted): itself, its fixtures' module and the types they are given,
#: its option table and hookspecs, and the light modules its markers and ini keys come from (with their packages).
LIGHT = ["oracles", "oracles.families", "oracles.families.callables", "oracles.ini", "oracles.plugin",
         "oracles.plugin.fixtures", "oracles.plugin.hookspecs", "oracles.plugin.names", "oracles.plugin.options"]


def run(project: Path, probe_dir: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = project.parent / f"probe{len(list(project.parent.glob('probe*.json')))}.json"
    env = {**os.environ, "ORACLES_PROBE_OUT": str(out),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(probe_dir), os.environ.get("PYTHONPATH")]))}
    for name in [*(k for k in env if k.startswith("PYTEST_")),  # the outer pytest's own
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"]:  # make's exports: the plugin must not set them
        env.pop(name, None)
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "oracles_opt_probe", "-p", "no:cacheprovider",
                           "-p", "no:xdist", *extra], cwd=project, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return done, json.loads(out.read_text())


def files(folder: Path) -> set[str]:
    return {str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts}


@pytest.mark.parametrize("suite", ["plain", "fixtures"])
def test_installed_not_enabled_changes_nothing(tmp_path: Path, suite: str) -> None:
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "oracles_opt_probe.py").write_text(PROBE)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_it.py").write_text(PLAIN if suite == "plain" else FIXTURES)
    before = files(project)
    on, seen = run(project, probe_dir)
    assert files(project) == before, f"the plugin wrote {sorted(files(project) - before)}"
    off, baseline = run(project, probe_dir, "-p", "no:oracles", "-k", "test_plain")  # pytest's own doing
    assert seen["env"] == baseline["env"], "the plugin changed the environment"
    if suite == "plain":
        assert seen["hooks"] == {}, f"per-test hooks of the plugin are registered: {seen['hooks']}"
        assert seen["modules"] == LIGHT and not seen["numpy"], seen["modules"]
        drop = ("plugins:", "platform ")  # pytest's plugin list names the plugin; timings differ
        assert [s for s in on.stdout.splitlines() if not s.startswith(drop) and " in " not in s] == [
            s for s in off.stdout.splitlines() if not s.startswith(drop) and " in " not in s]
    lines = on.stdout.splitlines()
    assert not [s for s in lines if s.lower().startswith("oracles") or "oracles receipt" in s], on.stdout
    assert " passed" in lines[-1], lines[-1]


def test_enabled_by_ini_writes_its_receipt(tmp_path: Path) -> None:
    """Positive control: the same project with ``oracles = true`` does write a receipt, so the checks
    above would see one."""
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir()
    (probe_dir / "oracles_opt_probe.py").write_text(PROBE)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\noracles = true\n")
    (project / "test_it.py").write_text(PLAIN)
    done, seen = run(project, probe_dir)
    written = files(project)
    assert any(f.startswith("receipts/default/") and f.endswith(".partial.jsonl") for f in written), written
    assert any(f.startswith("receipts/default/") and f.endswith(".json") for f in written), written
    assert any(line.startswith("oracles: receipt ") for line in done.stdout.splitlines())
    assert seen["hooks"], "an enabled run registers its per-test hooks"
