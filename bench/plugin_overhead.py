"""Plugin overhead on 1,000 trivial tests, whole ``python -m pytest`` processes, paired runs.

Two comparisons (goals: installed but off <= 1.01 x ``-p no:oracles``; receipts on <= 1.02 x
``--no-receipt``), each measured as N pairs run alternately in this one invocation, A B A B ...,
the ratio A/B taken pair by pair (a pair's two runs are seconds apart, so a drift of the
shared machine's speed cancels within a pair); printed: the median pair ratio and its spread (min,
quartiles, max), wall and CPU (user + sys of the child):

* **enabled**: a project whose ini says ``oracles = true``, its 1,000 tests each attaching one value
  with the ``receipt`` fixture; A = receipts on (partial log line per test, receipt, environment
  probe), B = ``--no-receipt``. Goal: median <= 1.02.
* **not enabled**: a project with pytest-oracles installed and no ``oracles`` ini key, 1,000 plain
  tests; A = as is, B = ``-p no:oracles`` (the plugin not loaded at all). Goal: median <= 1.01.

The children may write bytecode (``PYTHONDONTWRITEBYTECODE`` dropped, ``PYTHONPYCACHEPREFIX`` a
temporary folder): an installed package's modules are compiled once, at install; compiling the
plugin's modules in every run (~1 ms each here) would be a cost no user pays. The warm-up runs
compile them.

``--baseline PATH`` measures the plugin of another checkout too (its children run with
``PYTHONPATH=PATH``), its pairs taken in turn with this tree's, A B A' B' ..., so a change is judged
against the code before it in one run, under the same drift of the machine.

``--profile enabled|off`` prints the top of a cProfile of one run of that kind (in-process) instead.

``--instructions`` counts instead the instructions each side executes, under valgrind's callgrind (one run each,
``PYTHONHASHSEED=0``; about 25 s a run). On this shared machine wall-clock pairs spread over several times the
goals' margins (0.86 to 1.06 for the off comparison); an instruction count repeats to a few parts in a million
where the run does the same work (the receipts' names and times vary it by ~1 %), and a second run of each
side shows how much.

Usage: python bench/plugin_overhead.py [--tests 1000] [--pairs 9] [--only enabled|off] [--baseline PATH]
       [--profile KIND] [--instructions]
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

ENABLED_SUITE = """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_trivial(i, receipt):
    receipt["i"] = i
"""
PLAIN_SUITE = """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_trivial(i):
    assert i >= 0
"""
BASE = ("-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_bench.py")


@dataclass(frozen=True)
class Comparison:
    """One A/B comparison: its project's ini text, test file, A's and B's extra arguments, the goal."""

    name: str
    ini: str
    suite: str
    a: tuple[str, ...]
    b: tuple[str, ...]
    goal: float


def comparisons(n: int) -> dict[str, Comparison]:
    return {
        "enabled": Comparison("enabled: receipts on vs --no-receipt", "[pytest]\noracles = true\n",
                              ENABLED_SUITE.format(n=n), ("--receipts-dir=receipts",), ("--no-receipt",), 1.02),
        "off": Comparison("installed, not enabled vs -p no:oracles", "[pytest]\n", PLAIN_SUITE.format(n=n),
                          (), ("-p", "no:oracles"), 1.01),
    }


def child_env(folder: Path, pythonpath: str | None = None) -> dict[str, str]:
    """This environment, bytecode allowed and kept in ``folder/pycache`` (module docstring); with
    ``pythonpath``, the plugin imported from there (a baseline checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder.parent / "pycache")
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    return env


def run(folder: Path, extra: tuple[str, ...], pythonpath: str | None = None) -> tuple[float, float]:
    """(wall seconds, CPU seconds user+sys) of one whole pytest process in ``folder``.

    Raises:
        SystemExit: pytest did not pass (its output's tail shown).
    """
    cmd = [sys.executable, "-m", "pytest", *BASE, *extra]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=child_env(folder, pythonpath))
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def spread(ratios: list[float]) -> str:
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return f"min {min(ratios):.3f}, q1 {q[0]:.3f}, q3 {q[2]:.3f}, max {max(ratios):.3f}"


@dataclass
class Pairs:
    """The pairs of one side (this tree, or a baseline checkout): wall and CPU seconds of A and B."""

    label: str
    pythonpath: str | None
    seconds: list[tuple[float, float]] = field(default_factory=list)
    cpu: list[tuple[float, float]] = field(default_factory=list)

    def report(self, cmp: Comparison) -> float:
        """Print this side's pair ratios; returns the median wall ratio."""
        wall = [a / b for a, b in self.seconds]
        cpu = [a / b for a, b in self.cpu]
        median = statistics.median(wall)
        print(f"  {self.label}:")
        print(f"    wall A median {statistics.median(s[0] for s in self.seconds):.3f} s, "
              f"B {statistics.median(s[1] for s in self.seconds):.3f} s")
        print(f"    wall ratio A/B, pair by pair: median {median:.3f} ({spread(wall)})")
        print(f"    CPU  ratio A/B, pair by pair: median {statistics.median(cpu):.3f} ({spread(cpu)})")
        print(f"    goal <= {cmp.goal}: {'met' if median <= cmp.goal else 'NOT met'}")
        return median


def measure(cmp: Comparison, folder: Path, pairs: int, baseline: str | None = None) -> float:
    """Run ``pairs`` A/B pairs (after one warm-up of each), a baseline's pairs in turn with them, and
    print the pair ratios; returns this tree's median wall ratio."""
    folder.mkdir()
    (folder / "pytest.ini").write_text(cmp.ini)
    (folder / "test_bench.py").write_text(cmp.suite)
    sides = [Pairs("this tree", None)] + ([Pairs(f"baseline {baseline}", baseline)] if baseline else [])
    for side in sides:  # warm-up: page cache, .pyc files
        run(folder, cmp.a, side.pythonpath), run(folder, cmp.b, side.pythonpath)
    for _ in range(pairs):
        for side in sides:
            (wa, ca), (wb, cb) = run(folder, cmp.a, side.pythonpath), run(folder, cmp.b, side.pythonpath)
            side.seconds.append((wa, wb))
            side.cpu.append((ca, cb))
    order = "A B A' B' ..." if baseline else "A B A B ..."
    print(f"{cmp.name} (A {' '.join(cmp.a) or '(as is)'}; B {' '.join(cmp.b)}), {pairs} pairs {order}:")
    return [side.report(cmp) for side in sides][0]


def instructions(folder: Path, extra: tuple[str, ...]) -> int:
    """Instructions one whole pytest process in ``folder`` executes, counted by valgrind's callgrind
    (``Collected :`` of its summary), the hash seed fixed.

    Raises:
        SystemExit: valgrind is not installed, pytest did not pass, or no count was printed.
    """
    import re
    import shutil

    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--instructions needs valgrind (Debian's valgrind package)")
    cmd = [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m", "pytest", *BASE, *extra]
    env = {**child_env(folder), "PYTHONHASHSEED": "0"}
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True, env=env)
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return int(found.group(1))


def count(cmp: Comparison, folder: Path, runs: int = 2) -> float:
    """``runs`` instruction counts of A and of B, in turn after one warm-up of each (the .pyc files); prints them
    and the ratio of their medians; returns it."""
    folder.mkdir()
    (folder / "pytest.ini").write_text(cmp.ini)
    (folder / "test_bench.py").write_text(cmp.suite)
    run(folder, cmp.a), run(folder, cmp.b)
    a, b = [], []
    for _ in range(runs):
        a.append(instructions(folder, cmp.a))
        b.append(instructions(folder, cmp.b))
    ratio = statistics.median(a) / statistics.median(b)
    print(f"{cmp.name} (A {' '.join(cmp.a) or '(as is)'}; B {' '.join(cmp.b)}), instructions, {runs} runs each:")
    print(f"    A {', '.join(f'{n:,}' for n in a)}")
    print(f"    B {', '.join(f'{n:,}' for n in b)}")
    print(f"    ratio of the medians A/B {ratio:.4f}; goal <= {cmp.goal}: {'met' if ratio <= cmp.goal else 'NOT met'}")
    return ratio


def profile(cmp: Comparison, folder: Path) -> None:
    """cProfile of one in-process run of A, the plugin's functions sorted by cumulative time."""
    import cProfile
    import pstats

    import pytest

    folder.mkdir()
    (folder / "pytest.ini").write_text(cmp.ini)
    (folder / "test_bench.py").write_text(cmp.suite)
    os.chdir(folder)
    prof = cProfile.Profile()
    prof.enable()
    pytest.main([*BASE, *cmp.a])
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(r"oracles/", 30)


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tests", type=int, default=1000, help="trivial parametrized tests; default: %(default)r")
    parser.add_argument("--pairs", type=int, default=9, help="A/B pairs per comparison; default: %(default)r")
    parser.add_argument("--only", choices=("enabled", "off"), default=None, help="run one comparison")
    parser.add_argument("--baseline", default=None, metavar="PATH",
                        help="also measure the plugin of the checkout at PATH, its pairs in turn with this tree's")
    parser.add_argument("--profile", choices=("enabled", "off"), default=None, help="profile one run of A instead")
    parser.add_argument("--instructions", action="store_true",
                        help="count each side's instructions under valgrind's callgrind instead of timing pairs")
    args = parser.parse_args()
    table = comparisons(args.tests)
    with tempfile.TemporaryDirectory(prefix="oracles-bench-") as tmp:
        if args.profile:
            profile(table[args.profile], Path(tmp) / args.profile)
            return 0
        for key in [args.only] if args.only else list(table):
            if args.instructions:
                count(table[key], Path(tmp) / key)
            else:
                measure(table[key], Path(tmp) / key, args.pairs, args.baseline)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
