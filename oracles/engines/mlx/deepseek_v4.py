"""The DeepSeek-V4 port (``mlx-vlm-dsv4``): mlx-vlm 0.7.10's own ``deepseek_v4`` model on MLX's default
device (the CPU here), float32, loaded from a translated copy of the pinned transformers snapshot
(:mod:`oracles.engines.mlx.deepseek_v4_load`: two config keys and the official weight names, each
recorded in :meth:`MlxDeepseekV4Port.describe` and :meth:`MlxDeepseekV4Port.translation_notes`; the
untranslated load is ``test_cohort_dsv4_port.py``'s check of its own).

The cache is mlx-vlm's ``make_cache()`` list, per layer a ``RotatingKVCache(max_size=128)`` (the
sliding window's shared K=V rows; its values are empty) or a ``CacheList`` of it and one
``PoolingCache`` per compressor (the compressor's, and on a CSA layer the indexer's). Its buffers, as
:meth:`cache_views` names them after the torch reference's (:mod:`oracles.engines.torch.cohort_dsv4`):
``layers.i.window_kv`` ``[1, 1, n, d]`` in temporal order (n <= 128: mlx-vlm keeps the whole window,
transformers 127 rows), ``layers.i.C.compressed_kv`` ``[1, T, d_c]`` (the pooled entries) and, while a
window is open, ``layers.i.C.buffer_kv`` / ``buffer_gate`` ``[1, remainder, w]``. mlx-vlm keeps no
overlap state (see :data:`oracles.engines.mlx.deepseek_v4_gaps.DECODE_OVERLAP_GAP`). A snapshot is a
copy of the cache objects with numpy arrays in place of mx arrays (an mx buffer slice-assigned in place changes under any alias);
``restore`` builds mx arrays from them.

mlx and mlx-vlm are imported when the engine is built, so the registry imports this file anywhere.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Prompt, Step, check_cohort, check_forward_length, hub_offline
from oracles.engines.mlx import mlx_vlm_unavailable
from oracles.engines.torch.cohort_dsv4 import NO_RESIDUAL_ROW

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

MODEL_CLASS = "DeepseekV4ForCausalLM"
#: The names of a layer's pooling caches, in mlx-vlm's CacheList order after the window.
POOLS = ("compressor", "indexer")
#: Measured here (twin, the cohort family's 4 lanes of 148, MLX CPU): the batched decode differs from the
#: serial one from the first step after the serial window wraps, and only by the window's row order:
#: a serial ``RotatingKVCache`` writes each new row in place at its ring index, ``BatchRotatingKVCache.merge``
#: (and ``extract``) lay the window out oldest first, so the window softmax sums in another order. With the
#: serial caches put in that order after every step (a one-lane merge/extract), the cohort is bit-exact
#: with serial over 12 steps, every buffer.
BATCH_VARIANCE = (
    "mlx-vlm's serial decode keeps the sliding window in ring order (RotatingKVCache writes the new row at its "
    "ring index), its batch in temporal order (BatchRotatingKVCache.merge/extract), so window attention sums in "
    "another order: measured B=4 cohort vs serial on deepseek-v4-twin over 132 steps, max |d| hidden {hidden}, "
    "logits {logits}, window_kv {window_kv}, compressor {compressor}, indexer {indexer}; with the serial window "
    "put in temporal order each step, bit-exact").format(hidden="1.5e-6", logits="6.0e-7", window_kv="1.6e-6",
                                                          compressor="1.4e-6", indexer="1.4e-6")


def _mx() -> Any:
    return importlib.import_module("mlx.core")


def _clone(obj: Any, convert: Any) -> Any:
    """A copy of an mlx-vlm cache object (or CacheList) with every mx/numpy array passed through ``convert``."""
    from mlx_vlm.models.cache import CacheList

    if isinstance(obj, CacheList):
        return CacheList(*(_clone(c, convert) for c in obj.caches))
    new = copy.copy(obj)
    for name, value in list(vars(new).items()):
        if name != "_speculation" and hasattr(value, "shape") and hasattr(value, "dtype"):
            setattr(new, name, convert(value))
    return new


def _to_numpy(a: Any) -> np.ndarray:
    mx = _mx()
    return np.array(a) if str(a.dtype) != "mlx.core.bfloat16" else np.array(a.astype(mx.float32))


def _window(c: Any) -> Any:
    """A ``RotatingKVCache``'s keys ``[1, 1, n, d]`` in temporal order (n = min(offset, max_size))."""
    mx = _mx()
    if c.keys is None:
        return None
    n = min(int(c.offset), int(c.max_size))
    if c.offset >= c.max_size and c._idx < c.keys.shape[2]:  # a full ring buffer: oldest row at _idx
        return mx.concatenate([c.keys[..., c._idx:, :], c.keys[..., :c._idx, :]], axis=2)[..., -n:, :]
    return c.keys[..., max(0, c._idx - n):c._idx, :]


class MlxDeepseekV4Port(Engine):
    """mlx-vlm's DeepSeek-V4 language model from a verified transformers snapshot (module docstring).

    Raises:
        ValueError: a config mlx-vlm's schedule fields cannot express (:func:`config_overrides`).
        TypeError: a loaded parameter is not float32.
    """

    id = "mlx-vlm-dsv4"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return mlx_vlm_unavailable()

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        if pin.model_class != MODEL_CLASS:
            return f"mlx-vlm's DeepSeek-V4 port loads {MODEL_CLASS} snapshots; pin {pin.name} is {pin.model_class}"
        return None

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        hub_offline()
        import mlx_vlm
        from mlx_vlm.utils import load_model
        from transformers import AutoTokenizer

        from oracles.engines.mlx.cohort import flat_parameters
        from oracles.engines.mlx.deepseek_v4_load import write_translated

        mx = _mx()
        with tempfile.TemporaryDirectory(prefix="oracles-dsv4-") as tmp:
            self.loaded = write_translated(self.root, Path(tmp))
            self.model = load_model(Path(tmp))
        dtypes = {str(v.dtype) for _, v in flat_parameters(self.model) if "tid2eid" not in _}
        if dtypes != {"mlx.core.float32"}:
            raise TypeError(f"mlx-vlm DeepSeek-V4 port of {self.pin}: parameters are {sorted(dtypes)}, not float32")
        self.lm = self.model.language_model
        config = json.loads((self.root / "config.json").read_text())
        self.tokenizer = AutoTokenizer.from_pretrained(self.root)  # mlx-vlm loads a text tokenizer with transformers
        self.vocab_size = int(config["vocab_size"])
        self.hidden_size = int(config["hidden_size"])
        self.num_layers = len(self.lm.layers)
        self.max_context = int(config.get("max_position_embeddings", 0) or 0)
        eos = config.get("eos_token_id")
        self.eos_token_ids = frozenset(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)
        self.tied = False
        self.versions = {"mlx": str(mx.__version__), "mlx_vlm": str(mlx_vlm.__version__)}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model_class": f"{type(self.model).__module__}.{type(self.model).__name__}",
                "dtype": "float32", "device": str(_mx().default_device()), **self.versions,
                "threads": self.threads or None, "config_overrides": self.loaded["config_overrides"],
                "translations": self.loaded["translations"], "tensors_in_out": self.loaded["tensors"]}

    # -- forward and cache ----------------------------------------------------------------------
    def make_cache(self) -> list[Any]:
        return list(self.lm.make_cache())

    def cache_length(self, cache: Any) -> int:
        if not cache:
            return 0
        first = cache[0].caches[0] if hasattr(cache[0], "caches") else cache[0]
        return int(first.offset)

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """``Step(logits [T, V], hidden [T, D])``: the final norm of mlx-vlm's hyper-connection head, and the
        LM head of it.

        Raises:
            Unsupported: ``layers=True`` (:data:`oracles.engines.torch.cohort_dsv4.NO_RESIDUAL_ROW`).
        """
        if layers:
            raise self._unsupported("return per-layer rows", NO_RESIDUAL_ROW)
        mx = _mx()
        ids = self.text_ids(prompt)
        check_forward_length(self, self.cache_length(cache), len(ids))
        hidden = self.lm.model(mx.array([ids], dtype=mx.int32), cache)
        hidden = hidden[:, -keep:] if keep else hidden
        logits = self.lm.lm_head(hidden)
        mx.eval(hidden, logits)
        return Step(logits=_to_numpy(logits[0]).astype("<f4"), hidden=_to_numpy(hidden[0]).astype("<f4"))

    def taps(self, prompt: Prompt | Sequence[int]) -> Any:
        """Raises Unsupported: no residual row per layer to tap (:data:`NO_RESIDUAL_ROW`)."""
        raise self._unsupported("tap inside its layers", NO_RESIDUAL_ROW)

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        mx = _mx()
        out = self.lm.lm_head(mx.array(np.ascontiguousarray(hidden, dtype=np.float32)))
        mx.eval(out)
        return _to_numpy(out).astype("<f4")

    def snapshot(self, cache: Any) -> Any:
        return [_clone(c, _to_numpy) for c in cache]

    def restore(self, snapshot: Any) -> Any:
        mx = _mx()
        return [_clone(c, mx.array) for c in snapshot]

    def is_trimmable(self, cache: Any) -> bool:
        return False

    def trim(self, cache: Any, n: int) -> bool:
        return n == 0

    def cache_views(self, cache: Any) -> dict[str, np.ndarray]:
        """Copies of every buffer, named as the module docstring says (a snapshot's numpy arrays too)."""
        out: dict[str, np.ndarray] = {}
        for i, layer in enumerate(cache):
            parts = list(layer.caches) if hasattr(layer, "caches") else [layer]
            window = _window(parts[0]) if not isinstance(parts[0].keys, np.ndarray) else _np_window(parts[0])
            if window is not None:
                out[f"layers.{i}.window_kv"] = np.array(window, dtype="<f4")
            for name, pool in zip(POOLS, parts[1:]):
                if pool.pooled is not None:
                    out[f"layers.{i}.{name}.compressed_kv"] = np.array(pool.pooled, dtype="<f4")
                if pool.buf_kv is not None and pool.remainder > 0:
                    out[f"layers.{i}.{name}.buffer_kv"] = np.array(pool.buf_kv[:, :pool.remainder], dtype="<f4")
                    out[f"layers.{i}.{name}.buffer_gate"] = np.array(pool.buf_gate[:, :pool.remainder], dtype="<f4")
        return out

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        return self.cache_views(snapshot)

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """One token for each of ``B`` lanes in one batched mlx-vlm forward, as its batch generation
        does it: per layer the lanes' caches merged by their class's ``merge`` (``BatchRotatingKVCache``,
        left-padded windows; ``BatchPoolingCache``, per-lane pooled lengths and remainders), the ``[B, 1]``
        tokens run through them, then each lane's layer replaced by the batch's ``extract(b)``.

        Raises:
            ValueError: see :func:`oracles.engines.base.check_cohort`.
        """
        mx = _mx()
        check_cohort(self, tokens, caches)
        batch = [caches[0][i].merge([lane[i] for lane in caches]) for i in range(len(caches[0]))]
        hidden = self.lm.model(mx.array([[int(t)] for t in tokens], dtype=mx.int32), batch)[:, -1]
        logits = self.lm.lm_head(hidden)
        mx.eval(hidden, logits)
        for b, lane in enumerate(caches):
            for i in range(len(lane)):
                lane[i] = batch[i].extract(b)
        return Step(logits=_to_numpy(logits).astype("<f4"), hidden=_to_numpy(hidden).astype("<f4"))

    def batch_variance(self) -> str | None:
        return BATCH_VARIANCE

    def known_gap(self, oracle: str, any_pin: bool = False) -> str | None:
        """mlx-vlm's measured failures on the execution families and the DeepSeek-V4 port checks, by test
        name under this engine's own id (:data:`oracles.engines.mlx.deepseek_v4_gaps.KNOWN_GAPS`), on the pin
        they were measured on."""
        from oracles.engines.mlx.deepseek_v4_gaps import known_gap

        return known_gap(self.pin, oracle, self.id, any_pin)

    def translation_notes(self) -> tuple[str, ...]:
        """The translated copy's config keys and weight renaming (:mod:`oracles.engines.mlx.deepseek_v4_load`)."""
        keys = [f"{k} {v} from transformers' fields" for k, v in self.loaded["config_overrides"].items()]
        return tuple(keys) + tuple(self.loaded["translations"])

    def resident_bytes(self, obj: Any) -> int:
        return sum(a.nbytes for a in self.cache_views(obj).values())

    def weight_bytes(self) -> int:
        from oracles.engines.mlx.cohort import flat_parameters

        return sum(int(v.nbytes) for _, v in flat_parameters(self.model))


def _np_window(c: Any) -> np.ndarray | None:
    """:func:`_window` on a snapshot's numpy copy of a ``RotatingKVCache``."""
    if c.keys is None:
        return None
    n = min(int(c.offset), int(c.max_size))
    keys = c.keys
    if c.offset >= c.max_size and c._idx < keys.shape[2]:
        return np.concatenate([keys[..., c._idx:, :], keys[..., :c._idx, :]], axis=2)[..., -n:, :]
    return keys[..., max(0, c._idx - n):c._idx, :]
