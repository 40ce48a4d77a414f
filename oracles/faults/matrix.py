"""The detection matrix: the suite's checks, held to one port's family runs (and the reference's).

Every check here is the suite's own. A port held against the reference goes through
:func:`oracles.checks.port.port_figures` / :func:`threshold_failures` (logits),
:func:`readout_figures` / :func:`readout_failures` (d1 read-outs) and :func:`first_divergence`
(tokens), as the port family does. A family's self-consistency check holds the port against *itself*
with the function its family's test calls: cached vs recomputed and warm vs cold through
:func:`oracles.checks.cache.cache_failure`; cohort vs serial through
:func:`oracles.checks.cohort.serial_gap_failure`, the cohort test's bound and criteria. Tree vs
row uses the read-out threshold (``max_abs_dp``), looser than the d1 test's
``tree_row_dp`` (1e-4), so a catch here is a catch there. So a check that catches a fault here is one
the suite makes.

Each check takes the port's bounds (``tolerance``, a :class:`oracles.checks.tolerance.Tolerance`; a
tokens check applies none) and returns None (passed) or its first failure, one line naming record and
position. Pure: numpy and the family run objects; no engine is called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from oracles.checks.cache import cache_failure
from oracles.checks.cohort import serial_gap_failure
from oracles.checks.port import (
    compared_rows,
    first_divergence,
    port_figures,
    readout_failures,
    readout_figures,
    threshold_failures,
)
from oracles.checks.tolerance import FLOAT32, Tolerance
from oracles.engines.base import Generation, Step, Unsupported

if TYPE_CHECKING:
    from oracles.families.d1.run import RequestRun, TreeRun
    from oracles.families.execution.chat import ChatRun
    from oracles.families.execution.decode import DecodeRun
    from oracles.families.execution.speculative import SpeculativeRun
    from oracles.faults.panel import CohortRun

#: Outcome of one check on one port: caught, passed, not applicable (the engine lacks the family's
#: capability, its reason kept), untouched (the fault is not on the family's path; not run).
CAUGHT, PASSED, NOT_APPLICABLE, UNTOUCHED = "caught", "passed", "n/a", "untouched"


def logits_failure(what: str, ref: np.ndarray, port: np.ndarray, *, tolerance: Tolerance = FLOAT32) -> str | None:
    """First threshold of ``tolerance`` a port's logits pass against the reference's
    (:func:`oracles.checks.port.threshold_failures`), or None."""
    try:
        fails = threshold_failures(port_figures(ref, port), tolerance=tolerance)
    except ValueError as exc:  # shapes differ, a NaN: named by port_figures
        return f"{what}: {exc}"
    return f"{what}: {fails[0]}" + (f" (+{len(fails) - 1} more)" if len(fails) > 1 else "") if fails else None


def tokens_failure(what: str, ref: list[int], port: list[int], sides: tuple[str, str] = ("reference", "port")) -> str | None:
    """Where two token lists first differ (``sides`` name them in the message), or None."""
    d = first_divergence(ref, port)
    if d is None:
        return None
    a = ref[d] if d < len(ref) else "<end>"
    b = port[d] if d < len(port) else "<end>"
    return (f"{what}: tokens differ first at position {d}: {sides[0]} {a} vs {sides[1]} {b} "
            f"(lengths {len(ref)}, {len(port)})")


def _first(*messages: str | None) -> str | None:
    return next((m for m in messages if m), None)


def forward_port(ref: Step, port: Step, *, tolerance: Tolerance = FLOAT32) -> str | None:
    return logits_failure("ping: prefill logits [row, token]", ref.logits, port.logits, tolerance=tolerance)


def decode_port(ref: DecodeRun, port: DecodeRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    n = compared_rows(ref.tokens, port.tokens)
    return _first(logits_failure("arith: decode step logits [step, token]", ref.step_logits[:n], port.step_logits[:n],
                                 tolerance=tolerance),
                  tokens_failure("arith: greedy decode", ref.tokens, port.tokens))


def decode_recompute(_ref: DecodeRun, port: DecodeRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    """The mtplx decode test's cache check (:func:`oracles.checks.cache.cache_failure`) on the port's run."""
    for s in sorted(port.recomputed):
        msg = cache_failure(f"arith: decode step {s} (prefix {len(port.prompt) + s} ids)", port.step_logits[s],
                            port.recomputed[s], tolerance=tolerance)
        if msg:
            return msg
    return None


def generation_port(ref: Generation, port: Generation, *, tolerance: Tolerance = FLOAT32) -> str | None:
    n = compared_rows(ref.tokens, port.tokens)
    return _first(logits_failure("arith: greedy generation step logits [step, token]", ref.step_logits[:n],
                                 port.step_logits[:n], tolerance=tolerance),
                  tokens_failure("arith: greedy generation", ref.tokens, port.tokens))


def generation_vs_decode(port_runs: dict[str, Any], *, tolerance: Tolerance = FLOAT32) -> str | None:
    return tokens_failure("arith: the port's library greedy generation vs its decode loop",
                          port_runs["decode"].tokens, port_runs["generation"].tokens, ("decode loop", "generation"))


def speculative_port(ref: SpeculativeRun, port: SpeculativeRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    return tokens_failure("arith: speculative (twin draft) committed", ref.tokens, port.tokens)


def speculative_vs_greedy(port_runs: dict[str, Any], *, tolerance: Tolerance = FLOAT32) -> str | None:
    return tokens_failure("arith: the port's speculative cycles (twin draft) vs its own greedy decode",
                          port_runs["decode"].tokens, port_runs["speculative"].tokens, ("greedy", "speculative"))


def chat_port(ref: ChatRun, port: ChatRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    if len(port.turns) != len(ref.turns):
        return (f"{ref.record_id}: the port ran {len(port.turns)} turns, the reference {len(ref.turns)} "
                f"(port: {port.stopped}; reference: {ref.stopped})")
    for a, b in zip(ref.turns, port.turns):
        where = f"{ref.record_id} turn {a.index + 1}"
        msg = _first(tokens_failure(f"{where}: suffix ids", a.suffix, b.suffix),
                     logits_failure(f"{where}: warm next-token logits [0, token]", a.warm[None], b.warm[None],
                                    tolerance=tolerance),
                     tokens_failure(f"{where}: tokens", a.tokens, b.tokens))
        if msg:
            return msg
    return None


def chat_warm_cold(_ref: ChatRun, port: ChatRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    """The mtplx_chat warm-vs-cold test's check (:func:`oracles.checks.cache.cache_failure`) on the port's run."""
    for t in port.turns:
        msg = cache_failure(f"{port.record_id} turn {t.index + 1} ({len(t.frontier) + len(t.suffix)} ids), warm",
                            t.warm, t.cold, tolerance=tolerance)
        if msg:
            return msg
    return None


def chat_replay(_ref: ChatRun, port: ChatRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    for t in port.turns:
        msg = tokens_failure(f"{port.record_id} turn {t.index + 1}: the pre-turn snapshot restored and teacher-forced",
                             t.tokens, t.replay, ("turn", "replay"))
        if msg:
            return msg
    return None


def _readout(where: str, keys: list[str], ref: list[float], port: list[float], tolerance: Tolerance) -> str | None:
    fails = readout_failures(readout_figures(keys, ref, port), tolerance=tolerance)
    return f"{where}: {fails[0]}" if fails else None


def _tree(run: RequestRun) -> TreeRun:
    """The tree pass of a d1 run.

    Raises:
        ValueError: none ran (fewer than two of the request's questions have rows for the pin), so a
            check that reads it cannot be made (an error of the panel, not a pass).
    """
    if run.tree is None:
        raise ValueError(f"fact_water on {run.engine}: no tree pass ran ({len(run.rows)} question(s) with rows); "
                         "the tree checks need two or more")
    return run.tree


def d1_port(ref: RequestRun, port: RequestRun, keys: dict[str, list[str]], *,
            tolerance: Tolerance = FLOAT32) -> str | None:
    for qid, row in ref.rows.items():
        msg = _first(_readout(f"fact_water/{qid} row: read-out", keys[qid], row.probs, port.rows[qid].probs, tolerance),
                     logits_failure(f"fact_water/{qid} row: slot logits [0, token]", row.logits, port.rows[qid].logits,
                                    tolerance=tolerance))
        if msg:
            return msg
    for k, qid in enumerate(keys):
        msg = _readout(f"fact_water/{qid} tree branch: read-out", keys[qid], _tree(ref).probs[k], _tree(port).probs[k],
                       tolerance)
        if msg:
            return msg
    return None


def d1_tree_row(_ref: RequestRun, port: RequestRun, keys: dict[str, list[str]], *,
                tolerance: Tolerance = FLOAT32) -> str | None:
    for k, qid in enumerate(keys):
        msg = _readout(f"fact_water/{qid}: tree branch vs row (row on the reference side)", keys[qid],
                       port.rows[qid].probs, _tree(port).probs[k], tolerance)
        if msg:
            return msg
    return None


def cohort_port(ref: CohortRun, port: CohortRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    for b, lane in enumerate(ref.lanes):
        n = compared_rows(ref.tokens_serial[b][1:], port.tokens_cohort[b][1:])
        msg = _first(logits_failure(f"{lane}: cohort step logits [step, token] vs the reference's lane alone",
                                    ref.serial[b, :n], port.cohort[b, :n], tolerance=tolerance),
                     tokens_failure(f"{lane}: cohort greedy", ref.tokens_serial[b], port.tokens_cohort[b]))
        if msg:
            return msg
    return None


def cohort_serial(_ref: CohortRun, port: CohortRun, *, tolerance: Tolerance = FLOAT32) -> str | None:
    """The cohort family's lane check (:func:`oracles.checks.cohort.serial_gap_failure`) and greedy tokens."""
    for b, lane in enumerate(port.lanes):
        n = compared_rows(port.tokens_serial[b][1:], port.tokens_cohort[b][1:])
        msg = _first(serial_gap_failure(f"{lane}: cohort step logits vs the lane alone", port.serial[b, :n],
                                        port.cohort[b, :n], tolerance=tolerance),
                     tokens_failure(f"{lane}: greedy", port.tokens_serial[b], port.tokens_cohort[b], ("alone", "cohort")))
        if msg:
            return msg
    return None


Check = tuple[tuple[str, ...], Callable[..., str | None], str]
#: check name -> (families it reads, function, kind: "port" holds against the reference, "self" holds
#: the port against its own second run). Port checks take (reference run, port run); self checks
#: that read two families take the port's runs by family; every check takes ``tolerance=`` too.
CHECKS: dict[str, Check] = {
    "forward:port": (("forward",), forward_port, "port"),
    "decode:port": (("decode",), decode_port, "port"),
    "decode:recompute": (("decode",), decode_recompute, "self"),
    "generation:port": (("generation",), generation_port, "port"),
    "generation:vs-decode": (("generation", "decode"), generation_vs_decode, "self"),
    "speculative:port": (("speculative",), speculative_port, "port"),
    "speculative:vs-greedy": (("speculative", "decode"), speculative_vs_greedy, "self"),
    "chat:port": (("chat",), chat_port, "port"),
    "chat:warm-cold": (("chat",), chat_warm_cold, "self"),
    "chat:replay": (("chat",), chat_replay, "self"),
    "d1:port": (("d1",), d1_port, "port"),
    "d1:tree-row": (("d1",), d1_tree_row, "self"),
    "cohort:port": (("cohort",), cohort_port, "port"),
    "cohort:serial": (("cohort",), cohort_serial, "self"),
}


def run_checks(ref_runs: dict[str, Any], port_runs: dict[str, Any], d1_keys: dict[str, list[str]], *,
               tolerance: Tolerance = FLOAT32) -> dict[str, dict[str, Any]]:
    """Every check of :data:`CHECKS` on one port, held to ``tolerance`` (the port's):
    ``{check: {"status", "message"}}``.

    ``ref_runs`` / ``port_runs``: family -> its run object, or the exception the run raised (an
    ``Unsupported`` makes the family's checks "n/a" with its reason; any other exception is the port
    failing, "caught" with its message). A family missing from ``port_runs`` is off the fault's path:
    a check reading only such families is "untouched"; a check reading one of them besides a touched
    family reads the reference's run of it (the port computes exactly that there).
    ``d1_keys``: question id -> its read-out keys.
    """
    out: dict[str, dict[str, Any]] = {}
    for name, (families, fn, kind) in CHECKS.items():
        if not any(f in port_runs for f in families):
            out[name] = {"status": UNTOUCHED, "message": f"the fault is not on the {'/'.join(families)} path"}
            continue
        mine = {**{f: ref_runs[f] for f in families if f not in port_runs}, **port_runs}
        sides = (mine,) if kind == "self" else (ref_runs, mine)
        broken = next(((f, runs[f]) for f in families for runs in sides if isinstance(runs[f], BaseException)), None)
        if broken is not None:
            family, exc = broken
            side = "reference" if ref_runs.get(family) is exc else "port"
            if side == "reference" and not isinstance(exc, Unsupported):
                raise exc  # the faithful engine's own run failed: an error of the panel, not a detection
            out[name] = {"status": NOT_APPLICABLE if isinstance(exc, Unsupported) else CAUGHT,
                         "message": f"{family} on the {side}: {type(exc).__name__}: {exc}"}
            continue
        if kind == "self" and len(families) > 1:
            message = fn(mine, tolerance=tolerance)
        elif name.startswith("d1:"):
            message = fn(ref_runs["d1"], mine["d1"], d1_keys, tolerance=tolerance)
        else:
            message = fn(ref_runs[families[0]], mine[families[0]], tolerance=tolerance)
        out[name] = {"status": CAUGHT if message else PASSED, "message": message}
    return out


def caught_by(row: dict[str, dict[str, Any]]) -> list[str]:
    """The checks that caught the port, in :data:`CHECKS` order."""
    return [name for name in CHECKS if row.get(name, {}).get("status") == CAUGHT]

