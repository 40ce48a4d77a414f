"""The hybrid twin's caches on each engine: what a snapshot holds, that its digest covers the recurrent
state (with the positive control: a changed recurrent state changes the digest and is named), that
the cache cannot be trimmed, and that the twin's seeded scale decodes varied text.

Slow: loads the twin (~13 MB) on torch and MLX (measured ~9 s of one worker on an idle machine);
every forward is a few dozen tokens.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.engines.base import Engine, digest_buffers
from oracles.families.execution.prompts import PromptRecord
from oracles.families.execution.runs import GENERATION
from oracles.plugin.fixtures import Engines
from oracles.twins import hybrid

#: One xdist worker for the module: each engine loads the twin once (a second worker would load torch again).
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("unit-hybrid-twin")]

PIN = "smollm2-hybrid-twin"
ARITH = next(r for r in GENERATION if r.id == "arith")
LINEAR = [i for i, t in enumerate(hybrid.LAYER_TYPES) if t == "linear_attention"]
FULL = [i for i, t in enumerate(hybrid.LAYER_TYPES) if t == "full_attention"]


@pytest.fixture
def record() -> PromptRecord:
    """The "arith" generation record with the twin's token ids (SmolLM2's tokenizer)."""
    return ARITH.bind(PIN)


@pytest.fixture(params=["torch", "mlx"])
def twin(engines: Engines, request: pytest.FixtureRequest) -> Any:
    """The twin on each built-in adapter (this module knows their snapshot formats: _bump_recurrent);
    an adapter that cannot run here is skipped by ``engines``, naming why."""
    return engines(request.param, PIN)


def _snapshot_after(engine: Engine, ids: list[int]) -> tuple[Any, Any]:
    cache = engine.make_cache()
    engine.forward(ids, cache, keep=1)
    return cache, engine.snapshot(cache)


def _bump_recurrent(snapshot: Any, layer: int) -> None:
    """Add 1e-3 to one element of layer ``layer``'s recurrent state inside ``snapshot``, in place,
    in the snapshot format of each built-in adapter (torch: a copied ``DynamicCache``; MLX: per layer
    ``{"arrays": {name: numpy}}``)."""
    if isinstance(snapshot, list):
        snapshot[layer]["arrays"]["recurrent_state"].flat[0] += np.float32(1e-3)
    else:
        snapshot.layers[layer].recurrent_states[0].view(-1)[0] += 1e-3


def test_snapshot_buffers_name_every_state(twin: Any, record: PromptRecord) -> None:
    """Linear-attention layers contribute conv_state and recurrent_state, the attention layer keys and
    values holding the cached positions; every buffer is non-zero after a prefill."""
    n = len(record.ids) - 1
    cache, snap = _snapshot_after(twin, list(record.ids[:-1]))
    buffers = twin.snapshot_buffers(snap)
    want = [f"layers.{i}.{name}" for i in range(len(hybrid.LAYER_TYPES))
            for name in (("conv_state", "recurrent_state") if i in LINEAR else ("keys", "values"))]
    assert list(buffers) == want, f"snapshot buffers {list(buffers)}, want {want}"
    for i in FULL:
        assert buffers[f"layers.{i}.keys"].shape[-2] == n, f"layer {i} keys {buffers[f'layers.{i}.keys'].shape}, {n} positions"
    empty = [k for k, a in buffers.items() if not np.any(a)]
    assert not empty, f"all-zero buffers after a {n}-token prefill: {empty}"
    assert twin.cache_length(cache) == n, f"cache_length {twin.cache_length(cache)} after {n} tokens"
    assert not twin.is_trimmable(cache) and not twin.trim(cache, 1), "a recurrent cache must refuse trimming"
    assert twin.cache_length(cache) == n, "a refused trim changed the cache"


@pytest.mark.parametrize("layer", LINEAR)
def test_digest_covers_recurrent_state(twin: Any, record: PromptRecord, layer: int) -> None:
    """Positive control of the snapshot-not-poisoned checks (chat, d1 tree): a change of 1e-3 in one
    element of one layer's recurrent state alone changes the snapshot digest, and the per-buffer
    digests name exactly that buffer."""
    _, snap = _snapshot_after(twin, list(record.ids[:-1]))
    before, per_before = twin.snapshot_digest(snap), twin.buffer_digests(snap)
    assert before == digest_buffers(twin.snapshot_buffers(snap))
    _bump_recurrent(snap, layer)
    per_after = twin.buffer_digests(snap)
    assert twin.snapshot_digest(snap) != before, f"layer {layer}: a changed recurrent state left the digest unchanged"
    changed = [k for k in per_before if per_before[k] != per_after[k]]
    assert changed == [f"layers.{layer}.recurrent_state"], f"changed buffers {changed}"


def test_restore_continues_exactly(twin: Any, record: PromptRecord) -> None:
    """The last prompt token through a restored snapshot gives the live cache's logits bit for bit,
    and leaves the snapshot's digest (every recurrent and conv state) unchanged."""
    cache, snap = _snapshot_after(twin, list(record.ids[:-1]))
    digest = twin.snapshot_digest(snap)
    live = twin.forward([record.ids[-1]], cache, keep=1).logits
    again = twin.forward([record.ids[-1]], twin.restore(snap), keep=1).logits
    assert np.array_equal(live, again), f"restored vs live: max |dlogit| {float(np.abs(live - again).max()):.3e}"
    assert twin.snapshot_digest(snap) == digest, "a forward on the restored cache changed the snapshot"


def test_greedy_decoding_is_varied(twin: Any, record: PromptRecord) -> None:
    """The builder's weight scale (oracles/twins/hybrid.py) makes greedy decoding varied: measured
    63 distinct tokens of 64 on "arith" on the reference; at Qwen3.5's own scale (0.02) it is 1.
    At least 32 of 64 leaves room for an engine's own rounding and fails a one-token loop."""
    cache = twin.make_cache()
    row = twin.forward(list(record.ids), cache, keep=1).logits[-1]
    tokens: list[int] = []
    while len(tokens) < 64:
        tokens.append(int(np.argmax(row)))
        row = twin.forward([tokens[-1]], cache, keep=1).logits[-1]
    assert len(set(tokens)) >= 32, f"{len(set(tokens))} distinct of 64 greedy tokens: {tokens}"
