"""Plugin overhead: 1,000 trivial parametrized tests with receipts on vs ``--no-receipt``
(issue 2: ratio goal <= 1.05).

Both runs are whole ``python -m pytest`` processes on a generated test file in a temporary folder,
alternating A (receipts on: partial log line per test, receipt with environment, checks table) and
B (``--no-receipt``) ROUNDS times; the ratio is of the medians of wall time, A/B.
``--profile`` instead prints the top of a cProfile of one receipts-on run (in-process).

Usage: python bench/plugin_overhead.py [--tests 1000] [--rounds 7] [--profile]
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

SUITE = """
import pytest

@pytest.mark.parametrize("i", range({n}))
def test_trivial(i, receipt):
    receipt["i"] = i
"""


def run(folder: Path, *extra: str) -> float:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_bench.py", *extra]
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=folder, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"pytest failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return seconds


def profile(folder: Path) -> None:
    import cProfile
    import pstats

    import pytest

    os.chdir(folder)
    prof = cProfile.Profile()
    prof.enable()
    pytest.main(["-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_bench.py", "--receipts-dir", "prof"])
    prof.disable()
    stats = pstats.Stats(prof)
    stats.sort_stats("cumulative").print_stats(r"oracles/", 25)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tests", type=int, default=1000, help="parametrized tests; default: %(default)r")
    parser.add_argument("--rounds", type=int, default=7, help="A/B alternations; default: %(default)r")
    parser.add_argument("--profile", action="store_true", help="profile one receipts-on run instead")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="oracles-bench-") as tmp:
        folder = Path(tmp)
        (folder / "test_bench.py").write_text(SUITE.format(n=args.tests))
        if args.profile:
            profile(folder)
            return 0
        run(folder, "--no-receipt")  # warm-up: page cache, .pyc files
        on, off = [], []
        for i in range(args.rounds):
            pair = [("on", ("--receipts-dir", f"r{i}")), ("off", ("--no-receipt",))]
            for name, extra in pair if i % 2 == 0 else pair[::-1]:
                (on if name == "on" else off).append(run(folder, *extra))
        receipts = sorted(folder.glob("r*/default/*.json"))
        assert len(receipts) == args.rounds, f"expected {args.rounds} receipts, found {len(receipts)}"
    t_on, t_off = statistics.median(on), statistics.median(off)
    print(f"{args.tests} trivial parametrized tests, {args.rounds} alternating rounds, whole-process wall medians:")
    print(f"  receipts on    {t_on:7.3f} s   (min {min(on):.3f}, max {max(on):.3f})")
    print(f"  --no-receipt   {t_off:7.3f} s   (min {min(off):.3f}, max {max(off):.3f})")
    ratios = [a / b for a, b in zip(on, off)]
    ratio = t_on / t_off
    print(f"overhead ratio on/off = {ratio:.3f} (pairwise median {statistics.median(ratios):.3f}); "
          f"goal <= 1.05: {'met' if ratio <= 1.05 else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
