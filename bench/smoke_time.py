"""Wall time of the CI smoke, ``pytest -m dry`` (what ``make smoke`` runs), issue 2 goal: under 10 s.

A: ``python -m pytest -m dry`` in the project root (receipt written to a temporary folder).
B: ``python -m pytest -m dry --collect-only -q``: start-up and collection alone.
They alternate ROUNDS times as whole processes; medians, and A/B says how much of the smoke is
running tests rather than starting pytest and collecting.

Usage: python bench/smoke_time.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 10.0


def run(*args: str) -> tuple[float, str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "dry", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    seconds = time.perf_counter() - start
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    if done.returncode not in (0, 1):
        raise SystemExit(f"pytest -m dry {' '.join(args)} exited {done.returncode}: {last}")
    return seconds, last


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="A/B alternations; default: %(default)r")
    args = parser.parse_args()
    full: list[float] = []
    collect: list[float] = []
    with tempfile.TemporaryDirectory(prefix="oracles-smoke-") as tmp:
        run("--collect-only", "-q")  # warm-up: page cache, .pyc files
        last = ""
        for i in range(args.rounds):
            pair = [("A", (f"--receipts-dir={tmp}",)), ("B", ("--collect-only", "-q"))]  # "=": see oracles.plugin.options.check_path_words
            for name, extra in pair if i % 2 == 0 else pair[::-1]:
                seconds, summary = run(*extra)
                (full if name == "A" else collect).append(seconds)
                last = summary if name == "A" else last
    t_full, t_collect = statistics.median(full), statistics.median(collect)
    print(f"pytest -m dry, {args.rounds} alternating rounds, whole-process wall medians (last: {last}):")
    print(f"  A  pytest -m dry               {t_full:6.2f} s  (min {min(full):.2f}, max {max(full):.2f})")
    print(f"  B  pytest -m dry --collect-only {t_collect:5.2f} s  (min {min(collect):.2f}, max {max(collect):.2f})")
    print(f"ratio A/B = {t_full / t_collect:.2f}; goal A < {GOAL_SECONDS:g} s: {'met' if t_full < GOAL_SECONDS else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
