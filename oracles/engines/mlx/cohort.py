"""The MLX port's cohort capabilities: mlx-lm's own batched decode over plain and hybrid caches, growing
a cache to a capacity, resident bytes and MLX's memory counters.

A lane cache is mlx-lm's list of per-layer cache objects: ``KVCache`` (attention: keys/values buffers
``[1, H, C, d]`` allocated in steps of ``KVCache.step`` = 256 positions, written in place, valid rows
``[:offset]``) and ``ArraysCache`` (a recurrent layer: ``[conv state, recurrent state]`` of fixed
shapes, replaced each step). Other classes (a ``RotatingKVCache`` window) raise
:class:`~oracles.engines.base.Unsupported`. mlx is imported inside the functions.
"""

from __future__ import annotations

import importlib
from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Step, check_cohort
from oracles.engines.mlx.precision import LoadedPrecision


def _mx() -> Any:
    return importlib.import_module("mlx.core")


def flat_parameters(model: Any) -> list[tuple[str, Any]]:
    """``(dotted name, mx.array)`` of every parameter of an mlx ``nn.Module``, in mlx's tree order.

    mlx's ``tree_flatten`` fills the list it is given (and returns it, typed list-or-dict)."""
    from mlx.utils import tree_flatten

    flat: list[tuple[str, Any]] = []
    tree_flatten(model.parameters(), destination=flat)
    return flat


def to_numpy(a: Any) -> np.ndarray:
    """An mx array as a float32 numpy array (``astype(mx.float32)`` first: numpy has no bfloat16, and
    the cast is exact from bfloat16 and float16)."""
    mx = _mx()
    return np.array(a.astype(mx.float32), dtype=np.float32)


class MlxCohort(Engine):
    """Mixin of :class:`oracles.engines.mlx.lm.MlxPort`: the cohort capabilities of the base class for
    mlx-lm caches. Reads the port's ``model`` and ``_head``. Per-buffer views are the base class's copy
    (:meth:`Engine.cache_views`): an mx array slice-assigned by ``KVCache.update_and_fetch`` changes
    under any view of it, so numpy copies are what a comparison may hold."""

    model: Any
    _precision: LoadedPrecision

    def _head(self, hidden: Any) -> Any:
        raise NotImplementedError

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """One token for each of ``B`` lanes in one batched mlx-lm forward (contract:
        :meth:`oracles.engines.base.Engine.decode_cohort`).

        mlx-lm's own batching, as its ``batch_generate`` does it: per layer the lanes' caches are
        merged by their class's ``merge``: ``KVCache.merge`` gives a ``BatchKVCache`` (keys left-padded
        to the longest lane, per-lane offsets that the rotary embedding and ``make_mask`` read),
        ``ArraysCache.merge`` stacks the recurrent layers' states ``[B, ...]``. The model runs the
        ``[B, 1]`` tokens through them; then lane ``b`` takes its row back into its own objects: the new
        key/value column through its ``KVCache.update_and_fetch`` (in place while its buffer has room,
        as a serial forward writes it), its new states as its ``ArraysCache`` entries.

        Raises:
            ValueError: see :func:`oracles.engines.base.check_cohort`.
            Unsupported: a layer of another cache class (a rotating window), or lanes of mixed classes.
        """
        mx = _mx()
        check_cohort(self, tokens, caches)
        batch = [self._merge(i, [lane[i] for lane in caches]) for i in range(len(caches[0]))]
        x = mx.array([[int(t)] for t in tokens], dtype=mx.int32)
        hidden = self.model.model(x, batch)[:, -1]
        logits = self._head(hidden)
        mx.eval(hidden, logits)
        touched: list[Any] = []
        for merged, layers in zip(batch, zip(*caches)):
            for b, own in enumerate(layers):
                if type(own).__name__ == "KVCache":
                    end = merged.size()
                    own.update_and_fetch(merged.keys[b:b + 1, :, end - 1:end], merged.values[b:b + 1, :, end - 1:end])
                    touched += [own.keys, own.values]
                else:
                    own.cache = [None if a is None else mx.contiguous(a[b:b + 1]) for a in merged.cache]
                    touched += [a for a in own.cache if a is not None]
        mx.eval(*touched)
        return Step(logits=to_numpy(logits), hidden=to_numpy(hidden))

    def _merge(self, i: int, lanes: list[Any]) -> Any:
        names = {type(c).__name__ for c in lanes}
        if len(names) != 1 or names & {"KVCache", "ArraysCache"} != names:
            raise self._unsupported("decode a cohort of these caches", f"layer {i} holds {sorted(names)}; "
                                    "KVCache and ArraysCache layers are merged")
        return type(lanes[0]).merge(lanes)

    def cache_capacity(self, cache: Any) -> int:
        """The smallest ``KVCache`` buffer's positions (``keys.shape[2]``; 0 before the first update).

        Raises:
            Unsupported: no ``KVCache`` layer.
        """
        caps = [0 if c.keys is None else int(c.keys.shape[2]) for c in cache if type(c).__name__ == "KVCache"]
        if not caps:
            raise self._unsupported("measure a cache's capacity", "it has no KVCache layer")
        return min(caps)

    def grow(self, cache: Any, capacity: int) -> list[Any]:
        """New cache objects whose ``KVCache`` buffers hold ``capacity`` positions rounded up to
        ``KVCache.step`` (mlx-lm's own allocation unit; never less than the buffer had), the valid rows
        copied and the offset kept, so
        updates up to that capacity write in place instead of concatenating a new step; ``ArraysCache``
        states (fixed shapes) are copied.

        Raises:
            ValueError: ``capacity`` below the cache's length.
            Unsupported: a layer of another class.
        """
        mx = _mx()
        from mlx_lm.models.cache import ArraysCache, KVCache

        n = self.cache_length(cache)
        if capacity < n:
            raise ValueError(f"grow: capacity {capacity} is below the cache's {n} positions")
        out: list[Any] = []
        for i, c in enumerate(cache):
            name = type(c).__name__
            g: Any
            if name == "KVCache":
                g = KVCache()
                if c.keys is not None:
                    b, h, had, dk = c.keys.shape
                    size = max(-(-capacity // KVCache.step) * KVCache.step, had)
                    g.keys = mx.zeros((b, h, size, dk), c.keys.dtype)
                    g.values = mx.zeros((b, h, size, c.values.shape[3]), c.values.dtype)
                    g.keys[..., :c.offset, :] = c.keys[..., :c.offset, :]
                    g.values[..., :c.offset, :] = c.values[..., :c.offset, :]
                    g.offset = c.offset
                    mx.eval(g.keys, g.values)
            elif name == "ArraysCache":
                g = ArraysCache(len(c.cache))
                g.cache = [None if a is None else mx.array(a) for a in c.cache]  # mx.array(a): a copy
            else:
                raise self._unsupported("grow a cache to a larger capacity", f"layer {i} is a {name}")
            out.append(g)
        return out

    def resident_bytes(self, obj: Any) -> int:
        """A live cache: its layers' ``nbytes`` (whole buffers); a snapshot: its numpy arrays' bytes."""
        if obj and isinstance(obj[0], dict):
            return sum(int(a.nbytes) for entry in obj for a in entry["arrays"].values())
        return sum(int(c.nbytes) for c in obj)

    def weight_bytes(self) -> int:
        return sum(int(v.nbytes) for _name, v in flat_parameters(self.model))

    def snapshot(self, cache: Any) -> list[dict[str, Any]]:
        """Per layer ``{"class", "offset", "dtypes", "arrays": {name: float32 numpy copy}}``: a
        ``KVCache``'s keys and values ``[1, H_kv, L, d]`` up to its offset; an ``ArraysCache``'s state
        arrays (conv state, recurrent state); ``dtypes`` the mx dtype of each (float32 holds bfloat16
        and float16 exactly, and :meth:`restore` casts back). Numpy copies, because
        ``update_and_fetch`` writes into the mx buffers in place.

        Raises:
            Unsupported: a layer of another cache class (a ``RotatingKVCache``).
        """
        mx = _mx()
        out = []
        for c in cache:
            name = type(c).__name__
            if name == "KVCache":
                arrays = {} if c.keys is None else {"keys": c.keys[..., : c.offset, :], "values": c.values[..., : c.offset, :]}
            elif name == "ArraysCache":
                arrays = {_state_name(k, len(c.cache)): a for k, a in enumerate(c.cache) if a is not None}
            else:
                raise self._unsupported("snapshot this cache", f"{name} layers (only KVCache and ArraysCache)")
            mx.eval(*arrays.values())
            out.append({"class": name, "offset": int(getattr(c, "offset", 0)), "size": len(getattr(c, "cache", ())),
                        "dtypes": {k: str(a.dtype).removeprefix("mlx.core.") for k, a in arrays.items()},
                        "arrays": {k: to_numpy(a) for k, a in arrays.items()}})
        return out

    def restore(self, snapshot: Any) -> list[Any]:
        """New cache objects holding a :meth:`snapshot`'s arrays, each in the mx dtype it was taken in
        (the model's compute dtype for a key or value: a float32 buffer in a bfloat16 model would
        promote every later attention to float32)."""
        from mlx_lm.models.cache import ArraysCache, KVCache

        mx = _mx()
        cache: list[Any] = []
        for entry in snapshot:
            arrays, dtypes = entry["arrays"], entry.get("dtypes", {})

            def back(name: str, dtypes: dict[str, str] = dtypes, arrays: dict[str, Any] = arrays) -> Any:
                return mx.array(arrays[name]).astype(getattr(mx, dtypes.get(name, self._precision.compute)))

            if entry["class"] == "KVCache":
                kv = KVCache()
                if arrays:
                    kv.keys, kv.values, kv.offset = back("keys"), back("values"), entry["offset"]
                cache.append(kv)
            else:
                state = ArraysCache(entry["size"])
                for k in range(entry["size"]):
                    name = _state_name(k, entry["size"])
                    state[k] = back(name) if name in arrays else None
                cache.append(state)
        return cache

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        return {f"layers.{i}.{name}": a for i, entry in enumerate(snapshot) for name, a in entry["arrays"].items()}

    def counters(self) -> dict[str, float]:
        """MLX's own memory counters: active, peak and cache bytes of its allocator."""
        mx = _mx()
        return {"active_memory_bytes": float(mx.get_active_memory()), "peak_memory_bytes": float(mx.get_peak_memory()),
                "cache_memory_bytes": float(mx.get_cache_memory())}


def _state_name(k: int, size: int) -> str:
    """The name of state ``k`` of an ``ArraysCache`` of ``size`` states (mlx-lm's recurrent layers
    hold ``[conv state, recurrent state]``)."""
    return ("conv_state", "recurrent_state")[k] if size == 2 else f"state.{k}"
