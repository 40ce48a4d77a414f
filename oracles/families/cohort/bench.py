"""The cohort family's paired benchmark: serial (B one-token forwards) against cohort (one
``decode_cohort`` of B lanes) at the anchor, every trial from the anchor snapshots. Timing only: no
assertion here (the suite checks that every trial did the proven transaction).

Protocol (the DeepSeek-V4 decode proof's benchmark): a warm-up of each arm, then ``pairs`` pairs alternating which arm goes first
(serial first on even pairs, cohort first on odd), each trial on caches restored from the snapshots
and grown to the run's capacity (untimed); then the conditioned protocol, in which every measured
trial follows an untimed prime of the same arm from the snapshots (so no trial inherits the other
arm's allocator state). Every trial decodes the anchor transaction's tokens, so every trial does the
work the anchor proof held exact. Around the whole window: on Linux, swap-in/out and major page-fault
deltas from ``/proc`` (the run is marked disturbed when any is non-zero), and resident bytes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.checks.cohort import to_physical
from oracles.engines.base import Engine, digest_buffers
from oracles.families.cohort.anchor import SIDES, AnchorRun
from oracles.families.cohort.run import PHYSICAL_TO_LOGICAL

#: Pairs of trials per protocol (the DeepSeek-V4 decode proof's benchmark runs 20).
PAIRS = 20
ARMS = ("serial", "cohort")


def vm_counters() -> dict[str, int] | None:
    """System swap-ins/outs and major faults (``/proc/vmstat``: ``pswpin``, ``pswpout``,
    ``pgmajfault``) and this process's major faults (``/proc/self/stat`` field 12, ``majflt``);
    None where ``/proc`` is absent (not Linux)."""
    vmstat, stat = Path("/proc/vmstat"), Path("/proc/self/stat")
    if not vmstat.is_file() or not stat.is_file():
        return None
    fields = dict(line.split() for line in vmstat.read_text().splitlines() if line.count(" ") == 1)
    # /proc/self/stat: "pid (comm) state ..."; comm may hold spaces, so count fields after the last ')'.
    after = stat.read_text().rsplit(")", 1)[1].split()
    return {"pswpin": int(fields.get("pswpin", 0)), "pswpout": int(fields.get("pswpout", 0)),
            "pgmajfault": int(fields.get("pgmajfault", 0)), "process_majflt": int(after[9])}


def process_memory() -> dict[str, int] | None:
    """``VmRSS`` and ``VmHWM`` of this process in bytes (``/proc/self/status``), None off Linux."""
    status = Path("/proc/self/status")
    if not status.is_file():
        return None
    out = {}
    for line in status.read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            out[key] = int(value.split()[0]) * 1024  # the kernel reports kB
    return out


def fresh(engine: Engine, anchor: AnchorRun, arm: str) -> list[Any]:
    """Caches restored from the anchor snapshots of one arm, grown to the run's capacity where the
    restored cache holds less (a torch static cache keeps its capacity through a snapshot; an MLX one
    comes back at its length); restored as they are where the anchor found the caches cannot grow."""
    out = []
    for s in anchor.snapshots[arm]:
        c = engine.restore(s)
        if anchor.grow_refusal is not None:
            out.append(c)
            continue
        out.append(c if engine.cache_capacity(c) >= anchor.spec.capacity else engine.grow(c, anchor.spec.capacity))
    return out


def timed(engine: Engine, arm: str, caches: Sequence[Any],
          tokens: Sequence[int]) -> tuple[float, dict[str, float], list[dict[str, str]]]:
    """One timed transaction of ``arm``: milliseconds, the engine's counter deltas, and per lane (the
    arm's order) the digests of its hidden and logits rows (computed after the clock stops)."""
    before = engine.counters()
    start = time.perf_counter()
    if arm == "serial":
        steps = [engine.forward([int(tokens[lane])], c, keep=1) for lane, c in enumerate(caches)]
        rows = [(st.hidden[-1], st.logits[-1]) for st in steps]
    else:
        st = engine.decode_cohort(to_physical(list(tokens), PHYSICAL_TO_LOGICAL), list(caches))
        rows = list(zip(st.hidden, st.logits))
    ms = (time.perf_counter() - start) * 1000.0
    after = engine.counters()
    digests = [{"hidden": digest_buffers({"hidden": h}), "logits": digest_buffers({"logits": lg})} for h, lg in rows]
    return ms, {k: after[k] - before.get(k, 0.0) for k in after}, digests


def _order(pair: int) -> tuple[str, str]:
    return ARMS if pair % 2 == 0 else ARMS[::-1]


def _summary(serial: Sequence[float], cohort: Sequence[float]) -> dict[str, Any]:
    """Medians, even/odd-pair strata, paired deltas (serial - cohort) and ratios (serial / cohort)."""
    s, c = np.asarray(serial, float), np.asarray(cohort, float)
    deltas, ratios = s - c, s / c
    q25, q75 = np.percentile(ratios, [25, 75])
    out: dict[str, Any] = {"serial_median_ms": float(np.median(s)), "cohort_median_ms": float(np.median(c)),
                           "speedup": float(np.median(s) / np.median(c)),
                           "paired_ratio_median": float(np.median(ratios)), "paired_ratio_iqr": [float(q25), float(q75)],
                           "paired_deltas_ms": [float(x) for x in deltas]}
    for name, parity in (("even", 0), ("odd", 1)):
        ss, cc, dd = s[parity::2], c[parity::2], deltas[parity::2]
        out[f"{name}_speedup"] = float(np.median(ss) / np.median(cc))
        out[f"{name}_delta_median_ms"] = float(np.median(dd))
    return out


def run_bench(engine: Engine, anchor: AnchorRun, pairs: int = PAIRS) -> dict[str, Any]:
    """The benchmark section of the receipt (JSON-safe): every trial, the summaries of both
    protocols, the counters, resident bytes and the ``/proc`` window. Raises what the engine raises."""
    tokens = anchor.tokens
    for arm in ARMS:  # warm-up, untimed in effect (not recorded)
        timed(engine, arm, fresh(engine, anchor, arm), tokens)
    vm0 = vm_counters()
    trials: list[dict[str, Any]] = []
    for protocol in ("paired", "conditioned"):
        for pair in range(pairs):
            for position, arm in enumerate(_order(pair)):
                prime = None
                if protocol == "conditioned":
                    prime = timed(engine, arm, fresh(engine, anchor, arm), tokens)[0]
                ms, counters, digests = timed(engine, arm, fresh(engine, anchor, arm), tokens)
                trials.append({"protocol": protocol, "pair": pair, "position": position, "arm": arm, "ms": ms,
                               "prime_ms": prime, "counters": counters, "outputs": digests})
    vm1 = vm_counters()
    section: dict[str, Any] = {"engine": engine.id, "pin": engine.pin, "threads": engine.describe().get("threads"),
                               "pairs": pairs, "order": "alternating: serial first on even pairs, cohort first on odd",
                               "tokens": list(tokens), "anchor": anchor.spec.anchor, "capacity": anchor.spec.capacity,
                               "lanes": len(tokens), "trials": trials}
    for protocol in ("paired", "conditioned"):
        times = {arm: [t["ms"] for t in trials if t["protocol"] == protocol and t["arm"] == arm] for arm in ARMS}
        section[protocol] = _summary(times["serial"], times["cohort"])
    section["conditioned"]["prime_ms"] = {arm: [t["prime_ms"] for t in trials if t["protocol"] == "conditioned"
                                               and t["arm"] == arm] for arm in ARMS}
    deltas = None if vm0 is None or vm1 is None else {k: vm1[k] - vm0[k] for k in vm0}
    section["vm_window"] = {"start": vm0, "end": vm1, "deltas": deltas,
                            "disturbed": None if deltas is None else any(
                                deltas[k] for k in ("pswpin", "pswpout", "process_majflt"))}
    section["resident_bytes"] = resident(engine, anchor)
    return section


def resident(engine: Engine, anchor: AnchorRun) -> dict[str, Any]:
    """Weights, live caches (one restored and grown set per arm), snapshots, and the process's RSS."""
    live = {arm: sum(engine.resident_bytes(c) for c in fresh(engine, anchor, arm)) for arm in SIDES}
    snaps = {arm: sum(engine.resident_bytes(s) for s in anchor.snapshots[arm]) for arm in SIDES}
    return {"weights": engine.weight_bytes(), "live_caches": live, "snapshots": snaps, "process": process_memory()}
