"""Each ``--port`` that loads the DeepSeek-V4 twin held against the torch reference there (marker
``cohort``: the cohort family's model with compressed caches; the cohort proof itself, every compressed
buffer and its digest, runs on every engine in ``test_cohort.py``).

Checks: the 148-token prefill's logits within the port's bounds (:mod:`oracles.checks.port`), and cached
prefills of lengths around each rate (one length, 8 = ``index_topk``, held on its own); a forward with no
cache; the decode of the cohort span's lane 0 (prefix 148, 132 teacher-forced steps, positions
148..279: 33 CSA entries and one HCA entry close in it) step by step against the reference, and, where
the port declares a measured decode gap, a check that the gap starts at the position its note quotes
and that the port's own prefill of the same tokens is within the bounds there (so it is the decode
path, not the model); both engines refusing to trim a compressed cache; lanes of distinct lengths. For
mlx-vlm's adapter (and one built on it): the artifact as mlx-vlm loads it untranslated, and the
translations it made. A port's measured gaps are its adapter's (``known_gap``, strict xfails: mlx-vlm's
are :mod:`oracles.engines.mlx.deepseek_v4_gaps`).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from oracles.checks.port import held_figures, threshold_failures
from oracles.engines.base import Engine
from oracles.families.cohort import run as fam
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.cohort, pytest.mark.slow, pytest.mark.builtin_pin("deepseek-v4-twin")]

#: Cached prefill lengths held within the bounds: the first CSA entry, an open window, a prompt of the
#: execution records' size, past the window and the first HCA entry (each new length costs mlx a compile).
LENGTHS = (4, 9, 45, 129)
#: The decode test whose declared gap :func:`test_dsv4_port_decode_gap_where_measured` explains.
DECODE_TEST = "test_dsv4_port_decode_within_float32"


def _prefill_figures(reference: Engine, port: Engine, n: int, cached: bool = True) -> dict[str, Any]:
    ids = fam.prefix_tokens(0, n, int(reference.vocab_size))
    return held_figures(f"{reference.pin} prefill of {n}", reference.forward(ids, reference.make_cache()).logits,
                        port.forward(ids, port.make_cache() if cached else None).logits)


def _failures(fig: dict[str, Any], port: Engine) -> list[str]:
    return threshold_failures(fig, tolerance=port.tolerance())


def _trace(engine: Engine, spec: fam.CohortSpec) -> dict[str, Any]:
    """Prefill logits ``[P, V]`` and each decode step's logits ``[steps, V]`` of lane 0, teacher-forced."""
    V = int(engine.vocab_size)
    cache = engine.make_cache()
    prefill = engine.forward(fam.prefix_tokens(0, spec.prefix[0], V), cache).logits
    steps = [engine.forward([fam.supplied_tokens(s, V)[0]], cache, keep=1).logits[-1] for s in range(spec.steps)]
    return {"prefill": prefill, "steps": np.stack(steps)}


@pytest.fixture
def traces(runs: Runs, reference: Engine, port: Engine) -> dict[str, dict[str, Any]]:
    """The lane-0 traces of the reference and the port over the compressed span, once per session each."""
    def trace(engine: Engine) -> dict[str, Any]:
        return runs(("dsv4-port-trace", engine.id, engine.pin), lambda: _trace(engine, fam.COMPRESSED))

    return {"ref": trace(reference), "port": trace(port)}


def _step_failures(traces: dict[str, dict[str, Any]], port: Engine) -> list[tuple[int, list[str], dict[str, Any]]]:
    out = []
    for s in range(fam.COMPRESSED.steps):
        fig = held_figures(f"{port.pin} step {s}", traces["ref"]["steps"][s], traces["port"]["steps"][s])
        out.append((s, _failures(fig, port), fig))
    return out


def _mlx_vlm_dsv4(port: Engine) -> Engine:
    """``port`` if it is mlx-vlm's DeepSeek-V4 adapter (or built on it), else skip naming why."""
    from oracles.engines.mlx.deepseek_v4 import MlxDeepseekV4Port

    if not isinstance(port, MlxDeepseekV4Port):
        pytest.skip(f"port {port.id} ({type(port).__name__}) is not mlx-vlm's DeepSeek-V4 adapter: the load and "
                    "translation checked here are mlx-vlm's")
    return port


def test_dsv4_port_loads_as_shipped(port: Engine, receipt: Receipt) -> None:
    """The snapshot as mlx-vlm's own ``load_model`` reads it: its schedule fields as transformers reads
    them, and the weights loaded (mlx-vlm 0.7.10 refuses them: the adapter's known gap)."""
    _mlx_vlm_dsv4(port)
    from mlx_vlm.models.deepseek_v4.config import ModelConfig
    from mlx_vlm.utils import load_model

    config = json.loads((port.root / "config.json").read_text())
    read = ModelConfig.from_dict(config)
    want = {"sliding_attention": 0, **config["compress_rates"]}
    receipt.update(compress_ratios=list(read.compress_ratios), num_hash_layers=int(read.num_hash_layers))
    assert list(read.compress_ratios) == [want[t] for t in config["layer_types"]], (
        f"mlx-vlm reads compress_ratios {read.compress_ratios} for layer_types {config['layer_types']}")
    assert read.num_hash_layers == config["mlp_layer_types"].count("hash_moe"), f"num_hash_layers {read.num_hash_layers}"
    load_model(port.root)


def test_dsv4_port_translations_recorded(port: Engine, receipt: Receipt) -> None:
    """mlx-vlm's adapter records every translation it made (``describe()`` and ``translation_notes()``): the
    two schedule keys from transformers' own fields, and the weight renaming (every transformers tensor
    under one official name, none dropped)."""
    d = _mlx_vlm_dsv4(port).describe()
    receipt.update(config_overrides=d["config_overrides"], translations=d["translations"], tensors=d["tensors_in_out"])
    assert d["config_overrides"] == {"compress_ratios": [0, 4, 128, 4], "num_hash_layers": 2}, d["config_overrides"]
    assert d["translations"] and all(isinstance(t, str) for t in d["translations"])
    assert set(d["translations"]) <= set(port.translation_notes()), "a translation the verdicts would not name"
    n_in, n_out = d["tensors_in_out"]
    config = json.loads((port.root / "config.json").read_text())
    split = int(config["num_hidden_layers"]) * (3 * int(config["n_routed_experts"]) - 2)  # 2 packed -> 3 per expert
    assert n_out == n_in + split, f"{n_in} transformers tensors became {n_out} official ones, expected {n_in + split}"


def test_dsv4_port_prefill_within_float32(traces: dict[str, dict[str, Any]], port: Engine, receipt: Receipt) -> None:
    """The 148-token prefill's logits, every row, within the port's bounds (:mod:`oracles.checks.port`)."""
    fig = held_figures(f"{port.pin} prefill", traces["ref"]["prefill"], traces["port"]["prefill"])
    receipt.update(figures={k: v for k, v in fig.items() if k != "disagreements"})
    failures = _failures(fig, port)
    assert not failures, f"{port.pin} ({port.id}) prefill of {fam.COMPRESSED.prefix[0]} tokens: " + "; ".join(failures)


def test_dsv4_port_decode_within_float32(traces: dict[str, dict[str, Any]], port: Engine, receipt: Receipt) -> None:
    """Each of the span's 132 decode steps' logits within the port's bounds (positions 148..279)."""
    bad = [(s, f) for s, f, _fig in _step_failures(traces, port) if f]
    receipt.update(failing_steps=[s for s, _f in bad][:40], first=bad[0][1] if bad else None)
    assert not bad, (f"{port.pin} ({port.id}) decode: {len(bad)} of {fam.COMPRESSED.steps} steps outside the bounds, "
                     f"first at step {bad[0][0]} (position {fam.COMPRESSED.prefix[0] + bad[0][0]}): {bad[0][1]}")


def test_dsv4_port_decode_gap_where_measured(port: Engine, traces: dict[str, dict[str, Any]],
                                            request: pytest.FixtureRequest, receipt: Receipt) -> None:
    """Where the port declares a measured decode gap (its ``known_gap`` of the test above), the decode's first
    step outside the bounds is at the position the note quotes ("from position N": every earlier step within
    the bounds), and there the port's own prefill of the same tokens is within the bounds: the gap is its
    decode path's. A port that declares none skips."""
    declared = port.known_gap(request.node.name.replace(request.node.originalname, DECODE_TEST))
    if declared is None:
        pytest.skip(f"port {port.id} on {port.pin} declares no decode gap to explain")
    results = _step_failures(traces, port)
    first = next((s for s, f, _fig in results if f), None)
    P = fam.COMPRESSED.prefix[0]
    assert first is not None, f"{port.pin} ({port.id}): every decode step is within the bounds; drop its declared gap"
    V = int(port.vocab_size)
    ids = fam.prefix_tokens(0, P, V) + [fam.supplied_tokens(s, V)[0] for s in range(first + 1)]
    fresh = port.forward(ids, port.make_cache(), keep=1).logits[-1]
    fig = held_figures(f"{port.pin} prefill of {len(ids)}", traces["ref"]["steps"][first], fresh)
    worst = max(results, key=lambda r: r[2]["max_abs"])
    receipt.update(first_step=first, first_position=P + first, max_abs_at_gap=results[first][2]["max_abs"],
                   prefill_max_abs_at_gap=fig["max_abs"], worst_step=worst[0], worst_max_abs=worst[2]["max_abs"])
    assert f"from position {P + first} " in declared, (
        f"{port.pin} ({port.id}): the decode's first step outside the bounds is {first} (position {P + first}); its "
        f"declared gap quotes another: update it ({declared})")
    assert not _failures(fig, port), f"{port.pin} ({port.id}) prefill of {len(ids)} tokens: {_failures(fig, port)}"


def test_dsv4_port_prefill_lengths_within_float32(reference: Engine, port: Engine, receipt: Receipt) -> None:
    """Cached prefills of :data:`LENGTHS` tokens within the port's bounds, every row."""
    figs = {n: _prefill_figures(reference, port, n) for n in LENGTHS}
    receipt.update(max_abs={str(n): f["max_abs"] for n, f in figs.items()})
    bad = {n: _failures(f, port) for n, f in figs.items() if _failures(f, port)}
    assert not bad, f"{port.pin} ({port.id}) cached prefills outside the bounds: {bad}"


def test_dsv4_port_prefill_of_index_topk_within_float32(reference: Engine, port: Engine, receipt: Receipt) -> None:
    """A cached prefill of exactly ``index_topk`` = 8 tokens within the port's bounds."""
    fig = _prefill_figures(reference, port, 8)
    receipt.update(max_abs=fig["max_abs"], max_abs_at=fig["max_abs_at"])
    assert not _failures(fig, port), f"{port.pin} ({port.id}) prefill of 8: {_failures(fig, port)}"


def test_dsv4_port_cold_forward_within_float32(reference: Engine, port: Engine, receipt: Receipt) -> None:
    """The port's forward with no cache, 16 tokens, within its bounds."""
    fig = _prefill_figures(reference, port, 16, cached=False)
    receipt.update(max_abs=fig["max_abs"], max_abs_at=fig["max_abs_at"])
    assert not _failures(fig, port), f"{port.pin} ({port.id}) forward of 16 with cache=None: {_failures(fig, port)}"


def test_dsv4_caches_refuse_trimming(reference: Engine, port: Engine) -> None:
    """Neither engine trims a DeepSeek-V4 cache (a crop would leave the compressors' entries and open
    window as they were: transformers' layers claim ``is_croppable`` all the same), so the families
    roll back by snapshot/restore; a refused trim leaves the cache as it was."""
    for engine in (reference, port):
        cache = engine.make_cache()
        engine.forward(fam.prefix_tokens(0, 9, int(engine.vocab_size)), cache, keep=1)
        assert not engine.is_trimmable(cache), f"{engine.id}: a DeepSeek-V4 cache reported trimmable"
        assert not engine.trim(cache, 1) and engine.cache_length(cache) == 9, f"{engine.id}: a refused trim changed it"


def test_dsv4_lanes_of_distinct_lengths(reference: Engine, port: Engine, receipt: Receipt) -> None:
    """transformers' DeepSeek-V4 cache cannot batch lanes of distinct lengths (one entry count per layer):
    the reference refuses them, naming the lengths, before any lane changes; the port's cohort of a 9- and
    an 8-token lane (one CSA entry closing in one lane only; mlx-vlm's batch caches keep per-lane lengths)
    is within the cohort bound of each lane's serial step."""
    from oracles.engines.types import Unsupported

    V = int(reference.vocab_size)
    lanes = [fam.prefix_tokens(q, n, V) for q, n in ((0, 9), (1, 8))]
    caches = [reference.make_cache() for _ in lanes]
    for ids, c in zip(lanes, caches):
        reference.forward(ids, c, keep=1)
    with pytest.raises(Unsupported, match=r"the lanes hold \[9, 8\] positions") as refused:
        reference.decode_cohort([5, 6], caches)
    assert [reference.cache_length(c) for c in caches] == [9, 8], "a refused cohort changed the lanes"
    serial, batch = [port.make_cache() for _ in lanes], [port.make_cache() for _ in lanes]
    for ids, s, b in zip(lanes, serial, batch):
        port.forward(ids, s, keep=1)
        port.forward(ids, b, keep=1)
    alone = [port.forward([t], s, keep=1).logits[-1] for t, s in zip((5, 6), serial)]
    together = port.decode_cohort([5, 6], batch).logits
    gap = [float(np.max(np.abs(a - b))) for a, b in zip(alone, together)]
    receipt.update(refusal=str(refused.value), port_gap=gap, port_lengths=[port.cache_length(c) for c in batch])
    assert [port.cache_length(c) for c in batch] == [10, 9], f"{port.id} lanes hold {[port.cache_length(c) for c in batch]}"
    assert max(gap) <= port.tolerance().cohort_atol, f"{port.id} cohort of distinct lengths vs serial: max |d| {gap}"
