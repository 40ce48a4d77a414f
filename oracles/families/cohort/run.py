"""The cohort family's runs: four lanes decoded one at a time (serial, in logical order) and as one
batch whose rows hold the lanes in another order (the cohort), compared at every step, every lane,
every cache buffer; the DeepSeek-V4 B=4 decode cohort proof on any pin and engine.

Every run is teacher-forced: the tokens come from the DeepSeek-V4 decode proof's deterministic formulas (distinct for each
lane at each step), so serial and cohort read the same ids whatever their logits. All caches of a run
are restored from one prefill snapshot per logical lane. In lockstep, at each step:

    serial      lane l alone: ``forward([t_l], S_l, keep=1)`` for l in logical order
    cohort      ``decode_cohort(to_physical(t), C)``: physical row p holds logical lane MAP[p]
    control     the same comparison made without un-permuting (row p against serial lane p): must fail
    twins       a second cohort where logical lane 0 holds lane 2's prompt and tokens: the two rows (0
                and 1) holding one lane must agree bit for bit (a corrupted row >= 1 shows here), and
                lanes 1..3, given what they are given in the cohort, keep the cohort's bits
    isolation   for each lane k, a cohort where every other lane's tokens change: row k keeps the
                cohort's bits

The twin and isolation cohorts run the first ``isolation_steps`` steps (a kernel that corrupts a row
does it at any step; the span's cost is the serial lanes' and the cohort's).

The grow-and-anchor phase (:mod:`oracles.families.cohort.anchor`) follows. Numpy only; the engine is
duck-typed (:class:`oracles.engines.base.Engine`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np

from oracles.checks.cohort import LaneState, Mismatch, Tally, compare_cohort, compare_lane, fixed_lanes, to_physical
from oracles.engines.base import Engine

LANES = 4
#: Physical row p of every batch holds logical lane MAP[p] (the DeepSeek-V4 decode proof's lane map): every lane moves, so a
#: comparison that forgot to un-permute, or un-permuted twice, compares two different lanes.
PHYSICAL_TO_LOGICAL = (2, 0, 3, 1)
IDENTITY = tuple(range(LANES))
#: The twin run: logical lane 0 holds logical lane 2's prompt and tokens. Under the map they sit in
#: rows 1 and 0: a batch kernel that corrupts rows >= 1 (mlx #3494 / #3795, fixed in mlx 0.32:
#: ``mx.fast.rope`` on rows >= 1 at sequence length 1) makes two identical lanes disagree.
TWIN, TWIN_SOURCE = 0, 2


def prefix_tokens(logical: int, length: int, vocab: int) -> list[int]:
    """The DeepSeek-V4 decode proof's prefix formula ``(row * 97 + lane * 193 + 11) mod vocab`` (the
    proof reduces mod its 120,000-id range; here mod the model's vocabulary)."""
    return [(row * 97 + logical * 193 + 11) % vocab for row in range(length)]


def supplied_tokens(step: int, vocab: int) -> list[int]:
    """The DeepSeek-V4 decode proof's per-step tokens, logical order: ``(step * 389 + lane * 7919 + 17) mod vocab``."""
    return [(step * 389 + lane * 7919 + 17) % vocab for lane in range(LANES)]


def other_tokens(step: int, vocab: int) -> list[int]:
    """The isolation runs' tokens for the lanes that change: ``(step * 613 + lane * 4099 + 31) mod vocab``."""
    return [(step * 613 + lane * 4099 + 31) % vocab for lane in range(LANES)]


def extension_tokens(logical: int, start: int, stop: int, vocab: int) -> list[int]:
    """The DeepSeek-V4 decode proof's anchor extension of positions ``start .. stop-1``:
    ``(pos * 521 + lane * 7919 + 29) mod vocab``."""
    return [(pos * 521 + logical * 7919 + 29) % vocab for pos in range(start, stop)]


@dataclass(frozen=True)
class CohortSpec:
    """How far a run goes. ``prefix``: prompt length per logical lane; ``steps``: decode steps per lane;
    ``isolation_steps``: steps of the twin and isolation runs; ``anchor``: the position every lane is extended to
    after growing its cache to ``capacity``; ``scope``: ``"full"`` or ``"sample"`` (a slow port)."""

    prefix: tuple[int, ...]
    steps: int
    isolation_steps: int
    anchor: int
    capacity: int
    scope: str
    #: Pairs of the paired benchmark at the anchor (:mod:`oracles.families.cohort.bench`).
    bench_pairs: int = 20

    def check(self, vocab: int) -> None:
        """Refuse a spec the proof would be vacuous or ill-formed under.

        Raises:
            ValueError: the map leaves a lane in place; lane tokens that repeat at a step; a twin run
                whose batch width differs from the cohort's; an anchor not past the span.
        """
        if fixed_lanes(PHYSICAL_TO_LOGICAL):
            raise ValueError(f"lane map {PHYSICAL_TO_LOGICAL} leaves lanes {fixed_lanes(PHYSICAL_TO_LOGICAL)} in place")
        for s in range(self.steps):
            tok, alt = supplied_tokens(s, vocab), other_tokens(s, vocab)
            if len(set(tok)) != LANES or any(a == t for a, t in zip(alt, tok)):
                raise ValueError(f"step {s}: lane tokens {tok} (others {alt}) repeat")
        twin = list(self.prefix)
        twin[TWIN] = self.prefix[TWIN_SOURCE]
        if max(twin) != max(self.prefix):
            raise ValueError(f"prefix lengths {self.prefix}: the twin run's batch would be another width")
        if self.anchor <= max(self.prefix) + self.steps + 1 or self.capacity < self.anchor + 2:
            raise ValueError(f"anchor {self.anchor} / capacity {self.capacity}: not past the span of {self.steps} steps")

    def to_json(self) -> dict[str, Any]:
        return {"prefix": list(self.prefix), "steps": self.steps, "isolation_steps": self.isolation_steps,
                "anchor": self.anchor, "capacity": self.capacity, "scope": self.scope, "bench_pairs": self.bench_pairs,
                "physical_to_logical": list(PHYSICAL_TO_LOGICAL), "twin": [TWIN, TWIN_SOURCE]}


#: The proof: >= 130 steps (the DeepSeek-V4 decode proof's 132) from prompts of 33-54 tokens (lane 3 the longest, so the
#: twin run keeps the batch width); twin and isolation runs 16 steps; anchor 384, about twice the span's
#: 186 positions (the DeepSeek-V4 decode proof's is 24x, but a SmolLM2-135M torch prefill here runs ~170 tokens/s and 8
#: caches are extended); capacity anchor + 64 (MLX rounds it up to 512, two KVCache steps).
FULL = CohortSpec(prefix=(40, 47, 33, 54), steps=132, isolation_steps=16, anchor=384, capacity=448, scope="full")
#: A port too slow for FULL inside ``make test`` (MLX on SmolLM2-135M here: ~0.55 s a step of 4 lanes,
#: prefill ~10 tokens/s): 4 steps from prompts of 5-9 tokens, 1 twin/isolation step, anchor 16; the
#: capacity passes the 256 positions an MLX KVCache allocates at its first update, so growing grows.
#: ``--port-records all`` runs FULL.
SAMPLE = CohortSpec(prefix=(6, 8, 5, 9), steps=4, isolation_steps=1, anchor=16, capacity=512, scope="sample")
#: The DeepSeek-V4 decode proof's own shape, for a model with compressed caches (its 4 lanes of 148
#: prefix rows, 132 steps): positions 148..280 cross 37 multiples of 4 (a CSA entry closes every 4th
#: step) and 256 (the second HCA entry of rate 128), with the sliding window of 128 full throughout.
#: One prefix length for every lane: transformers' DeepSeek-V4 cache batches lanes only at one length
#: (:mod:`oracles.engines.torch.cohort_dsv4`). Anchor 384 = 3 x 128: the extension closes the third
#: HCA entry at the anchor's last position.
#: Twin and isolation runs 8 steps (positions 148..155: two CSA entries close in them), half of FULL's 16,
#: inside the budget of ``make test`` (measured: a span step of the 4 serial lanes and 6 cohorts costs
#: ~0.2 s on torch here, one of the 4 lanes and the cohort ~0.08 s).
#: The benchmark 10 pairs, not 20 (measured ~5-7 s an engine at 20 here, the largest share of the
#: twin's budget after the span).
COMPRESSED = CohortSpec(prefix=(148,) * LANES, steps=132, isolation_steps=8, anchor=384, capacity=448,
                        scope="full", bench_pairs=10)
#: Model classes whose caches hold compressed entries: they run :data:`COMPRESSED`.
COMPRESSED_CLASSES = frozenset({"DeepseekV4ForCausalLM"})
#: Weights up to this many bytes make a tiny twin, on which every engine runs FULL (the twins here hold
#: ~13 MB; SmolLM2-135M 538 MB).
TINY_WEIGHT_BYTES = 64 << 20


@dataclass
class Control:
    """The positive control: per step, the lanes the un-permuting-free comparison caught (it must catch all)."""

    comparisons: int = 0
    missed: list[tuple[str, int]] = field(default_factory=list)
    caught_by: dict[str, int] = field(default_factory=dict)

    def add(self, step: str, found: list[Mismatch]) -> None:
        caught = {m.physical for m in found}
        self.comparisons += LANES
        self.missed += [(step, p) for p in range(LANES) if p not in caught]
        for m in found:
            self.caught_by[m.kind] = self.caught_by.get(m.kind, 0) + 1


@dataclass
class ParityRun:
    """What the span's lockstep found (see the module docstring); ``entries`` the compressed buffers'
    entry counts per logical lane ``before`` and ``after`` the span, ``closed_at`` the steps at which
    lane 0's closed one (:func:`entry_counts`); figures, not arrays, except
    ``logit_gap`` ``[steps, LANES]`` (max |d logit| of each logical lane, float64) and the last step's
    cohort ``hidden`` ``[LANES, D]`` / ``logits`` ``[LANES, V]`` rows (physical order)."""

    spec: CohortSpec
    main: Tally
    control: Control
    twins: Tally
    isolation: Tally
    twin_isolation: Tally
    logit_gap: np.ndarray
    argmax_equal: np.ndarray
    last_hidden: np.ndarray
    last_logits: np.ndarray
    lengths: list[int]
    serial: list[Any]
    cohort: list[Any]
    seconds: dict[str, float]
    entries: dict[str, dict[str, list[int]]] = field(default_factory=dict)
    closed_at: dict[str, list[int]] = field(default_factory=dict)
    lane0_entries: dict[str, int] = field(default_factory=dict)


def entry_counts(views: Mapping[str, np.ndarray]) -> dict[str, int]:
    """``{buffer: entries}`` of a lane's compressed buffers: every view named ``*.compressed_kv`` holds
    its entries on axis -2 (``[..., T, d]``, the engines' convention); ``{}`` for a cache without any."""
    return {name: int(a.shape[-2]) for name, a in views.items() if name.endswith(".compressed_kv")}


def uncrossed(before: Sequence[dict[str, int]], after: Sequence[dict[str, int]]) -> list[str]:
    """The positive control of a compressed span: ``"lane L name: n -> m"`` for every lane's compressed
    buffer that gained no entry between ``before`` and ``after`` (empty: every buffer closed one)."""
    return [f"lane {q} {name}: {n} -> {a.get(name)}" for q, (b, a) in enumerate(zip(before, after))
            for name, n in b.items() if not a.get(name, n) > n]


def lane_state(hidden: np.ndarray, logits: np.ndarray, views: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {"hidden": hidden, "logits": logits, **views}


def serial_step(engine: Engine, caches: Sequence[Any], tokens: Sequence[int]) -> list[LaneState]:
    """One token on each serial lane (logical order): hidden, logits and the lane's buffers after it."""
    out: list[LaneState] = []
    for lane, cache in enumerate(caches):
        st = engine.forward([int(tokens[lane])], cache, keep=1)
        out.append(lane_state(st.hidden[-1], st.logits[-1], engine.cache_views(cache)))
    return out


def cohort_step(engine: Engine, caches: Sequence[Any], physical_tokens: Sequence[int]) -> list[LaneState]:
    """One ``decode_cohort`` of the batch (physical order): each row's hidden, logits and its lane's buffers."""
    st = engine.decode_cohort([int(t) for t in physical_tokens], list(caches))
    return [lane_state(st.hidden[p], st.logits[p], engine.cache_views(c)) for p, c in enumerate(caches)]


def _restore_all(engine: Engine, snaps: Sequence[Any], logical: Sequence[int]) -> list[Any]:
    return [engine.restore(snaps[q]) for q in logical]


def run_parity(engine: Engine, spec: CohortSpec) -> ParityRun:
    """Prefill the four lanes, then the lockstep span (module docstring). Raises what the engine raises."""
    V = int(engine.vocab_size)
    spec.check(V)
    t0 = time.perf_counter()
    snaps = []
    for lane in range(LANES):
        cache = engine.make_cache()
        engine.forward(prefix_tokens(lane, spec.prefix[lane], V), cache, keep=1)
        snaps.append(engine.snapshot(cache))
    twin_logical = [TWIN_SOURCE if q == TWIN else q for q in PHYSICAL_TO_LOGICAL]
    serial = _restore_all(engine, snaps, IDENTITY)
    cohort = _restore_all(engine, snaps, PHYSICAL_TO_LOGICAL)
    twins = _restore_all(engine, snaps, twin_logical)
    isolated = [_restore_all(engine, snaps, PHYSICAL_TO_LOGICAL) for _k in range(LANES)]
    run = ParityRun(spec, Tally(), Control(), Tally(), Tally(), Tally(), np.zeros((spec.steps, LANES)),
                    np.zeros((spec.steps, LANES), bool), np.zeros(0), np.zeros(0), [], serial, cohort,
                    {"prefill": time.perf_counter() - t0})
    counted = [entry_counts(engine.cache_views(c)) for c in serial]
    run.entries["before"] = {name: [c[name] for c in counted] for name in counted[0]}
    run.lane0_entries = dict(counted[0])
    for s in range(spec.steps):
        if s == spec.isolation_steps:
            isolated.clear()  # their caches are no longer read
            twins.clear()
        _lockstep(engine, run, s, V, twins, isolated)
    run.lengths = [int(engine.cache_length(c)) for c in cohort]
    counted = [entry_counts(engine.cache_views(c)) for c in serial]
    run.entries["after"] = {name: [c[name] for c in counted] for name in counted[0]}
    run.seconds["span"] = time.perf_counter() - t0 - run.seconds["prefill"]
    return run


def _lockstep(engine: Engine, run: ParityRun, s: int, V: int, twins: list[Any], isolated: list[list[Any]]) -> None:
    step, tok = str(s), supplied_tokens(s, V)
    ser = serial_step(engine, run.serial, tok)
    coh = cohort_step(engine, run.cohort, to_physical(tok, PHYSICAL_TO_LOGICAL))
    names = list(ser[0])
    for name, n in entry_counts(ser[0]).items():  # the steps at which logical lane 0's buffers closed an entry
        if n > run.lane0_entries.get(name, n):
            run.closed_at.setdefault(name, []).append(s)
        run.lane0_entries[name] = n
    run.main.add(compare_cohort(ser, coh, PHYSICAL_TO_LOGICAL, step=step), LANES * len(names), names)
    run.control.add(step, compare_cohort(ser, coh, IDENTITY, step=step, stop_at_first=True))
    for p, q in enumerate(PHYSICAL_TO_LOGICAL):
        a, b = ser[q]["logits"], coh[p]["logits"]
        run.logit_gap[s, q] = float(np.max(np.abs(a.astype(np.float64) - b)))
        run.argmax_equal[s, q] = int(np.argmax(a)) == int(np.argmax(b))
    run.last_hidden = np.stack([c["hidden"] for c in coh]).astype("<f4")
    run.last_logits = np.stack([c["logits"] for c in coh]).astype("<f4")
    if twins:
        _twin_step(engine, run, step, tok, coh, twins, names)
    found: list[Mismatch] = []
    for k, caches in enumerate(isolated):
        alt = other_tokens(s, V)
        alt[k] = tok[k]
        iso = cohort_step(engine, caches, to_physical(alt, PHYSICAL_TO_LOGICAL))
        p = PHYSICAL_TO_LOGICAL.index(k)
        found += compare_lane(coh[p], iso[p], step=step, logical=k, physical=p, sides=("cohort", "others changed"))
    if isolated:
        run.isolation.add(found, len(isolated) * len(names), names)


def _twin_step(engine: Engine, run: ParityRun, step: str, tok: list[int], coh: list[LaneState], twins: list[Any],
               names: list[str]) -> None:
    """The twin cohort's step: its two rows holding one lane agree; the other lanes keep the cohort's bits."""
    twin_tok = list(tok)
    twin_tok[TWIN] = tok[TWIN_SOURCE]
    tw = cohort_step(engine, twins, to_physical(twin_tok, PHYSICAL_TO_LOGICAL))
    rt, rs = PHYSICAL_TO_LOGICAL.index(TWIN), PHYSICAL_TO_LOGICAL.index(TWIN_SOURCE)
    run.twins.add(compare_lane(tw[rs], tw[rt], step=step, logical=TWIN, physical=rt,
                               sides=(f"row {rs} (lane {TWIN_SOURCE})", f"row {rt} (its twin)")), len(names), names)
    kept = [(p, q) for p, q in enumerate(PHYSICAL_TO_LOGICAL) if q != TWIN]
    run.twin_isolation.add([m for p, q in kept for m in compare_lane(
        coh[p], tw[p], step=step, logical=q, physical=p, sides=("cohort", "twin run"))], len(kept) * len(names), names)


def weight_bytes(pin: Any) -> int:
    """Bytes of a pin's ``*.safetensors`` files (a :class:`oracles.pins.pin.Pin`)."""
    return sum(f.bytes for name, f in pin.files.items() if name.endswith(".safetensors"))


def choose_spec(is_port: bool, scope: Any, weights: int, model_class: str = "") -> CohortSpec:
    """COMPRESSED for a model class of :data:`COMPRESSED_CLASSES` (a tiny twin's, on every engine); FULL
    for the reference, for a tiny model (``weights`` <= :data:`TINY_WEIGHT_BYTES`) on any engine, and
    for a port whose ``--port-records`` scope (an :class:`oracles.families.port_scope.PortScope`) selects a
    record of ``FULL.anchor`` tokens (``all``, or ``N >= FULL.anchor``); else SAMPLE."""
    from oracles.families.port_scope import EXECUTION_SAMPLE_TOKENS

    if model_class in COMPRESSED_CLASSES:
        return COMPRESSED
    if not is_port or weights <= TINY_WEIGHT_BYTES or scope.selects(FULL.anchor, EXECUTION_SAMPLE_TOKENS):
        return FULL
    return SAMPLE
