"""Execution oracles: pytest suite vs a bare script doing the same forwards and generations.

Runs, one after the other in this one invocation (same machine state, side by side):
  1. ``pytest -m "mtplx or mtplx_chat or port" --runslow -p no:randomly`` (receipt written), timed;
  2. this file with ``--bare``: the same engines loaded once, the same pins verified, the same runs
     through the same oracles.families functions, no pytest; timed.
Prints both wall times and the ratio (goal: at most 1.05). ``--rounds N`` repeats the pair.

Usage: ORACLES_HOME=/tmp/oh python bench/execution_overhead.py [--rounds 1] [--threads 0]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What the default run skips on a port (--port-records sample: oracles/families/port_scope.py).
PORT_MAX_TOKENS = 256  # = oracles.families.port_scope.EXECUTION_SAMPLE_TOKENS; kept literal so the bench imports nothing first


def bare(threads: int) -> None:
    """The suite's heavy work without pytest: pins verified, engines loaded, every run once."""
    sys.path.insert(0, str(ROOT))
    from oracles.engines import engine_class, resolve_ports
    from oracles.families.execution import runs as ex
    from oracles.families.execution.prompts import load_prompts
    from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot

    memo: dict = {}

    def runs(key, fn):
        if key not in memo:
            memo[key] = fn()
        return memo[key]

    loaded: dict = {}

    def engines(engine_id: str, pin: str = "smollm2-135m-instruct"):
        if (engine_id, pin) not in loaded:
            p = load_pin(pin)
            verify_snapshot(p, snapshot_dir(p))
            loaded[engine_id, pin] = engine_class(engine_id)(snapshot_dir(p), p, threads)
        return loaded[engine_id, pin]

    ids = ["torch", *resolve_ports("auto", "torch")]
    for engine_id in ids:
        e = engines(engine_id)
        port = engine_id != "torch"
        for rec in (r.bind(e.pin) for r in load_prompts()):
            if not (port and len(rec.ids) > PORT_MAX_TOKENS):
                ex.prefill(runs, e, rec)
        for rec in (r.bind(e.pin) for r in ex.GENERATION):
            ex.decode(runs, e, rec)
            for mode in ("greedy", "sampled"):
                ex.generate(runs, e, rec, mode, 1)
                ex.generate(runs, e, rec, mode, 2)
            ex.speculative(runs, engines, e, rec, "self")
            ex.speculative(runs, engines, e, rec, "twin")
            ex.library_speculative(runs, engines, e, rec, "twin")
            if engine_id != "torch" and rec.id == "arith":
                ex.windowed_generate(runs, e, rec, ex.KV_WINDOW)
                ex.library_speculative(runs, engines, e, rec, "twin", ex.KV_WINDOW)
        for chat in ex.CHATS:
            if not (port and chat.port_tokens(e.pin) > PORT_MAX_TOKENS):
                ex.chat(runs, e, chat)


def timed(cmd: list[str]) -> tuple[float, int]:
    start = time.perf_counter()
    rc = subprocess.call(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start, rc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bare", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0, help="--oracle-threads for both sides; default %(default)s")
    args = ap.parse_args()
    if args.bare:
        bare(args.threads)
        return 0
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    py = sys.executable
    suite = [py, "-m", "pytest", "oracles/suite", "-m", "mtplx or mtplx_chat or port", "--runslow", "-p", "no:randomly", "-q",
             "--receipt-tag", "bench-execution", "--oracle-threads", str(args.threads)]
    script = [py, str(Path(__file__).resolve()), "--bare", "--threads", str(args.threads)]
    for r in range(args.rounds):
        t_suite, rc_suite = timed(suite)
        t_bare, rc_bare = timed(script)
        print(f"round {r + 1}: pytest suite {t_suite:.1f} s (exit {rc_suite}), bare script {t_bare:.1f} s "
              f"(exit {rc_bare}), ratio {t_suite / t_bare:.3f} (goal <= 1.05)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
