"""Your model, your port, from a project outside this repository: the proof that the suite asks
capabilities, not engine ids.

The test builds, in tmp_path:
- a tiny seeded LlamaForCausalLM snapshot (oracles/twins/draft.py's builder and size, seed 1, weights
  drawn at initializer_range 0.1 instead of Llama's 0.02: at 0.02 this model's greedy decode repeats
  2 distinct tokens in 320, at 0.1 it gives 26, and the chat's second turn has ids to append; the
  tokenizer and chat template are SmolLM2's, copied from the package);
- a project (its ini turns pytest-oracles on) that pins it with ``oracles pin tiny --from SNAP
  --untrained`` and writes its token ids with ``oracles records mtplx --pin tiny``;
- a one-file port, ``myport.py``: ``class MyPort(TorchReference): id = "myport"``, registered through
  an ``oracles.engines`` entry point by a ``myport-0.1.dist-info`` folder on PYTHONPATH (an installed
  distribution to importlib.metadata);
then runs ``pytest --pyargs oracles.suite -m "mtplx or port" --pin tiny --runslow --port myport``.

The port is the reference's own code, so it must pass everything the reference passes: every mtplx
check has the same outcome on both engines, and every port check (the port held against the
reference, record by record) passes. The reference itself may fail only the checks of a trained
model's behaviour on this untrained pin (a generation ending with a stop token): the suite skips
those on a ``"trained": false`` pin where it asks ``Pin.untrained_reason`` (the hybrid branch), and
until then they fail on both engines alike. The "readme" prompt (1,294 ids) is deselected: the port
skips it anyway (``--port-records sample``), and the reference's head re-run over its [1294, 49152]
logits alone took 23 s here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

BUILD = """
import sys
from pathlib import Path

from oracles.families import DEFAULT_PIN
from oracles.families.records import TOKENIZER_COPIES
from oracles.twins import draft

draft.CONFIG = {**draft.CONFIG, "initializer_range": 0.1}
print(draft.build(1, Path(sys.argv[1]), TOKENIZER_COPIES / DEFAULT_PIN))
"""
PORT = '''"""My port: the reference's own class under another engine id (a faithful port)."""

from oracles.engines.torch.reference import TorchReference


class MyPort(TorchReference):
    id = "myport"
'''
#: Checks of a trained model's behaviour: on this untrained pin they may fail (or skip, where the suite
#: asks Pin.untrained_reason), on the reference and the port alike.
TRAINED_ONLY = {"test_decode_to_stop", "test_generation_to_stop"}


def is_port_check(test: dict[str, Any]) -> bool:
    """A test of the port marker (the port held against the reference): test_port.py's, the chat's
    (attributed to mtplx_chat, its first family), the fault panel's (bisect of the faithful port:
    parametrized by the port alone), the as-shipped config check (parametrized by the port alone;
    it skips for a port that is not mlx-lm's, naming why: there is no second config reader), the wire's
    bit-equality to an in-process engine (parametrized by the port alone; it skips a port that names no such
    engine), and the graded family's port test (a bfloat16 port's band; it skips an exactly judged pair, naming why)."""
    return (test["nodeid"].startswith(("test_port.py", "test_layer_taps.py", "test_fault_panel.py", "test_as_shipped.py",
                                       "test_wire.py"))
            or test["check"] in ("test_chat_vs_reference", "test_port_within_band"))


def oracles_env(plugged: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugged), str(ROOT), os.environ.get("PYTHONPATH")]))
    return env


def sh(*cmd: str | Path, cwd: Path, env: dict[str, str], ok: tuple[int, ...] = (0,)) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=800)
    assert done.returncode in ok, \
        f"{' '.join(map(str, cmd))}: exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_project_pins_a_local_snapshot_and_holds_an_entry_point_port(tmp_path: Path) -> None:
    seconds: dict[str, float] = {}
    plugged = tmp_path / "plugged"
    (plugged / "myport-0.1.dist-info").mkdir(parents=True)
    (plugged / "myport.py").write_text(PORT)
    (plugged / "myport-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: myport\nVersion: 0.1\n")
    (plugged / "myport-0.1.dist-info" / "entry_points.txt").write_text("[oracles.engines]\nmyport = myport:MyPort\n")
    env = oracles_env(plugged)
    project = tmp_path / "project"
    project.mkdir()
    (project / "pytest.ini").write_text("[pytest]\noracles = true\n")

    t = time.perf_counter()
    snap = tmp_path / "snap"
    snap.mkdir()
    assert sh(sys.executable, "-c", BUILD, snap, cwd=project, env=env).strip() == "LlamaForCausalLM"
    seconds["build"] = time.perf_counter() - t

    t = time.perf_counter()
    out = sh(sys.executable, "-m", "oracles.cli", "pin", "tiny", "--from", snap, "--untrained", cwd=project, env=env)
    assert f"wrote {project / 'fixtures' / 'pins' / 'tiny.json'}" in out, out
    sh(sys.executable, "-m", "oracles.cli", "records", "mtplx", "--pin", "tiny", cwd=project, env=env)
    assert (project / "fixtures" / "records" / "mtplx" / "tokens" / "tiny.json").is_file()
    seconds["pin + records"] = time.perf_counter() - t

    t = time.perf_counter()
    out = sh(sys.executable, "-m", "pytest", "--pyargs", "oracles.suite", "-m", "mtplx or port", "-k", "not readme",
             "--pin", "tiny", "--runslow", "--port", "myport", "-n", "0", "--oracle-threads", "1",
             "-p", "no:cacheprovider", "--receipts-dir=receipts", "-q", cwd=project, env=env, ok=(0, 1))
    seconds["pytest"] = time.perf_counter() - t
    (path,) = (project / "receipts" / "default").glob("*.json")
    receipt = json.loads(path.read_text())
    loaded = {(e["name"], e["pin"]) for e in receipt["engines"]}
    assert {("torch", "tiny"), ("myport", "tiny")} <= loaded, (loaded, out[-3000:])  # and the draft twin, per engine
    pins = {p["name"]: p["source"] for p in receipt["pins"]}
    assert pins["tiny"] == f"local:{snap}", pins

    pairs: dict[str, list[str]] = {}
    for t in receipt["tests"]:
        if re.search(r"-(torch|myport)\b", t["nodeid"]) and not is_port_check(t):
            pairs.setdefault(re.sub(r"-(torch|myport)\b", "-ENGINE", t["nodeid"]), []).append(t["outcome"])
    assert len(pairs) >= 20 and all(len(p) == 2 for p in pairs.values()), pairs  # 25 mtplx tests on each engine
    differ = {n: p for n, p in pairs.items() if len(set(p)) != 1}
    assert not differ, f"the faithful port's outcomes differ from the reference's: {differ}"
    failed = sorted({t["check"] for t in receipt["tests"] if t["outcome"] in ("failed", "error")})
    assert set(failed) <= TRAINED_ONLY, f"failures beyond a trained model's behaviour: {failed}\n{out[-4000:]}"
    ports = [t for t in receipt["tests"] if is_port_check(t)]
    assert ports and all(t["outcome"] in ("passed", "skipped") for t in ports), [
        (t["nodeid"], t["outcome"], t["summary"]) for t in ports if t["outcome"] not in ("passed", "skipped")]
    held = [t["check"] for t in ports if t["outcome"] == "passed"]
    assert {"test_prefill_vs_reference", "test_decode_vs_reference", "test_chat_vs_reference"} <= set(held), held
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))
