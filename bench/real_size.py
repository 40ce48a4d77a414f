"""The port family at a real model's size: time, peak memory against the weights, receipt bytes, and the
suite's overhead over a bare script making the same engine calls.

On a pin (default the untrained ``qwen25-0.5b-shapes-twin``: Qwen2.5-0.5B's shapes, 1.98 GB of float32
weights; ``oracles materialize qwen25-0.5b-shapes-twin`` builds it) and one port (default ``mlx``), the
port family's tests on the records of ``--records`` (default the "ping" prefill and the "arith" decode)
run in three ways, each a process of its own measured from outside (``os.wait4``: wall seconds, CPU
seconds, the process's peak RSS):

1. **one process**: ``pytest oracles/suite -m port -k ... --pin PIN --port PORT``, the reference and the
   port loaded side by side; its receipt's bytes (JSON, npz sidecar) and each test's seconds;
2. **recorded**: the reference recorded in one process (``--record torch=DIR``, the port not loaded),
   replayed in another beside the port (``--reference recorded:DIR``): :func:`recorded`, and the store's bytes;
3. **bare**: this file with ``--bare``: the same snapshot verified, the same engines built, the same
   runs through the same ``oracles.families`` functions, no pytest.

Both sides tally their engine calls (``bench/engine_calls.py``) and the bench prints whether they made
the same ones: a ratio of runs that did different work is not an overhead. The ratio is taken per
round (suite then bare, seconds apart, so a drift of a shared machine's speed mostly cancels within a
round); with several rounds it prints the median and the range. Goal: suite / bare <= 1.05.

Usage: python bench/real_size.py [--pin qwen25-0.5b-shapes-twin] [--port mlx] [--records ping,arith]
       [--rounds 1] [--threads 1] [--json OUT.json] [--no-recorded]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BENCH = Path(__file__).resolve().parent
PIN = "qwen25-0.5b-shapes-twin"
#: The port test that holds a record of each kind: a prompt record's prefill, a generation record's decode.
TESTS: dict[str, tuple[str, ...]] = {"prefill": ("test_prefill_vs_reference",), "decode": ("test_decode_vs_reference",)}
#: The reference's own mtplx tests that make the runs those port tests read of it: a prompt record's
#: chat-template ids and prefill, a generation record's greedy decode with its recomputes.
RECORDING_TESTS: dict[str, tuple[str, ...]] = {"prefill": ("test_chat_template_ids", "test_prefill_finite"),
                                               "decode": ("test_decode_to_stop",)}


@dataclass
class Measured:
    """One process measured from outside: exit code, wall and CPU seconds, peak RSS in bytes."""

    rc: int
    wall_s: float
    cpu_s: float
    peak_rss: int
    calls: dict[str, int] = field(default_factory=dict)
    receipt_bytes: dict[str, int] = field(default_factory=dict)
    test_seconds: dict[str, float] = field(default_factory=dict)


def measure(cmd: list[str], calls_to: Path) -> Measured:
    """Run ``cmd`` (stdout and stderr to files beside ``calls_to``) and measure it with ``os.wait4``.

    ``ru_maxrss`` is the largest RSS of the process (and of its waited children): kilobytes on Linux,
    bytes on macOS (getrusage(2) of each).
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "ORACLES_BENCH_CALLS": str(calls_to),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), str(BENCH), os.environ.get("PYTHONPATH")]))}
    with open(calls_to.with_suffix(".out"), "w") as out:
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    scale = 1 if platform.system() == "Darwin" else 1024
    calls = json.loads(calls_to.read_text()) if calls_to.is_file() else {}
    return Measured(proc.returncode, wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * scale, calls)


def selection(records: list[str], tests: dict[str, tuple[str, ...]]) -> str:
    """The ``-k`` expression of ``tests[kind]`` on each of ``records`` (kind ``decode`` for a generation
    record, else ``prefill``)."""
    from oracles.families.execution import runs as ex

    generation = {r.id for r in ex.GENERATION}
    return " or ".join(f"({test} and {r})" for r in records for test in tests["decode" if r in generation else "prefill"])


def suite(args: argparse.Namespace, work: Path, tag: str, mark: str = "port", tests: dict[str, tuple[str, ...]] = TESTS,
          options: tuple[str, ...] = (), port: str | None = None) -> Measured:
    """One pytest process: the ``mark`` tests ``tests`` of ``--records`` on ``--pin`` (default: the port
    family's, reference and port side by side), a receipt written under ``work``; ``options`` added,
    ``port`` (default ``--port``) the ports."""
    receipts = work / "receipts"
    cmd = [sys.executable, "-m", "pytest", "oracles/suite", "-m", mark, "-k", selection(args.records, tests), "--runslow",
           "-p", "no:randomly", "-p", "engine_calls", "-q", "--pin", args.pin, "--port", port or args.port,
           "--oracle-threads", str(args.threads), f"--receipts-dir={receipts}", "--receipt-tag", tag, *options]
    m = measure(cmd, work / f"{tag}-calls.json")
    for f in sorted((receipts / tag).glob("*")):
        kind = "npz" if f.suffix == ".npz" else "partial" if f.name.endswith(".partial.jsonl") else "json"
        m.receipt_bytes[kind] = m.receipt_bytes.get(kind, 0) + f.stat().st_size
        if kind == "json":
            m.test_seconds = {t["nodeid"].split("::")[-1]: round(t["duration"], 1) for t in json.loads(f.read_text())["tests"]}
    return m


def bare_side(args: argparse.Namespace, work: Path, tag: str) -> Measured:
    """This file with ``--bare``, the same pin, port, records and threads."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--bare", "--pin", args.pin, "--port", args.port,
           "--records", ",".join(args.records), "--threads", str(args.threads)]
    return measure(cmd, work / f"{tag}-calls.json")


def recorded(args: argparse.Namespace, work: Path) -> dict[str, Measured]:
    """The reference recorded in one process and replayed in another beside the port, each measured as
    :func:`suite` measures its run: the memory each machine needs when the two cannot share one.

    The recording process runs the reference alone (``--port none --record torch=DIR``) through the
    mtplx tests that make the runs the port tests read (:data:`RECORDING_TESTS`: the same calls, so the
    same entries); the replay process runs the port tests with ``--reference recorded:DIR``. The store's
    bytes are the recording's ``receipt_bytes["recording"]``.
    """
    store = work / "recording"
    record = suite(args, work, "record", "mtplx", RECORDING_TESTS, (f"--record=torch={store}",), port="none")
    record.receipt_bytes["recording"] = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    replay = suite(args, work, "replay", options=("--reference", f"recorded:{store}"))
    return {"record": record, "replay": replay}


def bare(args: argparse.Namespace) -> None:
    """The suite's engine work without pytest: the pin verified, both engines built (held together, as
    the suite holds them), each record's runs through the families' own functions, calls tallied."""
    from collections import Counter

    from engine_calls import ENV, count_calls

    from oracles.engines import engine_class
    from oracles.families.execution import runs as ex
    from oracles.families.execution.prompts import load_prompts
    from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot

    pin = load_pin(args.pin)
    root = snapshot_dir(pin)
    verify_snapshot(pin, root)
    memo: dict[Any, Any] = {}

    def runs(key: Any, fn: Any) -> Any:
        if key not in memo:
            memo[key] = fn()
        return memo[key]

    tally: Counter[str] = Counter()
    prompts = {r.id: r.bind(args.pin) for r in load_prompts()}
    generation = {r.id: r.bind(args.pin) for r in ex.GENERATION}
    reference = port = None
    for record_id in args.records:
        reference = reference or count_calls(engine_class("torch")(root, pin, args.threads), tally)
        port = port or count_calls(engine_class(args.port)(root, pin, args.threads), tally)
        if record_id in generation:  # test_decode_vs_reference: the port on the reference's pin shares decode
            ex.decode(runs, reference, generation[record_id])
            ex.decode_steps(runs, port, generation[record_id], shared=True)
        else:  # test_prefill_vs_reference: chat-template ids on both, then both prefills
            record = prompts[record_id]
            port.chat_ids(record.message_list)
            reference.chat_ids(record.message_list)
            ex.prefill(runs, reference, record)
            ex.prefill(runs, port, record)
    Path(os.environ[ENV]).write_text(json.dumps(dict(sorted(tally.items())), indent=1) + "\n")


def weight_bytes(pin_name: str) -> tuple[int, str]:
    """The pin's safetensors bytes (what each float32 engine holds once) and its model class."""
    from oracles.pins.pin import load_pin

    pin = load_pin(pin_name)
    return sum(d.bytes for f, d in pin.files.items() if f.endswith(".safetensors")), pin.model_class


def line(name: str, m: Measured, weights: int) -> str:
    receipt = ", ".join(f"{k} {v:,}" for k, v in sorted(m.receipt_bytes.items())) or "-"
    return (f"{name:<12} exit {m.rc}  wall {m.wall_s:7.1f} s  cpu {m.cpu_s:7.1f} s  peak RSS {m.peak_rss / 1e9:5.2f} GB "
            f"({m.peak_rss / weights:4.2f} x weights)  receipt bytes: {receipt}")


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f}" + (f" ({min(values):.3f} to {max(values):.3f})" if len(values) > 1 else "")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--pin", default=PIN)
    ap.add_argument("--port", default="mlx")
    ap.add_argument("--records", default="ping,arith", type=lambda s: [r for r in s.split(",") if r])
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="--oracle-threads on both sides; default %(default)s")
    ap.add_argument("--json", type=Path, help="also write every figure to this file")
    ap.add_argument("--no-recorded", action="store_true", help="leave out the recorded mode")
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.bare:
        bare(args)
        return 0
    weights, model_class = weight_bytes(args.pin)
    print(f"pin {args.pin} ({model_class}, {weights:,} bytes of weights), port {args.port}, records "
          f"{', '.join(args.records)}, {args.threads} thread(s), {platform.system()} {platform.machine()}", flush=True)
    out: dict[str, Any] = {"pin": args.pin, "port": args.port, "records": args.records, "weight_bytes": weights,
                           "rounds": []}
    with tempfile.TemporaryDirectory(prefix="real-size-") as tmp:
        work = Path(tmp)
        for r in range(args.rounds):
            one, plain = suite(args, work, f"suite-{r}"), bare_side(args, work, f"bare-{r}")
            print(line("one process", one, weights), f"\n{'':<12} tests (s): {one.test_seconds}", flush=True)
            print(line("bare", plain, weights), flush=True)
            same = "same engine calls" if one.calls == plain.calls else f"DIFFERENT calls: {one.calls} vs {plain.calls}"
            print(f"round {r + 1}: ratio wall {one.wall_s / plain.wall_s:.3f}, cpu {one.cpu_s / plain.cpu_s:.3f}; {same}",
                  flush=True)
            out["rounds"].append({"suite": asdict(one), "bare": asdict(plain), "same_calls": one.calls == plain.calls})
        if not args.no_recorded:
            got = recorded(args, work)
            for name, m in got.items():
                print(line(name, m, weights), f"\n{'':<12} tests (s): {m.test_seconds}", flush=True)
            out["recorded"] = {k: asdict(m) for k, m in got.items()}
    walls = [x["suite"]["wall_s"] / x["bare"]["wall_s"] for x in out["rounds"]]
    cpus = [x["suite"]["cpu_s"] / x["bare"]["cpu_s"] for x in out["rounds"]]
    if walls:
        print(f"suite / bare over {len(walls)} round(s): wall {spread(walls)}, cpu {spread(cpus)} (goal <= 1.05)")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
