"""The torch reference's cohort capabilities on DeepSeek-V4's compressed caches (transformers 5.24's
``DeepseekV4CSACache`` / ``DeepseekV4HCACache`` beside a ``DynamicSlidingWindowLayer``).

A DeepSeek-V4 lane cache holds, per layer ``i`` (the buffer names :func:`buffers` gives them):

- ``layers.i.window_kv`` ``[1, 1, n, d]``: the sliding window's shared K=V rows (``n <= window - 1``:
  transformers keeps ``sliding_window - 1`` rows and attends over them plus the new one);
- on a compressed layer, per compressor ``c`` (``compressor``; a CSA layer's Lightning Indexer adds
  ``indexer``): ``layers.i.c.compressed_kv`` ``[1, T, d_c]``, the ``T`` entries emitted so far, one per
  ``rate`` positions (4 on CSA, 128 on HCA); ``layers.i.c.buffer_kv`` / ``buffer_gate``
  ``[1, n mod rate, w]``, the projected positions of the window still open (the compressor's running
  state); on CSA ``layers.i.c.overlap_kv`` / ``overlap_gate`` ``[1, 1, d_c]``, the last closed window's
  first-series slice that the next entry overlaps.

Every tensor is batch-first, and ``cumulative_length`` and ``entry_count`` are plain ints, one per layer:
so transformers batches lanes by concatenating every tensor on the batch axis, which is only the
lanes' own state when the lanes hold the same number of positions (then every count and every
running buffer's length agree). :func:`decode_cohort` batches exactly so and refuses lanes of distinct
lengths (transformers' DeepSeek-V4 cache cannot hold them in one batch: one ``entry_count`` per layer,
one ``first_window_position``, no padding of the compressor's buffers). torch is imported inside the
functions.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

#: Measured on the DeepSeek-V4 twin (torch 2.13 CPU, one thread, transformers 5.24): the cohort family's
#: isolation runs (every other lane's tokens changed, 16 steps) move a kept lane's bits from step 0, max
#: |d| hidden 9.5e-7, logits 3.0e-7, window_kv 9.5e-7, compressor 7.2e-7, indexer 7.7e-7. The cause:
#: ``DeepseekV4Experts.forward`` gathers every token routed to an expert across the batch
#: (``hidden_states[token_idx]``) into one ``F.linear``, whose row count then depends on the other lanes'
#: routing, and a CPU matmul of another row count sums in another order. Routed one token at a time
#: (a patched forward, measured over 8 steps) every isolation run is bit-exact.
ROW_VARIANCE = (
    "transformers' DeepseekV4Experts gathers each expert's tokens across the batch into one F.linear, so a lane's "
    "expert product has as many rows as lanes chose that expert and sums in another order when the other lanes' "
    "tokens change: measured on deepseek-v4-twin from step 0, max |d| hidden 9.5e-7, logits 3.0e-7, window_kv "
    "9.5e-7, compressor 7.2e-7, indexer 7.7e-7 (routed one token at a time, every isolation run is bit-exact)")
#: The per-compressor tensor fields of transformers' DeepSeek-V4 cache layers (dicts keyed by compressor).
FIELDS = ("compressed_kv", "buffer_kv", "buffer_gate", "overlap_kv", "overlap_gate")


#: Why neither engine gives DeepSeek-V4's per-layer residual (``forward(layers=True)``, taps, bisect): the
#: contract's row ``[T, D]`` after a layer, whose final norm is the hidden state the head reads and which a
#: layer's attention and MLP outputs add up to, does not exist in this architecture. transformers 5.24
#: (``DeepseekV4DecoderLayer``, ``DeepseekV4HyperHead``) and mlx-vlm 0.7.10 alike keep ``hc_mult`` streams
#: ``[T, hc_mult, D]`` between layers (the embedding copied into each), each block reads a learned,
#: input-dependent mix of them (``pre``) and writes ``post * out + comb^T @ streams`` (a Sinkhorn-normalised
#: mix, not a sum), and the head reads ``norm(hc_head(streams))``, a learned collapse: no one stream, nor
#: their mean, is the row the head's norm reads.
NO_RESIDUAL_ROW = ("DeepSeek-V4 keeps hc_mult residual streams [T, hc_mult, D] between layers, mixed by learned "
                   "hyper-connections (a block writes post * out + comb^T @ streams, not stream + out; the head reads "
                   "norm(hc_head(streams)), a learned input-dependent collapse), so no [T, D] row per layer is the "
                   "residual stream the contract's layers, taps and bisect hold")


def stream_refusal(decoder: Any) -> str | None:
    """:data:`NO_RESIDUAL_ROW` for a DeepSeek-V4 decoder (transformers' ``DeepseekV4Model``: it has the
    hyper-connection head ``hc_head``), None for a decoder whose layers pass one ``[T, D]`` residual."""
    return NO_RESIDUAL_ROW if getattr(decoder, "hc_head", None) is not None else None


def is_compressed(cache: Any) -> bool:
    """Whether ``cache`` (a transformers ``Cache``) holds a DeepSeek-V4 compressed layer."""
    return any(hasattr(layer, "compressed_kv") for layer in getattr(cache, "layers", ()))


def buffers(cache: Any) -> dict[str, Any]:
    """Every buffer of a DeepSeek-V4 cache as ``{name: tensor}`` (module docstring), layer by layer."""
    out: dict[str, Any] = {}
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "is_initialized", False) and getattr(layer, "keys", None) is not None:
            out[f"layers.{i}.window_kv"] = layer.keys
        for field in FIELDS:
            for name, t in (getattr(layer, field, None) or {}).items():
                if t is not None:
                    out[f"layers.{i}.{name}.{field}"] = t
    return dict(sorted(out.items(), key=lambda kv: _order(kv[0])))


def _order(name: str) -> tuple[int, str]:
    return int(name.split(".")[1]), name


def entry_counts(cache: Any) -> dict[str, int]:
    """``{"layers.i.c": entries emitted}`` of every compressor of a DeepSeek-V4 cache."""
    return {f"layers.{i}.{name}": int(n) for i, layer in enumerate(cache.layers)
            for name, n in (getattr(layer, "entry_count", None) or {}).items()}


def _state(cache: Any) -> tuple[Any, ...]:
    """What must agree across lanes for transformers to batch them: per layer the cached length,
    entry counts and the running buffers' lengths."""
    return tuple((int(getattr(layer, "cumulative_length", 0)), tuple(sorted((getattr(layer, "entry_count", None)
                  or {}).items())), tuple((k, None if t is None else int(t.shape[1]))
                  for k, t in sorted((getattr(layer, "buffer_kv", None) or {}).items())))
                 for layer in cache.layers)


def _stack_layer(lanes: list[Any]) -> Any:
    """One batch layer holding the lanes' layers on the batch axis (counts from lane 0, equal by check)."""
    import torch

    batch = copy.copy(lanes[0])
    if getattr(batch, "keys", None) is not None:
        batch.keys = torch.cat([lane.keys for lane in lanes])
        batch.values = batch.keys  # K = V: one tensor, as transformers' own update keeps it
    for field in FIELDS:
        own = getattr(batch, field, None)
        if own is not None:
            setattr(batch, field, {k: None if t is None else torch.cat([getattr(lane, field)[k] for lane in lanes])
                                   for k, t in own.items()})
    if hasattr(batch, "entry_count"):
        batch.entry_count = dict(batch.entry_count)
    return batch


def _take_row(batch: Any, b: int, lane: Any) -> None:
    """Give lane ``b`` its row of every batch tensor (copies) and the batch's counts."""
    lane.cumulative_length = batch.cumulative_length
    if getattr(batch, "keys", None) is not None:
        lane.keys = batch.keys[b:b + 1].clone()
        lane.values = lane.keys
    for field in FIELDS:
        own = getattr(batch, field, None)
        if own is not None:
            setattr(lane, field, {k: None if t is None else t[b:b + 1].clone() for k, t in own.items()})
    if hasattr(batch, "entry_count"):
        lane.entry_count = dict(batch.entry_count)


def decode_cohort(model: Any, run: Callable[[Any, Any], Any], ids: Any, caches: Sequence[Any],
                  refuse: Callable[[str], Exception]) -> Any:
    """One batched transformers forward of ``B`` DeepSeek-V4 lanes; returns ``run``'s output.

    ``run(ids, cache)`` calls the model on ``ids`` ``[B, 1]`` (int64) with a batch cache, as the serial
    forward calls it (no mask, no position ids: the model derives them from the cache). The batch
    cache is a shallow copy of lane 0's whose every tensor is the lanes' tensors concatenated on the
    batch axis; after the forward each lane takes its row back (:func:`_take_row`).

    Raises:
        Exception: ``refuse(why)`` (the engine's Unsupported) when the lanes' cached lengths, entry counts
            or running buffers differ (module docstring).
    """
    states = [_state(c) for c in caches]
    if len(set(states)) > 1:
        lengths = [s[0][0] if s else 0 for s in states]
        raise refuse(f"transformers' DeepSeek-V4 cache batches lanes only at one length (one entry count and "
                     f"cumulative length per layer for the whole batch); the lanes hold {lengths} positions")
    batch = copy.copy(caches[0])
    batch.layers = [_stack_layer([c.layers[i] for c in caches]) for i in range(len(caches[0].layers))]
    out = run(ids, batch)
    for b, cache in enumerate(caches):
        for i, layer in enumerate(cache.layers):
            _take_row(batch.layers[i], b, layer)
    return out
