"""Fingerprint throughput vs plain hashlib.sha256 over the same bytes (goal: ratio >= 0.9, fingerprinting
at least 90 % as fast as hashing alone).

A: ``oracles.checks.fingerprint.fingerprint(a)`` (finiteness check, little-endian float32 view, sha256).
B: ``hashlib.sha256(a.tobytes() view)`` over the same C-contiguous '<f4' buffer, nothing else.
The two alternate ROUNDS times in one process; the ratio of medians is B/A (1.0 = no overhead).
Also: ``row_fingerprints`` over the same [T, V] array, and ``fingerprint`` of a non-contiguous view.

Usage: python bench/fingerprint_throughput.py [--rows 1294] [--cols 49152] [--rounds 7]
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import time
from typing import Callable

import numpy as np

from oracles.checks.fingerprint import fingerprint, row_fingerprints


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1294, help="T: the readme record's prompt length; default: %(default)r")
    parser.add_argument("--cols", type=int, default=49152, help="V: SmolLM2's vocabulary; default: %(default)r")
    parser.add_argument("--rounds", type=int, default=7, help="A/B alternations; default: %(default)r")
    args = parser.parse_args()
    a = np.random.default_rng(0).standard_normal((args.rows, args.cols), dtype=np.float32)
    mb = a.nbytes / 2**20
    view = a.data.cast("B")
    assert fingerprint(a)["sha256"] == hashlib.sha256(view).hexdigest()  # same bytes hashed
    fp: list[float] = []
    plain: list[float] = []
    rows: list[float] = []
    for i in range(args.rounds):
        pair = [("A", lambda: fingerprint(a)), ("B", lambda: hashlib.sha256(view).hexdigest())]
        for name, fn in pair if i % 2 == 0 else pair[::-1]:
            (fp if name == "A" else plain).append(timed(fn))
        rows.append(timed(lambda: row_fingerprints(a)))
    t_fp, t_plain, t_rows = statistics.median(fp), statistics.median(plain), statistics.median(rows)
    t_strided = statistics.median(timed(lambda: fingerprint(a.T)) for _ in range(3))
    print(f"array [{args.rows}, {args.cols}] float32 = {mb:.0f} MiB, {args.rounds} alternating rounds, medians:")
    print(f"  hashlib.sha256          {t_plain * 1e3:8.1f} ms  {mb / t_plain:7.0f} MiB/s")
    print(f"  fingerprint             {t_fp * 1e3:8.1f} ms  {mb / t_fp:7.0f} MiB/s")
    print(f"  row_fingerprints        {t_rows * 1e3:8.1f} ms  {mb / t_rows:7.0f} MiB/s")
    print(f"  fingerprint(a.T) copy   {t_strided * 1e3:8.1f} ms  (non-contiguous: includes the transpose copy)")
    ratio = t_plain / t_fp
    print(f"throughput ratio fingerprint / hashlib = {ratio:.3f}  (goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'})")
    print(f"throughput ratio row_fingerprints / hashlib = {t_plain / t_rows:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
