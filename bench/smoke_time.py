"""Wall and CPU time of the CI smoke, ``pytest -m dry`` (what ``make smoke`` runs); goal: under 5 s.

A: ``python -m pytest -m dry`` in the project root (receipt written to a temporary folder).
B: ``python -m pytest -m dry --collect-only -q``: start-up and collection alone; its last line gives
   the counts (tests selected / collected, deselected).
They alternate ROUNDS times as whole processes, after one warm-up of each; printed: the medians of
wall and of CPU (user + sys of the child), min and max beside them. On a shared machine the CPU
figure is the steadier one: wall time there is mostly waiting for a core.

``--baseline PATH`` runs the same two commands in another checkout too (its own tests, its ``oracles``
imported from there with ``PYTHONPATH=PATH``), its runs taken in turn with this tree's, A A' B B' ...,
so a change is judged against the code before it under the same drift of the machine.

The children may write bytecode (``PYTHONDONTWRITEBYTECODE`` dropped, ``PYTHONPYCACHEPREFIX`` a
temporary folder that the warm-up fills), as a checkout that has run its tests once has; without it
every run compiles, and assertion-rewrites, each test module again. ``--no-bytecode`` measures that.

Usage: python bench/smoke_time.py [--rounds 5] [--baseline PATH] [--no-bytecode]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOAL_SECONDS = 5.0


@dataclass
class Side:
    """One checkout's runs: ``root`` (its pytest.ini and tests), ``pythonpath`` (None: the installed one)."""

    label: str
    root: Path
    pythonpath: str | None
    wall: dict[str, list[float]] = field(default_factory=lambda: {"A": [], "B": []})
    cpu: dict[str, list[float]] = field(default_factory=lambda: {"A": [], "B": []})
    counts: str = ""


def child_env(cache: Path | None, pythonpath: str | None) -> dict[str, str]:
    """This environment, offline; with ``cache``, bytecode allowed and kept there (module docstring)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    if cache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def run(side: Side, args: tuple[str, ...], cache: Path | None) -> tuple[float, float, str]:
    """(wall seconds, CPU seconds, last output line) of one ``pytest -m dry`` process.

    Raises:
        SystemExit: pytest exited with neither 0 nor 1 (its last line shown).
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "pytest", "-m", "dry", *args], cwd=side.root,
                          env=child_env(cache, side.pythonpath), capture_output=True, text=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr[-300:]
    if done.returncode not in (0, 1):
        raise SystemExit(f"{side.label}: pytest -m dry {' '.join(args)} exited {done.returncode}: {last}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu, last


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):6.2f} s (min {min(values):.2f}, max {max(values):.2f})"


def report(side: Side) -> None:
    print(f"{side.label} ({side.counts}):")
    for name, what in (("A", "pytest -m dry               "), ("B", "pytest -m dry --collect-only")):
        print(f"  {name}  {what}  wall {spread(side.wall[name])}  cpu {spread(side.cpu[name])}")
    full = statistics.median(side.wall["A"])
    print(f"  A/B wall = {full / statistics.median(side.wall['B']):.2f}; goal A < {GOAL_SECONDS:g} s: "
          f"{'met' if full < GOAL_SECONDS else 'NOT met'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="alternations; default: %(default)r")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="also time the checkout at PATH, its runs in turn with this tree's")
    parser.add_argument("--no-bytecode", action="store_true", help="keep the environment's bytecode setting")
    args = parser.parse_args()
    sides = [Side("this tree", ROOT, None)]
    if args.baseline:
        sides.append(Side(f"baseline {args.baseline}", Path(args.baseline).resolve(), str(Path(args.baseline).resolve())))
    with tempfile.TemporaryDirectory(prefix="oracles-smoke-") as tmp:
        cache = None if args.no_bytecode else Path(tmp) / "pycache"
        commands = {"A": (f"--receipts-dir={tmp}/receipts",), "B": ("--collect-only", "-q")}  # "=": options.check_path_words
        for side in sides:  # warm-up: page cache, bytecode
            for extra in commands.values():
                run(side, extra, cache)
        for i in range(args.rounds):
            for name in ("AB" if i % 2 == 0 else "BA"):
                for side in sides:
                    wall, cpu, last = run(side, commands[name], cache)
                    side.wall[name].append(wall)
                    side.cpu[name].append(cpu)
                    side.counts = last if name == "B" else side.counts
    print(f"pytest -m dry, {args.rounds} alternating rounds, whole processes, medians; bytecode "
          f"{'as the environment has it' if args.no_bytecode else 'written and reused'}:")
    for side in sides:
        report(side)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
