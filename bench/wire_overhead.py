"""The wire's cost against the same engine in process, side by side in one run: a one-token cached decode,
a 512-token prefill (every row's logits: 512 x 49,152 float32, 100.7 MB through the pipe) and a 4-lane
cohort step (``decode_cohort``), each as the median of ROUNDS calls made in turn (in process, over the
wire, in process, ...) so the machine's drift touches both alike; printed as milliseconds and the ratio
wire / in process. Then the wire's floor: a call that carries no array and computes nothing
(``cache_length(None)``), microseconds a round trip.

Pairs (each the same computation on both sides, bit-equal results checked once):

- ``llamacpp`` in process vs the C harness (``harness/build/oracles-wire-llama``) over stdio, on the F32
  GGUF ``smollm2-gguf-f32`` (no cohort step: llama.cpp's engine has no batched decode);
- ``torch`` in process vs ``oracles serve torch --stdio`` over stdio, on ``smollm2-135m-instruct``.

Usage: python bench/wire_overhead.py [--rounds 7] [--threads 1] [--skip-torch]
Needs the built harness (``make harness``) and both pins materialised. Not part of ``make test``.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PREFILL = 512


def _wire(name: str, address: str, pin: Any, root: Path, threads: int) -> Any:
    from oracles.engines.wire.client import wire_class
    from oracles.engines.wire.config import Target

    return wire_class(Target(name, address, ROOT))(root, pin, threads)


def _cases(engine: Any, ids: list[int]) -> dict[str, Callable[[], Any]]:
    """The timed calls on one engine (a cache warmed with 64 ids for the decode; four lanes for the cohort)."""
    cache = engine.make_cache()
    engine.forward(ids[:64], cache)

    def decode() -> Any:
        out = engine.forward([ids[64]], cache, keep=1)
        engine.trim(cache, 1)
        return out.logits

    cases: dict[str, Callable[[], Any]] = {"one-token decode": decode,
                                          f"{PREFILL}-token prefill": lambda: engine.forward(ids[:PREFILL]).logits}
    try:  # an engine without a batched decode (llama.cpp's) has no cohort case
        snap = engine.snapshot(cache)
        lanes = [engine.restore(snap) for _ in range(4)]
        engine.decode_cohort(ids[65:69], lanes)
        for lane in lanes:
            engine.trim(lane, 1)
    except NotImplementedError:
        return cases

    def cohort() -> Any:
        out = engine.decode_cohort(ids[65:69], lanes)
        for lane in lanes:
            engine.trim(lane, 1)
        return out.logits

    cases["4-lane cohort step"] = cohort
    return cases


def pair(label: str, near: Any, far: Any, ids: list[int], rounds: int) -> list[str]:
    """Time each case on both engines in turn; one line per case."""
    a, b = _cases(near, ids), _cases(far, ids)
    lines = []
    for case in a:
        if case not in b:
            continue
        same = np.array_equal(np.asarray(a[case]()), np.asarray(b[case]()))
        times: dict[str, list[float]] = {"near": [], "far": []}
        for _ in range(rounds):
            for side, fn in (("near", a[case]), ("far", b[case])):
                start = time.perf_counter()
                fn()
                times[side].append(time.perf_counter() - start)
        n, f = statistics.median(times["near"]) * 1e3, statistics.median(times["far"]) * 1e3
        lines.append(f"{label:<38} {case:<20} {n:>10.2f} {f:>10.2f} {f / n:>7.3f}  {'bit-equal' if same else 'DIFFER'}")
    return lines


def floor(label: str, far: Any, calls: int = 300) -> str:
    """The wire's own cost of a call: ``cache_length(None)`` (no arrays, nothing computed), microseconds."""
    start = time.perf_counter()
    for _ in range(calls):
        far.cache_length(None)
    return f"{label:<38} {'call round trip':<20} {'':>10} {(time.perf_counter() - start) / calls * 1e6:>8.0f} us"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--skip-torch", action="store_true")
    args = parser.parse_args()
    from oracles.pins.pin import load_pin, snapshot_dir

    ids = [int(i) for i in np.random.default_rng(0).integers(100, 40000, PREFILL + 8)]
    print(f"{'pair':<38} {'case':<20} {'in proc ms':>10} {'wire ms':>10} {'ratio':>7}")
    from oracles.engines.llamacpp.engine import LlamaCppPort

    gguf = load_pin("smollm2-gguf-f32")
    near = LlamaCppPort(snapshot_dir(gguf), gguf, args.threads)
    far = _wire("c-llama", str(ROOT / "harness/build/oracles-wire-llama"), gguf, snapshot_dir(gguf), args.threads)
    for line in pair("llamacpp vs C harness (stdio)", near, far, ids, args.rounds):
        print(line, flush=True)
    print(floor("C harness (stdio)", far), flush=True)
    far.close()
    if args.skip_torch:
        return
    from oracles.engines.torch.reference import TorchReference

    ref = load_pin("smollm2-135m-instruct")
    reference = TorchReference(snapshot_dir(ref), ref, args.threads)
    serve = f"{sys.executable} -m oracles.cli serve torch --pin {ref.name} --stdio --threads {args.threads}"
    far = _wire("served", serve, ref, snapshot_dir(ref), args.threads)
    for line in pair("torch vs oracles serve torch (stdio)", reference, far, ids, args.rounds):
        print(line, flush=True)
    print(floor("oracles serve torch (stdio)", far), flush=True)
    far.close()


if __name__ == "__main__":
    main()
