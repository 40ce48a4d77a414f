"""The conformance checks of ``oracles wire-check``: what a harness author runs against a far side before the
suite does (``docs/wire.md``, "Conformance").

After the handshake (its facts read back and checked), every served call is made on a short probe prompt
and checked for the kinds, shapes and dtypes the call table and the engine contract fix; then the
properties every family relies on: the same request twice gives the same bits (a cold forward, a cached
continuation, a greedy generation, a snapshot's buffers), a snapshot is independent of later forwards on
its cache (its buffers unchanged, a restore continued twice gives the same bits), a restored cache holds
the snapshot's length, a trim shortens the cache, and a request naming a handle the far side never made
is answered with an error while the conversation goes on; where served, MTP drafting (the pairs' shapes, both
caches' lengths, the same bits twice) and System One decisions (the inputs' kinds, the read-out groups, a
log-softmax ``[V]`` the same twice, an answer per question). Each failure is one line naming the call; a call
the far side refuses as ``unsupported`` is listed as not asked.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from oracles.engines.base import Sampler, Unsupported
from oracles.engines.wire.calls import CALLS
from oracles.engines.wire.channel import FarError
from oracles.engines.wire.client import WireEngine
from oracles.errors import OracleError


@dataclass
class Report:
    """What the checks found: ``failures`` (one line each, naming the call), ``passed`` and ``skipped``
    (what could not be asked: a call the far side does not serve, or refuses as ``unsupported``) check names."""

    failures: list[str] = field(default_factory=list)
    passed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    gone: Callable[[], str | None] = lambda: None
    tail: Callable[[], str] = lambda: ""

    def check(self, name: str, fn: Callable[[], Any]) -> Any:
        """Run one check ``name`` (``"forward: determinism"``); a failure is one line, never an exception.
        Once the far side is gone (its stream failed), the rest are skipped: the failure was named once."""
        if self.gone() is not None:
            self.skipped.append(f"{name}: the far side is gone")
            return None
        try:
            value = fn()
        except Unsupported as exc:  # a served call the far side's engine refuses: its capability, not a fault
            self.skipped.append(f"{name}: refused ({exc})")
            return None
        except (AssertionError, OracleError, ValueError, TypeError, KeyError) as exc:
            text = " ".join(str(exc).split()) or type(exc).__name__
            self.failures.append(f"{name}: {text}" + ("" if "; last stderr: " in text else self.tail()))
            return None
        self.passed.append(name)
        return value


def _same(what: str, a: Any, b: Any) -> None:
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
        diff = "" if a.shape != b.shape else f", max |d| {float(np.max(np.abs(a.astype(np.float64) - b))):.3g}"
        raise AssertionError(f"{what}: two answers to the same request differ ({a.dtype} {list(a.shape)} vs "
                             f"{b.dtype} {list(b.shape)}{diff})")


def probe_ids(engine: WireEngine) -> list[int]:
    """Six ids every vocabulary holds: the far side's own encoding of a short text where it serves one,
    else fixed ids below its vocabulary size."""
    if "tokenizer.encode" in engine.served:
        ids = engine.tokenizer.encode("The quick brown fox jumps", add_special_tokens=False)
        if len(ids) >= 4:
            return [int(i) for i in ids[:6]]
    return [i % engine.vocab_size for i in (1, 42, 300, 9000, 17, 5)]


def check_facts(engine: WireEngine, report: Report) -> None:
    """The handshake's facts and calls."""
    def facts() -> None:
        for name in ("vocab_size", "hidden_size", "num_layers"):
            assert getattr(engine, name) > 0, f"field result.facts.{name}: {getattr(engine, name)}; expected > 0"
        assert engine.max_context >= 0, f"field result.facts.max_context: {engine.max_context}; expected >= 0 (0: no limit)"
        bad = sorted(i for i in engine.eos_token_ids if not 0 <= i < engine.vocab_size)
        assert not bad, f"field result.facts.eos_token_ids: {bad[:5]} outside [0, vocab_size)"
        unknown = sorted(set(engine.hello.get("calls", [])) - set(CALLS))
        assert not unknown, f"field result.calls: {unknown} are not calls of protocol 1 (ignored by the client)"

    report.check("hello: facts and calls", facts)


def check_forward(engine: WireEngine, ids: list[int], report: Report) -> None:
    """A cold forward: its shapes (checked by the client on every call), keep, and the same bits twice."""
    first = report.check("forward: a cold prefill", lambda: engine.forward(ids))
    if first is None:
        return
    report.check("forward: determinism", lambda: _same("forward logits", engine.forward(ids).logits, first.logits))
    report.check("forward: keep=1", lambda: engine.forward(ids, keep=1))

    def cached() -> None:
        runs = []
        for _ in range(2):
            cache = engine.make_cache()
            assert engine.cache_length(cache) == 0, f"cache_length of a new cache is {engine.cache_length(cache)}"
            engine.forward(ids[:3], cache)
            step = engine.forward(ids[3:], cache)
            assert engine.cache_length(cache) == len(ids), (
                f"cache_length after {len(ids)} ids is {engine.cache_length(cache)}")
            runs.append(step.logits)
        _same("cached continuation logits", runs[0], runs[1])

    report.check("make_cache, forward(cache), cache_length: continuation and determinism", cached)


#: A buffer's name (Engine.snapshot_buffers): ``layers.<i>.<keys|values|conv_state|recurrent_state>``, a DeepSeek-V4
#: cache's ``window_kv`` and compressor or indexer buffers, each with an index where a layer holds several
#: (transformers' linear-attention layers: ``layers.0.conv_state.0``).
BUFFER = re.compile(r"layers\.(\d+)\.(keys|values|conv_state|recurrent_state|window_kv|(?:compressor|indexer)\.\w+)(\.\d+)?")


def _buffer_layout(buffers: dict[str, np.ndarray], num_layers: int, length: int) -> None:
    """A snapshot's buffers as :meth:`oracles.engines.base.Engine.snapshot_buffers` names and shapes them:
    ``layers.<i>.<kind>`` in layer order below ``num_layers``; keys and values ``[1, H, T, d]`` with ``T`` the
    ``length`` positions held, a layer's keys and values of one shape."""
    layers = []
    for name, a in buffers.items():
        match = BUFFER.fullmatch(name)
        assert match, f"snapshot_buffers: field {name!r} is not layers.<i>.<keys|values|conv_state|recurrent_state>[.<j>]"
        layers.append(int(match.group(1)))
        if match.group(2) in ("keys", "values"):
            assert a.ndim == 4 and a.shape[2] == length, (
                f"snapshot_buffers: field {name} is {list(a.shape)}; expected [1, H, T, d] with T = {length} positions")
    assert layers == sorted(layers) and (not layers or layers[-1] < num_layers), (
        f"snapshot_buffers: layer indices {sorted(set(layers))} not in order below num_layers {num_layers}")
    for i in sorted(set(layers)):
        k, v = buffers.get(f"layers.{i}.keys"), buffers.get(f"layers.{i}.values")
        assert k is None or v is None or k.shape == v.shape, (
            f"snapshot_buffers: layers.{i}.keys is {list(k.shape)}, layers.{i}.values {list(v.shape)}")


def check_snapshots(engine: WireEngine, ids: list[int], report: Report) -> None:
    """Snapshot independence, restore, buffers, trim (each where served)."""
    if not {"snapshot", "restore"} <= engine.served:
        return

    def independent() -> None:
        cache = engine.make_cache()
        engine.forward(ids[:4], cache)
        snap = engine.snapshot(cache)
        before = engine.snapshot_buffers(snap) if "snapshot_buffers" in engine.served else None
        if before is not None:
            _buffer_layout(before, engine.num_layers, 4)
        engine.forward(ids[4:], cache)
        if before is not None:
            after = engine.snapshot_buffers(snap)
            assert list(after) == list(before), "snapshot_buffers: the names changed after a forward on its cache"
            for name in before:
                _same(f"snapshot_buffers {name} after a later forward on its cache", after[name], before[name])
        outs = []
        for _ in range(2):
            restored = engine.restore(snap)
            assert engine.cache_length(restored) == 4, f"restore: cache_length {engine.cache_length(restored)}, not 4"
            outs.append(engine.forward(ids[4:], restored).logits)
        _same("forward on two restores of one snapshot", outs[0], outs[1])

    report.check("snapshot, restore: independence and determinism", independent)
    if "trim" in engine.served:
        def trim() -> None:
            cache = engine.make_cache()
            engine.forward(ids, cache)
            if engine.trim(cache, 2):
                assert engine.cache_length(cache) == len(ids) - 2, f"cache_length after trim(2) is {engine.cache_length(cache)}"

        report.check("trim", trim)


def check_others(engine: WireEngine, ids: list[int], report: Report) -> None:
    """Generation, the batched decode, the head and norm, text calls, describe (each where served)."""
    served = engine.served
    if "generate" in served:
        def generate() -> None:
            a, b = (engine.generate(ids, Sampler(), 4) for _ in range(2))
            assert a.tokens == b.tokens, f"greedy tokens differ on repeat: {a.tokens} vs {b.tokens}"
            assert a.step_logits.shape[0] == len(a.tokens), (
                f"field result.step_logits: {a.step_logits.shape[0]} rows for {len(a.tokens)} tokens")
            _same("greedy step_logits", a.step_logits, b.step_logits)

        report.check("generate: greedy, determinism", generate)
    if "decode_cohort" in served:
        def cohort() -> None:
            lanes = [engine.make_cache(), engine.make_cache()]
            engine.forward(ids[:2], lanes[0]), engine.forward(ids[:3], lanes[1])
            engine.decode_cohort([ids[3], ids[4]], lanes)
            assert [engine.cache_length(c) for c in lanes] == [3, 4], "decode_cohort: each lane gains one position"

        report.check("decode_cohort: two lanes", cohort)
    if "lm_head" in served:
        report.check("lm_head", lambda: engine.lm_head(engine.forward(ids).hidden))
    if "decode" in served or "tokenizer.decode" in served:
        report.check("decode", lambda: _expect(isinstance(engine.decode(ids), str), "decode: not a string"))
    if "describe" in served:
        report.check("describe", lambda: _expect(isinstance(engine.describe(), dict), "describe: not an object"))


def _expect(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)


def check_errors(engine: WireEngine, report: Report) -> None:
    """A request naming a handle the far side never made is answered with an error, and the next call works."""
    def bad_handle() -> None:
        try:
            engine.channel.call("cache_length", {"cache": 987654321})
        except FarError:
            pass
        else:
            raise AssertionError("cache_length of handle 987654321 (never made) answered without an error")
        assert engine.cache_length(None) == 0, "cache_length(null) after an error is not 0"

    report.check("errors: an unknown handle is an error answer, and the conversation goes on", bad_handle)


#: A System One question in the published form, for the decision calls' probe.
PROBE_QUESTION = {"type": "bool", "instructions": "Is the parcel late?",
                  "criteria": {"true": "It is late", "false": "It is on time"}}


def _refused(report: Report, what: str, first: Callable[[], Any]) -> Any:
    """``first()``'s value, or None with ``what`` listed as not asked where the far side refuses it as a
    capability its engine lacks (``oracles serve`` lists every call, and answers ``unsupported`` for those)."""
    try:
        return first()
    except Unsupported as exc:
        report.skipped.append(f"{what}: refused ({exc})")
        return None


def check_mtp(engine: WireEngine, ids: list[int], report: Report) -> None:
    """MTP drafting, where served: the trunk's and a draft's pairs ``[T, V]``, ``[T, D]`` float32, both caches'
    lengths, the same bits twice, the head's ``[n, V]``, the library's generation (its fields' kinds)."""
    from oracles.engines.contract_arrays import expect_f4
    from oracles.engines.contract_systems import check_mtp_generation, check_rows_pair

    if "mtp_trunk" not in engine.served or _refused(report, "mtp", engine.mtp_trunk_cache) is None:
        return

    def rounds() -> Any:
        tc, mc = engine.mtp_trunk_cache(), engine.mtp_history_cache()
        trunk = engine.mtp_trunk(ids, tc)
        check_rows_pair(engine, "mtp_trunk()", trunk, len(ids), f"for {len(ids)} ids")
        draft = engine.mtp_draft(ids[1:], trunk[1][:-1], 1, mc)
        check_rows_pair(engine, "mtp_draft()", draft, len(ids) - 1, f"for {len(ids) - 1} tokens")
        lengths = engine.cache_length(tc), engine.cache_length(mc)
        assert lengths == (len(ids), len(ids) - 1), f"cache_length of trunk and history {lengths}; expected " \
                                                    f"{(len(ids), len(ids) - 1)}"
        return trunk, draft

    first = report.check("mtp_trunk, mtp_draft: shapes, cache lengths", rounds)
    if first is None:
        return

    def again() -> None:
        second = rounds()
        for name, a, b in zip(("trunk logits", "trunk state", "draft logits", "draft state"), (*first[0], *first[1]),
                              (*second[0], *second[1])):
            _same(f"mtp {name}", a, b)

    report.check("mtp_trunk, mtp_draft: determinism", again)
    if "mtp_head" in engine.served:
        state = first[1][1]
        report.check("mtp_head", lambda: expect_f4(engine, "mtp_head()", "the return value", engine.mtp_head(state),
                                                   "n, V", (state.shape[0], engine.vocab_size), "for the draft states"))
    if "mtp_generate" in engine.served:
        report.check("mtp_generate: kinds", lambda: check_mtp_generation(engine, "mtp_generate()",
                                                                          engine.mtp_generate(ids, 4)))


def check_decisions(engine: WireEngine, report: Report) -> None:
    """System One decisions, where served, on a one-question text request: the inputs' kinds, two or more
    read-out groups, one log-softmax ``[V]`` float32 (it exponentiates to 1 within the float32 bound
    ``logz_f64_atol`` of :data:`oracles.checks.tolerance.FLOAT32`) the same twice, an answer per question."""
    from oracles.checks.tolerance import FLOAT32
    from oracles.engines.contract_systems import check_decision_inputs, check_logprobs, check_predict, check_readout

    state, questions = "Order 4471 left the warehouse on Tuesday.", [PROBE_QUESTION]
    if "decision_inputs" not in engine.served:
        return
    inputs = _refused(report, "decisions", lambda: engine.decision_inputs(state, questions, []))
    if inputs is None:
        return
    report.check("decision_inputs: kinds", lambda: check_decision_inputs(engine, "decision_inputs()", inputs))
    if "decision_readout_ids" in engine.served:
        report.check("decision_readout_ids", lambda: check_readout(engine, "decision_readout_ids()",
                                                                   engine.decision_readout_ids(PROBE_QUESTION)))
    if "decision_logprobs" in engine.served:
        def logprobs() -> None:
            trunk, branches, vision = inputs
            a, b = (engine.decision_logprobs(trunk, branches, vision) for _ in range(2))
            check_logprobs(engine, "decision_logprobs()", a, branches)
            _same("decision_logprobs", a[0], b[0])
            mass = float(np.exp(a[0].astype(np.float64)).sum())
            assert abs(mass - 1.0) < FLOAT32.logz_f64_atol, f"decision_logprobs: exp sums to {mass!r}, not 1 (a log-softmax)"

        report.check("decision_logprobs: a log-softmax [V], determinism", logprobs)
    if "decision_predict" in engine.served:
        report.check("decision_predict", lambda: check_predict(engine, "decision_predict()", engine.decision_predict(
            state, {"late": PROBE_QUESTION}, []), {"late": PROBE_QUESTION}))


#: Capabilities a far side may leave out, listed as not asked when it does.
OPTIONAL = ("snapshot", "restore", "snapshot_buffers", "trim", "generate", "decode_cohort", "lm_head", "decode", "describe",
            "tokenizer.encode")


def run_checks(engine: WireEngine) -> Report:
    """Every check, in order (module docstring)."""
    report = Report(gone=lambda: engine.channel.gone, tail=engine.channel.tail_note)
    report.skipped += [f"{call}: not served" for call in OPTIONAL if call not in engine.served
                       and not (call == "decode" and "tokenizer.decode" in engine.served)]
    check_facts(engine, report)
    ids = report.check("tokenizer.encode: probe ids", lambda: probe_ids(engine)) or [
        i % engine.vocab_size for i in (1, 42, 300, 9000, 17, 5)]
    check_forward(engine, ids, report)
    check_snapshots(engine, ids, report)
    check_others(engine, ids, report)
    check_mtp(engine, ids, report)
    check_decisions(engine, report)
    check_errors(engine, report)
    return report
