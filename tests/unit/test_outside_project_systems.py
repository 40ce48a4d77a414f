"""Ports of a model's own system, plugged in from a project outside this repository: the proof that the MTP,
System One and DeepSeek-V4 port modules ask capabilities (:mod:`oracles.engines.systems`, the cache
buffers), not the built-in adapters' ids.

The test writes, in tmp_path, a one-file package ``outside_ports.py`` whose three classes are mlx-vlm's
adapters under other ids (``outside-mtp``, ``outside-d1``, ``outside-dsv4``: the same code, a faithful
port each), registered through an ``oracles.engines`` entry point by an ``outside_ports-0.1.dist-info``
folder on PYTHONPATH (an installed distribution to importlib.metadata), and a project whose ini turns
pytest-oracles on; then runs ``pytest --pyargs oracles.suite.test_mtp oracles.suite.test_d1_system_one
oracles.suite.test_cohort_dsv4_port --runslow --port outside-mtp,outside-d1,outside-dsv4`` on the
built-in twins, each module's port checks selected by ``-k`` (:data:`SELECT`: the cheap ones, each
family's port checks among them; the whole modules take minutes).

Every selected test runs on its outside port (none skips) with the outcome the built-in adapter gets on
it (:data:`EXPECTED`): mlx-vlm's measured gaps are keyed by test name under the engine's own id, so a
port built on mlx-vlm's code expects them too, strict xfails quoting the figure.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PORTS = '''"""mlx-vlm's system adapters under ids of their own: faithful ports, plugged in from outside."""

from oracles.engines.mlx.d1 import MlxVlmD1
from oracles.engines.mlx.deepseek_v4 import MlxDeepseekV4Port
from oracles.engines.mlx.mtp import MlxVlmMtp


class OutsideMtp(MlxVlmMtp):
    id = "outside-mtp"


class OutsideD1(MlxVlmD1):
    id = "outside-d1"


class OutsideDsv4(MlxDeepseekV4Port):
    id = "outside-dsv4"
'''
ENTRY = {"outside-mtp": "OutsideMtp", "outside-d1": "OutsideD1", "outside-dsv4": "OutsideDsv4"}
MODULES = ("oracles.suite.test_mtp", "oracles.suite.test_d1_system_one", "oracles.suite.test_cohort_dsv4_port")
#: The port checks run: per module, those that hold the port against the reference and the port's own
#: refusals, without the long runs (the 132-step DeepSeek-V4 decode trace, every System One request).
SELECT = ("test_mtp_trunk_port_vs_reference or test_mtp_draft_logits or test_mtp_port_refuses"
          " or (test_so_groups and so_json_row) or (test_so_port_logprobs and so_ticket_row)"
          " or (test_so_pixels and so_pic_square_tree) or test_so_plain_lfm2_vl_refuses"
          " or test_dsv4_port_prefill_of_index_topk or test_dsv4_port_cold_forward or test_dsv4_caches_refuse_trimming"
          " or test_dsv4_port_translations_recorded")
#: The outcome of each selected check on mlx-vlm's adapters (the suite's own run of them in make test).
EXPECTED = {
    "test_mtp_trunk_port_vs_reference": "passed", "test_mtp_draft_logits_port_vs_reference": "xfailed",
    "test_mtp_draft_logits_gap_is_the_final_norm": "passed", "test_mtp_port_refuses_a_misplaced_step": "passed",
    "test_so_groups": "passed", "test_so_port_logprobs": "passed", "test_so_pixels": "xfailed",
    "test_so_plain_lfm2_vl_refuses": "passed", "test_dsv4_port_prefill_of_index_topk_within_float32": "xfailed",
    "test_dsv4_port_cold_forward_within_float32": "xfailed", "test_dsv4_caches_refuse_trimming": "passed",
    "test_dsv4_port_translations_recorded": "passed",
}


def test_outside_ports_run_the_system_modules(tmp_path: Path) -> None:
    plugged = tmp_path / "plugged"
    (plugged / "outside_ports-0.1.dist-info").mkdir(parents=True)
    (plugged / "outside_ports.py").write_text(PORTS)
    (plugged / "outside_ports-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: outside-ports\nVersion: 0.1\n")
    (plugged / "outside_ports-0.1.dist-info" / "entry_points.txt").write_text(
        "[oracles.engines]\n" + "".join(f"{k} = outside_ports:{v}\n" for k, v in ENTRY.items()))
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\noracles = true\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugged), str(ROOT), os.environ.get("PYTHONPATH")]))

    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "--pyargs", *MODULES, "-k", SELECT, "--runslow",
                           "--port", ",".join(ENTRY), "-n", "0", "--oracle-threads", "1", "-p", "no:cacheprovider",
                           "--receipts-dir=receipts", "-q"], cwd=project, env=env, capture_output=True, text=True,
                          timeout=850)
    seconds = time.perf_counter() - start
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-5000:]}\n{done.stderr[-2000:]}"
    (path,) = (project / "receipts" / "default").glob("*.json")
    receipt = json.loads(path.read_text())
    loaded = {e["name"] for e in receipt["engines"]}
    assert set(ENTRY) | {"torch"} <= loaded, loaded
    got: dict[str, list[tuple[str, str]]] = {}
    for t in receipt["tests"]:
        got.setdefault(t["check"], []).append((t["nodeid"], t["outcome"]))
    assert set(got) == set(EXPECTED), f"checks run {sorted(got)}, expected {sorted(EXPECTED)}"
    wrong = {check: runs for check, runs in got.items()
             if not all(outcome == EXPECTED[check] and "outside-" in node for node, outcome in runs)}
    assert not wrong, f"outcomes other than the built-in adapters': {wrong}\n{done.stdout[-3000:]}"
    print(f"seconds: pytest {seconds:.1f}")
