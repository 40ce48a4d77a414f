"""mlx-vlm's DeepSeek-V4 model held against the torch reference on the DeepSeek-V4 twin (marker
``cohort``: the cohort family's model with compressed caches; the cohort proof itself runs on both
engines in ``test_cohort.py``).

Checks: the artifact as mlx-vlm loads it untranslated (a strict xfail quoting the refusal); the
translations the port made (recorded); the 148-token prefill's logits within the float32 bounds of
:mod:`oracles.checks.port`, and cached prefills of lengths around each rate (one length, 8 =
``index_topk``, a strict xfail); a forward with no cache (a strict xfail: no mask over the entries);
and the decode of the cohort span's lane 0 (prefix 148, 132 teacher-forced steps, positions
148..279: 33 CSA entries and one HCA entry close in it) step by step against the reference: a strict
xfail (:data:`oracles.engines.mlx.deepseek_v4.DECODE_OVERLAP_GAP`), with a check of its own that the
gap starts where it was measured and that mlx-vlm's prefill of the same tokens is within the bounds
there (so it is the decode path, not the model).
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from oracles.checks.port import held_figures, threshold_failures
from oracles.engines.mlx.deepseek_v4 import DECODE_OVERLAP_GAP
from oracles.families.cohort import run as fam
from oracles.plugin.fixtures import Engines, Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.cohort, pytest.mark.slow, pytest.mark.builtin_pin("deepseek-v4-twin")]

PIN = "deepseek-v4-twin"
PORT = "mlx-vlm-dsv4"
#: Where the decode gap was measured to start on the span's lane 0: position 151 (step 3), the first CSA entry
#: closed one token at a time.
GAP_POSITION = 151
#: What mlx-vlm 0.7.10 does with the snapshot as shipped (measured here).
AS_SHIPPED = ("mlx-vlm 0.7.10 loads the official DeepSeek-V4 names, not transformers 5.24's: load_model on the twin "
              "raises 'Received 72 parameters not in model' (hc_head.hc_base, ...), and its ModelConfig reads the "
              "default compress_ratios [0, 128, 4, 0] and num_hash_layers 3 for the twin's [0, 4, 128, 4] and 2")

#: Measured here: mlx-vlm's forward with no cache (``cache=None``) builds no mask over the compressed
#: entries (``pmask`` comes from the pooling cache), so every query sees every entry, future ones too.
COLD_GAP = ("mlx-vlm 0.7.10 DeepSeek-V4 with cache=None masks no compressed entry (the pool mask comes from the "
            "PoolingCache): logits differ from transformers from 4 tokens (the first CSA entry) by 0.35, by 0.66 at "
            "16 and 0.72 at 148, while the same prefill through a cache agrees within 5.4e-7")
#: Measured here over cached prefills of 4..40, 64, 96, 128..152 and 256 tokens (lanes 0 and 1 of the
#: span's prefix formula): every length within 5.4e-7 of transformers except exactly 8 (= index_topk,
#: two CSA entries), whose last row differs by 0.21 (lane 0) and 0.087 (lane 1). Cause not isolated.
INDEX_TOPK_GAP = ("mlx-vlm 0.7.10 DeepSeek-V4 cached prefill of exactly 8 tokens (= index_topk, 2 CSA entries): its "
                  "last row differs from transformers by 0.21; every other length 4..40, 64..256 within 5.4e-7")
#: Cached prefill lengths held within the bounds: the first CSA entry, an open window, a prompt of the
#: execution records' size, past the window and the first HCA entry (each new length costs mlx a compile).
LENGTHS = (4, 9, 45, 129)


def _prefill_figures(pair: tuple[Any, Any], n: int, cached: bool = True) -> dict[str, Any]:
    ref, port = pair
    ids = fam.prefix_tokens(0, n, int(ref.vocab_size))
    return held_figures(f"{PIN} prefill of {n}", ref.forward(ids, ref.make_cache()).logits,
                        port.forward(ids, port.make_cache() if cached else None).logits)


@pytest.fixture
def pair(engines: Engines) -> tuple[Any, Any]:
    """(reference, port) on the twin; skipped, naming why, where either cannot run."""
    return engines("torch", PIN), engines(PORT, PIN)


def _trace(engine: Any, spec: fam.CohortSpec) -> dict[str, Any]:
    """Prefill logits ``[P, V]`` and each decode step's logits ``[steps, V]`` of lane 0, teacher-forced."""
    V = int(engine.vocab_size)
    cache = engine.make_cache()
    prefill = engine.forward(fam.prefix_tokens(0, spec.prefix[0], V), cache).logits
    steps = [engine.forward([fam.supplied_tokens(s, V)[0]], cache, keep=1).logits[-1] for s in range(spec.steps)]
    return {"prefill": prefill, "steps": np.stack(steps)}


@pytest.fixture
def traces(runs: Runs, pair: tuple[Any, Any]) -> dict[str, dict[str, Any]]:
    """The lane-0 traces of both engines over the compressed span, once per session."""
    ref, port = pair
    return runs(("dsv4-port-trace", PIN), lambda: {"ref": _trace(ref, fam.COMPRESSED), "port": _trace(port, fam.COMPRESSED)})


def _step_failures(traces: dict[str, dict[str, Any]]) -> list[tuple[int, list[str], dict[str, Any]]]:
    out = []
    for s in range(fam.COMPRESSED.steps):
        fig = held_figures(f"{PIN} step {s}", traces["ref"]["steps"][s], traces["port"]["steps"][s])
        out.append((s, threshold_failures(fig), fig))
    return out


@pytest.mark.xfail(strict=True, reason=AS_SHIPPED)
def test_dsv4_port_loads_as_shipped(pair: tuple[Any, Any], receipt: Receipt) -> None:
    """The snapshot as mlx-vlm's own ``load_model`` reads it: its schedule fields as transformers reads
    them, and the weights loaded (it refuses them: :data:`AS_SHIPPED`)."""
    from mlx_vlm.models.deepseek_v4.config import ModelConfig
    from mlx_vlm.utils import load_model

    ref, _port = pair
    config = json.loads((ref.root / "config.json").read_text())
    read = ModelConfig.from_dict(config)
    want = {"sliding_attention": 0, **config["compress_rates"]}
    receipt.update(compress_ratios=list(read.compress_ratios), num_hash_layers=int(read.num_hash_layers))
    assert list(read.compress_ratios) == [want[t] for t in config["layer_types"]], (
        f"mlx-vlm reads compress_ratios {read.compress_ratios} for layer_types {config['layer_types']}")
    assert read.num_hash_layers == config["mlp_layer_types"].count("hash_moe"), f"num_hash_layers {read.num_hash_layers}"
    load_model(ref.root)


def test_dsv4_port_translations_recorded(pair: tuple[Any, Any], receipt: Receipt) -> None:
    """The port records every translation it made: the two schedule keys from transformers' own fields,
    and the weight renaming (every transformers tensor under one official name, none dropped)."""
    _ref, port = pair
    d = port.describe()
    receipt.update(config_overrides=d["config_overrides"], translations=d["translations"], tensors=d["tensors_in_out"])
    assert d["config_overrides"] == {"compress_ratios": [0, 4, 128, 4], "num_hash_layers": 2}, d["config_overrides"]
    assert d["translations"] and all(isinstance(t, str) for t in d["translations"])
    n_in, n_out = d["tensors_in_out"]
    config = json.loads((port.root / "config.json").read_text())
    split = int(config["num_hidden_layers"]) * (3 * int(config["n_routed_experts"]) - 2)  # 2 packed -> 3 per expert
    assert n_out == n_in + split, f"{n_in} transformers tensors became {n_out} official ones, expected {n_in + split}"


def test_dsv4_port_prefill_within_float32(traces: dict[str, dict[str, Any]], receipt: Receipt) -> None:
    """The 148-token prefill's logits, every row, within the float32 bounds of :mod:`oracles.checks.port`."""
    fig = held_figures(f"{PIN} prefill", traces["ref"]["prefill"], traces["port"]["prefill"])
    receipt.update(figures={k: v for k, v in fig.items() if k != "disagreements"})
    failures = threshold_failures(fig)
    assert not failures, f"{PIN} ({PORT}) prefill of {fam.COMPRESSED.prefix[0]} tokens: " + "; ".join(failures)


@pytest.mark.xfail(strict=True, reason=f"{PORT}: {DECODE_OVERLAP_GAP}")
def test_dsv4_port_decode_within_float32(traces: dict[str, dict[str, Any]], receipt: Receipt) -> None:
    """Each of the span's 132 decode steps' logits within the float32 bounds (positions 148..279)."""
    bad = [(s, f) for s, f, _fig in _step_failures(traces) if f]
    receipt.update(failing_steps=[s for s, _f in bad][:40], first=bad[0][1] if bad else None)
    assert not bad, (f"{PIN} ({PORT}) decode: {len(bad)} of {fam.COMPRESSED.steps} steps outside the float32 bounds, "
                     f"first at step {bad[0][0]} (position {fam.COMPRESSED.prefix[0] + bad[0][0]}): {bad[0][1]}")


def test_dsv4_port_decode_gap_where_measured(pair: tuple[Any, Any], traces: dict[str, dict[str, Any]],
                                            receipt: Receipt) -> None:
    """The decode gap starts at :data:`GAP_POSITION` (every earlier step within the bounds), and there
    mlx-vlm's own prefill of the same tokens is within the bounds: the gap is its decode path's."""
    _ref, port = pair
    results = _step_failures(traces)
    first = next((s for s, f, _fig in results if f), None)
    P = fam.COMPRESSED.prefix[0]
    V = int(port.vocab_size)
    ids = fam.prefix_tokens(0, P, V) + [fam.supplied_tokens(s, V)[0] for s in range(GAP_POSITION - P + 1)]
    fresh = port.forward(ids, port.make_cache(), keep=1).logits[-1]
    fig = held_figures(f"{PIN} prefill of {len(ids)}", traces["ref"]["steps"][GAP_POSITION - P], fresh)
    worst = max(results, key=lambda r: r[2]["max_abs"])
    receipt.update(first_step=first, first_position=None if first is None else P + first,
                   max_abs_at_gap=results[GAP_POSITION - P][2]["max_abs"], prefill_max_abs_at_gap=fig["max_abs"],
                   worst_step=worst[0], worst_max_abs=worst[2]["max_abs"])
    assert first == GAP_POSITION - P, (f"{PIN} ({PORT}): the decode's first step outside the float32 bounds is "
                                       f"{first} (position {None if first is None else P + first}), measured "
                                       f"{GAP_POSITION - P} (position {GAP_POSITION}): update DECODE_OVERLAP_GAP")
    assert not threshold_failures(fig), f"{PIN} ({PORT}) prefill of {len(ids)} tokens: {threshold_failures(fig)}"


def test_dsv4_port_prefill_lengths_within_float32(pair: tuple[Any, Any], receipt: Receipt) -> None:
    """Cached prefills of :data:`LENGTHS` tokens within the float32 bounds, every row."""
    figs = {n: _prefill_figures(pair, n) for n in LENGTHS}
    receipt.update(max_abs={str(n): f["max_abs"] for n, f in figs.items()})
    bad = {n: threshold_failures(f) for n, f in figs.items() if threshold_failures(f)}
    assert not bad, f"{PIN} ({PORT}) cached prefills outside the float32 bounds: {bad}"


@pytest.mark.xfail(strict=True, reason=f"{PORT}: {INDEX_TOPK_GAP}")
def test_dsv4_port_prefill_of_index_topk_within_float32(pair: tuple[Any, Any], receipt: Receipt) -> None:
    """A cached prefill of exactly ``index_topk`` = 8 tokens within the float32 bounds (:data:`INDEX_TOPK_GAP`)."""
    fig = _prefill_figures(pair, 8)
    receipt.update(max_abs=fig["max_abs"], max_abs_at=fig["max_abs_at"])
    assert not threshold_failures(fig), f"{PIN} ({PORT}) prefill of 8: {threshold_failures(fig)}"


@pytest.mark.xfail(strict=True, reason=f"{PORT}: {COLD_GAP}")
def test_dsv4_port_cold_forward_within_float32(pair: tuple[Any, Any], receipt: Receipt) -> None:
    """mlx-vlm's forward with no cache, 16 tokens, within the float32 bounds (:data:`COLD_GAP`)."""
    fig = _prefill_figures(pair, 16, cached=False)
    receipt.update(max_abs=fig["max_abs"], max_abs_at=fig["max_abs_at"])
    assert not threshold_failures(fig), f"{PIN} ({PORT}) forward of 16 with cache=None: {threshold_failures(fig)}"


def test_dsv4_caches_refuse_trimming(pair: tuple[Any, Any]) -> None:
    """Neither engine trims a DeepSeek-V4 cache (a crop would leave the compressors' entries and open
    window as they were: transformers' layers claim ``is_croppable`` all the same), so the families
    roll back by snapshot/restore; a refused trim leaves the cache as it was."""
    for engine in pair:
        cache = engine.make_cache()
        engine.forward(fam.prefix_tokens(0, 9, int(engine.vocab_size)), cache, keep=1)
        assert not engine.is_trimmable(cache), f"{engine.id}: a DeepSeek-V4 cache reported trimmable"
        assert not engine.trim(cache, 1) and engine.cache_length(cache) == 9, f"{engine.id}: a refused trim changed it"


def test_dsv4_lanes_of_distinct_lengths(pair: tuple[Any, Any], receipt: Receipt) -> None:
    """transformers' DeepSeek-V4 cache cannot batch lanes of distinct lengths (one entry count per layer):
    the reference refuses them, naming the lengths, before any lane changes; mlx-vlm's batch caches keep
    per-lane lengths, and its cohort of a 9- and an 8-token lane (one CSA entry closing in one lane only)
    is within the cohort bound of each lane's serial step."""
    from oracles.engines.types import Unsupported

    ref, port = pair
    V = int(ref.vocab_size)
    lanes = [fam.prefix_tokens(q, n, V) for q, n in ((0, 9), (1, 8))]
    caches = [ref.make_cache() for _ in lanes]
    for ids, c in zip(lanes, caches):
        ref.forward(ids, c, keep=1)
    with pytest.raises(Unsupported, match=r"the lanes hold \[9, 8\] positions") as refused:
        ref.decode_cohort([5, 6], caches)
    assert [ref.cache_length(c) for c in caches] == [9, 8], "a refused cohort changed the lanes"
    serial, batch = [port.make_cache() for _ in lanes], [port.make_cache() for _ in lanes]
    for ids, s, b in zip(lanes, serial, batch):
        port.forward(ids, s, keep=1)
        port.forward(ids, b, keep=1)
    alone = [port.forward([t], s, keep=1).logits[-1] for t, s in zip((5, 6), serial)]
    together = port.decode_cohort([5, 6], batch).logits
    gap = [float(np.max(np.abs(a - b))) for a, b in zip(alone, together)]
    receipt.update(refusal=str(refused.value), mlx_gap=gap, mlx_lengths=[port.cache_length(c) for c in batch])
    assert [port.cache_length(c) for c in batch] == [10, 9], f"mlx lanes hold {[port.cache_length(c) for c in batch]}"
    assert max(gap) <= port.tolerance().cohort_atol, f"{PORT} cohort of distinct lengths vs serial: max |d| {gap}"
