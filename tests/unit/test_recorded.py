"""A recorded reference is the reference (issue 26): two sessions of the port family and the mtplx decode
checks on the draft twin, the port llama.cpp on the twin's F32 GGUF. The first runs live and records the torch
reference (``--record torch=DIR``: the recorder passes every answer through unchanged); the second judges the
port against the recording (``--reference recorded:DIR``) with an empty folder in place of the reference's
snapshot (it never reads it: an empty folder would fail its verification), each in a process of its own, so
that its peak RSS and its imports are its own (a plugin writes its ``VmHWM`` and which frameworks it imported) and no framework is
imported into this one (pytester drops the modules an in-process session imported, and torch's native
module cannot be imported twice in one process: a later torch test here would crash). The replay gives the
live session's checks table and bit-identical comparable units, loads no torch engine, imports neither torch
nor transformers (the live session does: the control), and peaks lower than the live session by more than
the reference's weights. Positive controls: the store with one entry altered fails the test that reads it
naming the file; with the entry removed, naming the call as not recorded (sessions in this process: a recording
imports no framework).

Left out of the sessions: the 1,294-token "readme" record (its head re-run alone takes 90 s of torch here)
and ``test_failed_record_is_localised``, which injects a fault into the reference's transformers model in
place: a recording holds no model to inject into (a replay skips it, naming the engine and the capability).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_wire_serve import _table, units_differ  # noqa: E402

from oracles.receipts.table import Receipt  # noqa: E402

PIN, PORT, ARTIFACT = "smollm2-draft-twin", "llamacpp", "smollm2-draft-twin-gguf-f32"
MODULES = ("oracles.suite.test_port", "oracles.suite.test_decode")
SELECT = "not readme and not localised"
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
#: The built pins' folder, read before pytester points HOME into a temporary folder.
HOME = str(Path(os.environ.get("ORACLES_HOME") or Path.home() / ".cache" / "oracles").expanduser())
ROOT = Path(__file__).resolve().parents[2]
#: A plugin (``-p session_probe``) writing, at the session's end, which frameworks the session imported and its
#: peak RSS since it started (``VmHWM``: a ``wait4`` figure would count the memory of the process that forked it).
PROBE = """import json, os, sys
def pytest_unconfigure(config):
    names = {m.split(".")[0] for m in sys.modules} & {"torch", "transformers", "llama_cpp_py_sync"}
    status = open("/proc/self/status").read().splitlines()
    kib = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    open(os.environ["PROBE_OUT"], "w").write(json.dumps({"imports": sorted(names), "peak_kib": kib}))
"""


def _args(out: Path, *extra: str) -> list[str]:
    return ["--pyargs", *MODULES, "-p", "no:cacheprovider", "--runslow", "--oracle-threads", "1", "--pin", PIN,
            "--port", PORT, "--port-pin", ARTIFACT, "-k", SELECT, f"--receipts-dir={out}", *extra]


def _receipt(folder: Path) -> tuple[dict[str, Any], Path]:
    (path,) = [p for p in folder.rglob("*.json") if not p.name.startswith(".")]
    return json.loads(path.read_text()), path


class Session:
    """A session in a process of its own: its ``receipt``, peak ``rss`` (MiB), ``imports`` and wall ``seconds``."""

    def __init__(self, cwd: Path, out: Path, *extra: str) -> None:
        """Run it.

        Raises:
            AssertionError: the session failed (its last lines quoted).
        """
        (cwd / "probe").mkdir(exist_ok=True)
        (cwd / "probe" / "session_probe.py").write_text(PROBE)
        probe = out.with_suffix(".probe.json")
        env = {**os.environ, "ORACLES_HOME": HOME, "OMP_NUM_THREADS": "1", "PROBE_OUT": str(probe),
               "PYTHONPATH": os.pathsep.join([str(ROOT), str(cwd / "probe"), os.environ.get("PYTHONPATH", "")])}
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "pytest", "-p", "session_probe", *_args(out, *extra)], cwd=cwd,
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, check=False)
        assert done.returncode == 0, done.stdout.decode(errors="replace")[-4000:]
        found = json.loads(probe.read_text())
        self.receipt, self.rss, self.imports = _receipt(out), found["peak_kib"] / 1024, set(found["imports"])
        self.seconds = time.perf_counter() - start


def _forward_entry(store: Path, ids: tuple[int, ...]) -> Path:
    """The entry of the reference's cold forward of ``ids`` (every position kept)."""
    for path in store.glob("entries/*/*.orwp"):
        head = path.read_bytes()[:65536]
        if b'"call":"forward"' in head and json.dumps(list(ids), separators=(",", ":")).encode() in head \
                and b'"cache":null' in head and b'"keep":0' in head:
            return path
    raise AssertionError(f"no cold forward of {len(ids)} ids in {store}")


def test_a_recorded_reference_judges_a_port_as_the_live_one(pytester: pytest.Pytester, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch, receipt: Receipt) -> None:
    monkeypatch.setenv("ORACLES_HOME", HOME)
    store, nowhere = tmp_path / "store", tmp_path / "no-reference-here"
    nowhere.mkdir()
    # the recording session is a live one (the recorder passes every answer through unchanged)
    lived = Session(pytester.path, tmp_path / "record", "--record", f"torch={store}")
    # the replay never reads the reference's snapshot: an empty folder in its place would fail its verification
    replayed = Session(pytester.path, tmp_path / "replay", "--reference", f"recorded:{store}", f"--snapshot={PIN}={nowhere}")
    replay, live = replayed.receipt, lived.receipt

    from oracles.engines.recorded.check import check_store
    from oracles.pins.pin import load_pin
    from oracles.receipts.units_reader import units_of

    assert check_store(store)[0].failures == []
    assert _table(replay[0]) == _table(live[0]) and live[0]["all_ok"], _table(replay[0])
    assert sum(c["passed"] for c in live[0]["checks"].values()) >= 15  # 20 measured: port, decode, prefill checks
    assert len(units_of(*live)) >= 4, "no comparable units: the comparison would check nothing"
    assert units_differ(live, replay) == [] and units_differ(replay, live) == []
    engines = {e["name"]: e for e in replay[0]["engines"]}
    assert "torch" not in engines and set(engines) == {f"recorded:{store}", PORT}, sorted(engines)
    pin = load_pin(PIN)
    assert engines[f"recorded:{store}"]["recorded"]["pin"] == {"name": PIN, "digest": pin.digest}
    weights = sum(f.bytes for name, f in pin.files.items() if name.endswith(".safetensors"))
    receipt.update(rss_live_mib=round(lived.rss), rss_replay_mib=round(replayed.rss), imports_live=sorted(lived.imports),
                   imports_replay=sorted(replayed.imports), reference_weight_mib=round(weights / 2**20, 1),
                   store_mib=round(sum(p.stat().st_size for p in store.rglob("*") if p.is_file()) / 2**20, 1),
                   seconds={"record": round(lived.seconds, 1), "replay": round(replayed.seconds, 1)})
    assert {"torch", "transformers"} <= lived.imports and not {"torch", "transformers"} & replayed.imports, (
        lived.imports, replayed.imports)
    assert (lived.rss - replayed.rss) * 2**20 > weights, f"replay peaks at {replayed.rss:.0f} MiB, live at {lived.rss:.0f} MiB"
    _altered_or_missing_entry_is_named(pytester, store, tmp_path)


def _altered_or_missing_entry_is_named(pytester: pytest.Pytester, store: Path, tmp_path: Path) -> None:
    """Positive control: the reference's prefill of "ping" altered in one bit, then removed."""
    from oracles.families.execution.prompts import load_prompts

    ping = next(r for r in load_prompts() if r.id == "ping").bind(PIN)
    copy = tmp_path / "altered"
    shutil.copytree(store, copy)
    entry = _forward_entry(copy, ping.ids)
    data = bytearray(entry.read_bytes())
    data[-7] ^= 1
    entry.write_bytes(bytes(data))
    one = ["--pyargs", "oracles.suite.test_decode", "-p", "no:cacheprovider", "--runslow", "--pin", PIN, "--port", "none",
           "--reference", f"recorded:{copy}", "-k", "test_prefill_comparable and ping", "--no-receipt"]
    result = pytester.runpytest(*one)
    text = "\n".join(result.outlines)
    assert result.ret == 1 and f"{entry}: field sha256" in text and "changed after it was written" in text, text[-3000:]
    entry.unlink()
    result = pytester.runpytest(*one)
    text = "\n".join(result.outlines)
    assert result.ret == 1 and f"engine recorded:{copy} forward(): not recorded" in text, text[-3000:]
