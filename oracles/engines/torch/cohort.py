"""The torch reference's cohort capabilities: a batched decode over plain, static and hybrid caches,
per-buffer views of live caches, growing a cache to a capacity, resident bytes and a call counter.

A lane cache is a transformers ``Cache`` whose per-layer entries are of three kinds:

- ``DynamicLayer`` (attention): keys/values ``[1, H, L, d]`` are exactly the ``L`` valid rows; every
  update concatenates a new tensor, so it has no spare capacity;
- ``StaticLayer`` (attention, what :meth:`TorchCohort.grow` makes): ``[1, H, C, d]`` buffers of capacity
  ``C`` written in place, valid rows ``[:cumulative_length]``;
- ``LinearAttentionLayer`` (Gated DeltaNet and other recurrent layers): per state index a conv state
  ``[1, C_conv, K]`` and a recurrent state ``[1, H_v, d_k, d_v]`` of fixed shapes, rewritten each step.

Sliding-window and hybrid (both kinds in one layer) entries raise
:class:`~oracles.engines.base.Unsupported`, except in a DeepSeek-V4 cache (its sliding window beside
compressed entries), which :mod:`oracles.engines.torch.cohort_dsv4` handles whole. torch and
transformers are imported inside the functions.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Step, check_cohort
from oracles.engines.torch import cohort_dsv4 as dsv4

#: Measured on this 2-core CPU (torch 2.13, one thread): the cohort family's B = 4 lanes (prompts of
#: 33-54 tokens, 132 teacher-forced steps), cohort un-permuted vs serial, max |d| over lanes and steps.
#: A 4-row CPU ``nn.Linear`` already differs from a 1-row one: MKL/oneDNN block a 4-row product
#: otherwise, so its sums run in another order. A lane kept in its row of a same-shaped batch is
#: bit-exact (the family's row-isolation proof; not on DeepSeek-V4's MoE:
#: :data:`oracles.engines.torch.cohort_dsv4.ROW_VARIANCE`), and two rows holding one lane agree.
BATCH_VARIANCE = (
    "torch CPU matmuls are not batch-invariant (a 4-row nn.Linear sums in another order than a 1-row one); "
    "measured B=4 cohort vs serial over 132 steps, max |d|: SmolLM2-135M hidden 6.0e-5, logits 7.5e-5, keys "
    "2.9e-5, values 2.1e-5; hybrid twin hidden 4.8e-5, logits 6.1e-5, keys 3.7e-5, values 3.1e-5, conv state "
    "2.8e-5, recurrent state 1.6e-6; draft twin hidden 7.2e-7, logits 7.2e-7, keys 2.1e-7, values 2.4e-7; DeepSeek-V4 "
    "twin (4 lanes of 148) hidden 1.4e-6, logits 3.8e-7, window_kv 1.9e-6, compressor 1.3e-6, indexer 1.2e-6")

#: Why a DeepSeek-V4 cache has no capacity to grow (transformers 5.24's DeepseekV4PreTrainedModel).
NO_STATIC_DSV4 = ("transformers' DeepSeek-V4 cache has no static form: its compressed layers grow by concatenation "
                  "and the model refuses a StaticCache (its compressor needs the DeepSeek-V4 cache layers)")


def _layer_kind(layer: Any) -> str:
    """``"dynamic"``, ``"static"``, ``"linear"``, or the class name of an entry this module cannot handle."""
    from transformers.cache_utils import (
        CacheLayerMixin,
        DynamicLayer,
        DynamicSlidingWindowLayer,
        LinearAttentionCacheLayerMixin,
        StaticLayer,
        StaticSlidingWindowLayer,
    )

    if isinstance(layer, LinearAttentionCacheLayerMixin):
        return type(layer).__name__ if isinstance(layer, CacheLayerMixin) else "linear"
    if isinstance(layer, (DynamicSlidingWindowLayer, StaticSlidingWindowLayer)):
        return type(layer).__name__
    if isinstance(layer, StaticLayer):
        return "static"
    if isinstance(layer, DynamicLayer):
        return "dynamic"
    return type(layer).__name__


def _rows(layer: Any) -> tuple[Any, Any] | None:
    """An attention entry's valid keys and values ``[1, H, n, d]`` (views; a static buffer's first
    ``min(cumulative_length, max_cache_len)`` rows, a sliding window's as stored), or None when it
    holds none (or is no attention entry)."""
    from transformers.cache_utils import StaticLayer

    if not getattr(layer, "is_initialized", False) or getattr(layer, "keys", None) is None:
        return None
    if isinstance(layer, StaticLayer):
        n = min(int(layer.cumulative_length), int(layer.max_cache_len))
    else:
        n = int(layer.keys.shape[-2])
    return (layer.keys[..., :n, :], layer.values[..., :n, :]) if n else None


def _states(layer: Any) -> list[tuple[str, Any]]:
    """A linear (or hybrid) entry's initialised states as ``(name, tensor)``, named as
    :meth:`TorchCohort.snapshot_buffers` says; ``[]`` for an attention entry."""
    out = []
    for name, states in (("conv_state", getattr(layer, "conv_states", None) or {}),
                         ("recurrent_state", getattr(layer, "recurrent_states", None) or {})):
        for k, t in states.items():
            if t is not None:
                out.append((name + (f".{k}" if len(states) > 1 else ""), t))
    return out


def _np_view(t: Any) -> np.ndarray:
    """A read-only float32 numpy view of a CPU float32 tensor (a copy for any other tensor)."""
    t = t.detach()
    if t.device.type == "cpu" and str(t.dtype) == "torch.float32":
        a = t.numpy()
    else:
        a = t.float().cpu().numpy()
    a.flags.writeable = False
    return a


class TorchCohort(Engine):
    """Mixin of :class:`oracles.engines.torch.reference.TorchReference`: the cohort capabilities of the base
    class for transformers caches. Reads the reference's ``model``, ``_captured`` (the final-norm hook's
    outputs) and ``_ids_tensor``."""

    model: Any
    _captured: list[Any]

    def _ids_tensor(self, rows: Sequence[Sequence[int]]) -> Any:
        raise NotImplementedError

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """One token for each of ``B`` lanes in one batched transformers forward (contract:
        :meth:`oracles.engines.base.Engine.decode_cohort`).

        transformers' own batching: attention entries' valid keys/values are left-padded with zeros
        to ``L = max L_b`` and stacked into a batch ``DynamicCache`` ``[B, H, L, d]``; linear entries'
        conv and recurrent states (no sequence axis) are stacked ``[B, ...]`` as they are. The 2-D
        attention mask ``[B, L + 1]`` is 0 on the padding, and lane ``b``'s position id is ``L_b``.
        After the forward each lane takes its row back: the new key/value column through its own
        entry's ``update`` (concatenated, or written in place into a static buffer), its new states
        copied into its own state tensors.

        Raises:
            ValueError: see :func:`oracles.engines.base.check_cohort`; a lane whose recurrent layer
                holds no state yet (prefill it first); a static lane at its capacity.
            Unsupported: a sliding-window or hybrid entry, or a linear entry recording its past.
        """
        import torch
        from transformers import DynamicCache

        check_cohort(self, tokens, caches)
        if dsv4.is_compressed(caches[0]):
            return self._decode_compressed(tokens, caches)
        with torch.inference_mode():
            lengths = [self.cache_length(c) for c in caches]
            width = max(lengths)
            batch = DynamicCache(config=self.model.config)
            kinds = [self._lane_kinds(caches, i) for i in range(len(caches[0].layers))]
            for i, kind in enumerate(kinds):
                if kind == "linear":
                    _stack_states(batch.layers[i], [c.layers[i] for c in caches], i)
                elif width:
                    _stack_rows(batch, i, [_rows(c.layers[i]) for c in caches], lengths, width)
            mask = torch.zeros((len(caches), width + 1), dtype=torch.long, device=self.model.device)
            for b, n in enumerate(lengths):
                mask[b, width - n:] = 1
            positions = torch.tensor([[n] for n in lengths], dtype=torch.long, device=self.model.device)
            self._captured.clear()
            out = self.model(input_ids=self._ids_tensor([[int(t)] for t in tokens]), attention_mask=mask,
                             position_ids=positions, cache=batch, use_cache=True)
            hidden = self._captured[-1][:, -1]
            self._captured.clear()
            for i, kind in enumerate(kinds):
                new = dict(_states(batch.layers[i])) if kind == "linear" else {}
                for b, c in enumerate(caches):
                    if kind == "linear":
                        for name, t in _states(c.layers[i]):
                            t.copy_(new[name][b:b + 1])
                    else:
                        _append_row(c, i, batch.layers[i], b, lengths[b])
            return Step(logits=_copy(out.logits[:, -1]), hidden=_copy(hidden))

    def _decode_compressed(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """:meth:`decode_cohort` on DeepSeek-V4 caches (:func:`oracles.engines.torch.cohort_dsv4.decode_cohort`)."""
        import torch

        def run(ids: Any, batch: Any) -> Any:
            return self.model(input_ids=ids, cache=batch, use_cache=True)

        with torch.inference_mode():
            self._captured.clear()
            try:
                out = dsv4.decode_cohort(self.model, run, self._ids_tensor([[int(t)] for t in tokens]), caches,
                                         lambda why: self._unsupported("decode a cohort of these caches", why))
                hidden = self._captured[-1][:, -1]
            finally:
                self._captured.clear()
            return Step(logits=_copy(out.logits[:, -1]), hidden=_copy(hidden))

    def _lane_kinds(self, caches: Sequence[Any], i: int) -> str:
        """The one kind of layer ``i`` across the lanes: ``"linear"``, or ``"dynamic"``/``"static"``/
        ``"mixed"`` for attention entries (the lanes may hold either)."""
        kinds = {_layer_kind(c.layers[i]) for c in caches}
        odd = kinds - {"dynamic", "static", "linear"}
        if odd or ("linear" in kinds and len(kinds) > 1):
            raise self._unsupported("decode a cohort of these caches", f"layer {i} holds {sorted(kinds)} entries")
        if kinds == {"linear"}:
            for b, c in enumerate(caches):
                layer = c.layers[i]
                if getattr(layer, "record_past", False):
                    raise self._unsupported("decode a cohort of these caches", f"lane {b} layer {i} records its past")
                if not all(layer.has_previous_state.values()):
                    raise ValueError(f"decode_cohort: lane {b} layer {i} holds no recurrent state yet (prefill it)")
            return "linear"
        return kinds.pop() if len(kinds) == 1 else "mixed"

    def cache_views(self, cache: Any) -> dict[str, np.ndarray]:
        """Zero-copy read-only views of a live cache's valid rows (contract: :meth:`Engine.cache_views`):
        a static buffer is written in place beyond its valid rows and a linear state in place, so a
        view is read before the next forward on ``cache``. Every entry kind is listed (a sliding
        window as stored), though only plain, static and linear entries decode as a cohort."""
        if dsv4.is_compressed(cache):
            return {name: _np_view(t) for name, t in dsv4.buffers(cache).items()}
        out: dict[str, np.ndarray] = {}
        for i, layer in enumerate(cache.layers):
            rows = _rows(layer)
            if rows is not None:
                out[f"layers.{i}.keys"], out[f"layers.{i}.values"] = _np_view(rows[0]), _np_view(rows[1])
            out.update({f"layers.{i}.{name}": _np_view(t) for name, t in _states(layer)})
        return out

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        """Per layer: ``keys`` / ``values`` ``[1, H_kv, n, d]`` (valid rows) of attention layers,
        ``conv_state`` / ``recurrent_state`` of linear-attention layers (``.<k>`` suffixed when a layer
        holds several); copies."""
        return {name: np.array(a, dtype="<f4", copy=True) for name, a in self.cache_views(snapshot).items()}

    def cache_capacity(self, cache: Any) -> int:
        """The smallest attention entry's capacity: a static buffer's ``max_cache_len``, a dynamic
        entry's length (it reallocates on every update).

        Raises:
            Unsupported: no attention entry (a purely recurrent cache never reallocates).
        """
        if dsv4.is_compressed(cache):
            raise self._unsupported("measure a cache's capacity", NO_STATIC_DSV4)
        caps = [layer.max_cache_len if kind == "static" else self.cache_length(cache)
                for layer in cache.layers if (kind := _layer_kind(layer)) in ("dynamic", "static")]
        if not caps:
            raise self._unsupported("measure a cache's capacity", "it has no attention layer")
        return min(caps)

    def grow(self, cache: Any, capacity: int) -> Any:
        """A transformers ``StaticCache(max_cache_len=capacity)`` holding ``cache``'s valid rows: the
        capacity a transformers cache has is a static one (buffers allocated once, written in place,
        what ``torch.compile`` decoding uses); a ``DynamicCache`` reallocates at every update. Linear
        entries (fixed-shape states) are copied as they are.

        Raises:
            ValueError: ``capacity`` below the cache's length.
            Unsupported: a sliding-window or hybrid entry.
        """
        import torch
        from transformers import StaticCache

        if dsv4.is_compressed(cache):
            raise self._unsupported("grow a cache to a larger capacity", NO_STATIC_DSV4)
        n = self.cache_length(cache)
        if capacity < n:
            raise ValueError(f"grow: capacity {capacity} is below the cache's {n} positions")
        grown = StaticCache(config=self.model.config, max_cache_len=capacity)
        with torch.inference_mode():
            for i, layer in enumerate(cache.layers):
                kind = _layer_kind(layer)
                if kind == "linear":
                    grown.layers[i] = copy.deepcopy(layer)
                elif kind in ("dynamic", "static"):
                    rows, target = _rows(layer), grown.layers[i]
                    if rows is not None:
                        # where the old cache held attention rows the StaticCache built an attention layer
                        target.update(rows[0].clone(), rows[1].clone())  # type: ignore[union-attr]  # not a linear one
                else:
                    raise self._unsupported("grow a cache to a larger capacity", f"layer {i} is a {kind}")
        return grown

    def resident_bytes(self, obj: Any) -> int:
        """Bytes of the distinct storages a cache (or a snapshot: a cache too) holds, spare capacity in."""
        seen: dict[int, int] = {}
        tensors = list(dsv4.buffers(obj).values()) if dsv4.is_compressed(obj) else []
        for layer in obj.layers:
            tensors += [getattr(layer, "keys", None), getattr(layer, "values", None)]
            tensors += [t for _name, t in _states(layer)]
        for t in tensors:
            if t is not None and t.numel():
                seen[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return sum(seen.values())

    def weight_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def counters(self) -> dict[str, float]:
        """``model_forward_calls``: calls of the transformers model (a forward pre-hook, set at the first ask)."""
        if not hasattr(self, "_forward_calls"):
            self._forward_calls = [0]
            self.model.register_forward_pre_hook(lambda *_: self._forward_calls.__setitem__(0, self._forward_calls[0] + 1))
        return {"model_forward_calls": float(self._forward_calls[0])}

    def batch_variance(self) -> str | None:
        return BATCH_VARIANCE

    def row_variance(self) -> str | None:
        """Why a lane kept in its row of a same-shaped batch does not keep its bits when the other lanes'
        tokens change, with the measured figures; None where it does (the cohort family's default claim).
        This engine's own capability (the cohort family asks for it by name)."""
        return dsv4.ROW_VARIANCE if getattr(self.model.config, "model_type", "") == "deepseek_v4" else None


def _stack_rows(batch: Any, i: int, rows: list[tuple[Any, Any] | None], lengths: list[int], width: int) -> None:
    """Left-pad each lane's valid keys/values to ``width`` and put the stack in ``batch`` layer ``i``."""
    import torch

    like_k, like_v = next(r for r in rows if r is not None)
    keys, values = [], []
    for r, n in zip(rows, lengths):
        k, v = r if r is not None else (like_k[:, :, :0], like_v[:, :, :0])  # an empty lane: no rows yet
        pad = (0, 0, width - n, 0)  # left-pad the sequence axis (dim -2)
        keys.append(torch.nn.functional.pad(k, pad))
        values.append(torch.nn.functional.pad(v, pad))
    batch.update(torch.cat(keys), torch.cat(values), i)


def _stack_states(target: Any, lanes: list[Any], i: int) -> None:
    """Stack the lanes' conv and recurrent states of linear layer ``i`` into the batch's entry."""
    import torch

    first = lanes[0]
    for k in range(first.number_of_states):
        conv = torch.cat([lane.conv_states[k] for lane in lanes]) if first.is_conv_states_initialized[k] else None
        rec = (torch.cat([lane.recurrent_states[k] for lane in lanes])
               if first.is_recurrent_states_initialized[k] else None)
        target.lazy_initialization(conv_states=conv, recurrent_states=rec, state_idx=k,
                                   conv_kernel_size=first.conv_kernel_size[k])
        if conv is not None:
            target.conv_states[k].copy_(conv)
        if rec is not None:
            target.recurrent_states[k].copy_(rec)
        target.has_previous_state[k] = True


def _append_row(cache: Any, i: int, batch_layer: Any, b: int, n: int) -> None:
    """Append row ``b``'s new key/value column of the batch's layer ``i`` to the lane's own entry."""
    layer = cache.layers[i]
    if _layer_kind(layer) == "static" and n + 1 > layer.max_cache_len:
        raise ValueError(f"decode_cohort: lane {b} holds {n} positions, its static capacity {layer.max_cache_len}")
    cache.update(batch_layer.keys[b:b + 1, :, -1:].clone(), batch_layer.values[b:b + 1, :, -1:].clone(), i)


def _copy(t: Any) -> np.ndarray:
    return t.detach().float().cpu().numpy().astype("<f4", copy=True)
