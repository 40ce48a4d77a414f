"""The MLX port: mlx-lm's own model code, float32, on MLX's default device (the CPU here).

Loads the same verified snapshot folder the reference loads (``mlx_lm.utils.load``), numpy at the
boundary. The KV cache is mlx-lm's list of per-layer ``KVCache`` objects; a snapshot is a numpy copy
of each layer's keys and values up to its offset (``KVCache.update_and_fetch`` writes into its buffers
in place, so holding the mx arrays themselves would not be a snapshot).

Config translation, recorded in :meth:`MlxPort.describe`: transformers 5 writes the RoPE base as
``rope_parameters: {"rope_theta": ...}``, and mlx-lm 0.32's Llama ``ModelArgs`` reads only the
top-level ``rope_theta`` and otherwise defaults to 10,000. Loaded as is, SmolLM2 (base 100,000) runs
with the wrong rotary frequencies (measured on "ping": max |Δlogit| 9.96, argmax agreement 84%), so
the adapter passes ``rope_theta`` (and a non-default ``rope_scaling``) through mlx-lm's own
``model_config`` override.

mlx and mlx-lm are imported here only; importing this module needs them installed.
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from oracles.engines.base import Generation, Sampler, Step, check_cohort, check_forward_length


def rope_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm ``model_config`` entries that carry a transformers-5 ``rope_parameters`` block over.

    Returns ``{}`` when the config already has a top-level ``rope_theta`` or no ``rope_parameters``.
    """
    params = config.get("rope_parameters")
    if "rope_theta" in config or not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    out: dict[str, Any] = {"rope_theta": float(params["rope_theta"])}
    if params.get("rope_type", "default") != "default":
        out["rope_scaling"] = dict(params)
    return out


class MlxPort:
    """mlx-lm model and tokenizer from a verified snapshot, float32, MLX default device.

    Args:
        root: the snapshot folder (config, safetensors weights, tokenizer, chat template).
        pin: the pin name.
        threads: unused (MLX's CPU backend picks its own threads); recorded by :meth:`describe`.

    Raises:
        TypeError: a loaded parameter is not float32 (the port must compute in float32).
    """

    id = "mlx"

    def __init__(self, root: Path, pin: str, threads: int = 0) -> None:
        import mlx_lm
        from mlx_lm.utils import load

        self.pin, self.root, self.threads = pin, Path(root), threads
        config = json.loads((self.root / "config.json").read_text())
        self.overrides = rope_overrides(config)
        self.model, self.tokenizer = load(str(self.root), model_config=self.overrides or None)
        from mlx.utils import tree_flatten

        dtypes = {str(v.dtype) for _, v in tree_flatten(self.model.parameters())}
        if dtypes != {"mlx.core.float32"}:
            raise TypeError(f"mlx port of {pin}: parameters are {sorted(dtypes)}, not float32 only")
        args = self.model.args
        self.vocab_size = int(args.vocab_size)
        self.hidden_size = int(args.hidden_size)
        self.max_context = int(getattr(args, "max_position_embeddings", 0) or 0)
        self.eos_token_ids = frozenset(int(i) for i in self.tokenizer.eos_token_ids)
        self.tied = bool(getattr(args, "tie_word_embeddings", False))
        self.mlx_lm_version = mlx_lm.__version__

    def describe(self) -> dict[str, Any]:
        return {"engine": self.id, "class": f"mlx_lm.models.{self.model.model_type}.Model", "dtype": "float32",
                "device": str(mx.default_device()), "mlx": str(mx.__version__), "mlx_lm": str(self.mlx_lm_version),
                "threads": self.threads or None, "config_overrides": self.overrides}

    # -- tokenizer ----------------------------------------------------------------------------
    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                 tokenize=True, return_dict=False)
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    # -- forward and cache --------------------------------------------------------------------
    def make_cache(self, max_kv_size: int | None = None) -> list[Any]:
        """mlx-lm's prompt cache: ``KVCache`` per layer, or ``RotatingKVCache(max_kv_size, keep=4)``."""
        from mlx_lm.models.cache import make_prompt_cache

        return make_prompt_cache(self.model, max_kv_size=max_kv_size)

    def cache_length(self, cache: Any) -> int:
        return int(cache[0].offset) if cache else 0

    def forward(self, ids: Sequence[int], cache: Any | None = None, keep: int = 0) -> Step:
        """Same contract as the reference: the hidden states are the final norm's output (what the
        model's own ``__call__`` feeds the tied embedding head), the logits that head's output."""
        check_forward_length(self, self.cache_length(cache), len(ids))
        x = mx.array([list(ids)], dtype=mx.int32)
        hidden = self.model.model(x, cache)[0]
        if keep:
            hidden = hidden[-keep:]
        logits = self._head(hidden)
        mx.eval(hidden, logits)
        return Step(logits=np.array(logits, dtype=np.float32), hidden=np.array(hidden, dtype=np.float32))

    def _head(self, hidden: Any) -> Any:
        if self.tied:
            return self.model.model.embed_tokens.as_linear(hidden)
        return self.model.lm_head(hidden)

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """One token for each of ``B`` lanes in one batched mlx-lm forward (contract:
        :meth:`oracles.engines.base.Engine.decode_cohort`).

        mlx-lm's own batching, as its ``batch_generate`` does it: per layer, ``KVCache.merge`` of the
        lanes' caches gives a ``BatchKVCache`` (keys left-padded to the longest lane, per-lane offsets
        that the rotary embedding and ``BatchKVCache.make_mask`` read); the model runs the ``[B, 1]``
        tokens through it; ``BatchKVCache.extract(b)`` then gives lane ``b``'s keys/values without the
        padding, which replace the contents of lane ``b``'s own ``KVCache`` objects (keys, values,
        offset), so each lane's cache object stays live for :meth:`forward`.

        Raises:
            ValueError: see :func:`oracles.engines.base.check_cohort`.
            TypeError: a lane's layer is not a plain ``KVCache`` (a rotating window is not supported).
        """
        from mlx_lm.models.cache import KVCache

        check_cohort(self, tokens, caches)
        for b, lane in enumerate(caches):
            odd = {type(c).__name__ for c in lane if type(c) is not KVCache}
            if odd:
                raise TypeError(f"decode_cohort: lane {b} has {sorted(odd)} layers; only KVCache is supported")
        batch = [KVCache.merge([lane[layer] for lane in caches]) for layer in range(len(caches[0]))]
        x = mx.array([[int(t)] for t in tokens], dtype=mx.int32)
        hidden = self.model.model(x, batch)[:, -1]
        logits = self._head(hidden)
        mx.eval(hidden, logits)
        for layer, merged in enumerate(batch):
            for b, lane in enumerate(caches):
                part = merged.extract(b)
                mx.eval(part.keys, part.values)
                lane[layer].keys, lane[layer].values, lane[layer].offset = part.keys, part.values, part.offset
        return Step(logits=np.array(logits, dtype=np.float32), hidden=np.array(hidden, dtype=np.float32))

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        out = self._head(mx.array(np.ascontiguousarray(hidden, dtype=np.float32)))
        mx.eval(out)
        return np.array(out, dtype=np.float32)

    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` cached positions in place; False (nothing dropped) when a layer cannot
        (a ``RotatingKVCache`` that has wrapped past its size)."""
        from mlx_lm.models.cache import can_trim_prompt_cache, trim_prompt_cache

        if n == 0:
            return True
        if not can_trim_prompt_cache(cache):
            return False
        return trim_prompt_cache(cache, n) == n

    def snapshot(self, cache: Any) -> list[tuple[np.ndarray, np.ndarray, int, str]]:
        """Per layer: keys ``[1, H_kv, L, d]`` and values as float32 numpy copies, the offset, the class."""
        out = []
        for c in cache:
            if c.keys is None:
                out.append((np.zeros((0,), "<f4"), np.zeros((0,), "<f4"), 0, type(c).__name__))
                continue
            k, v = c.keys[..., : c.offset, :], c.values[..., : c.offset, :]
            if type(c).__name__ != "KVCache":
                raise TypeError(f"snapshot: {type(c).__name__} layers are not supported, only KVCache")
            mx.eval(k, v)
            out.append((np.array(k, dtype=np.float32), np.array(v, dtype=np.float32), int(c.offset), "KVCache"))
        return out

    def restore(self, snapshot: Any) -> list[Any]:
        from mlx_lm.models.cache import KVCache

        cache = []
        for k, v, offset, _cls in snapshot:
            c = KVCache()
            if offset:
                c.keys, c.values, c.offset = mx.array(k), mx.array(v), offset
            cache.append(c)
        return cache

    def snapshot_digest(self, snapshot: Any) -> str:
        h = hashlib.sha256()
        for k, v, offset, _cls in snapshot:
            for a in (k, v):
                h.update(json.dumps(list(a.shape)).encode())
                h.update(np.ascontiguousarray(a, dtype="<f4").tobytes())
            h.update(str(offset).encode())
        return h.hexdigest()

    # -- generation ---------------------------------------------------------------------------
    def _sampler(self, sampler: Sampler) -> Any:
        from mlx_lm.sample_utils import make_sampler

        mx.random.seed(sampler.seed)
        if sampler.greedy:
            return make_sampler(temp=0.0)
        return make_sampler(temp=sampler.temperature, top_p=sampler.top_p, top_k=sampler.top_k)

    def generate(self, ids: Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """mlx-lm's own ``generate_step`` (greedy, or sampled after ``mx.random.seed(seed)``).

        The raw logits of each step are read by a logits processor (it sees them before the sampler
        applies temperature); the loop stops at the first stop token, which is kept.
        """
        from mlx_lm.generate import generate_step

        raw: list[Any] = []

        def capture(_tokens: Any, logits: Any) -> Any:
            raw.append(logits)
            return logits

        steps = generate_step(mx.array(list(ids), dtype=mx.int32), self.model, max_tokens=max_new_tokens,
                              sampler=self._sampler(sampler), logits_processors=[capture], max_kv_size=max_kv_size)
        return self._collect(steps, raw, extra={"max_kv_size": max_kv_size})

    def speculative(self, ids: Sequence[int], draft: "MlxPort", num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Generation:
        """mlx-lm's own ``speculative_generate_step``, greedy, ``num_draft`` drafts a cycle.

        ``max_kv_size`` builds both models' caches as ``RotatingKVCache(max_kv_size, keep=4)`` (mlx-lm's
        ``stream_generate`` drops that option for speculative decoding; passing the caches reaches the
        same code). ``extra["from_draft"]`` holds, per token, whether it was an accepted draft.
        """
        from mlx_lm.generate import speculative_generate_step

        cache, flags = None, []
        if max_kv_size is not None:
            cache = self.make_cache(max_kv_size) + draft.make_cache(max_kv_size)
        steps = speculative_generate_step(mx.array(list(ids), dtype=mx.int32), self.model, draft.model,
                                          num_draft_tokens=num_draft, max_tokens=max_new_tokens,
                                          sampler=self._sampler(Sampler()), prompt_cache=cache)
        return self._collect(((t, lp) for t, lp, _d in _note_drafts(steps, flags)), [],
                             extra={"from_draft": flags, "num_draft": num_draft, "max_kv_size": max_kv_size})

    def _collect(self, steps: Any, raw: list[Any], extra: dict[str, Any]) -> Generation:
        tokens: list[int] = []
        start = time.perf_counter()
        first = None
        finish = "length"
        for token, _logprobs in steps:
            if first is None:
                first = time.perf_counter()
            tokens.append(int(token))
            if tokens[-1] in self.eos_token_ids:
                finish = "stop"
                break
        end = time.perf_counter()
        if "from_draft" in extra:
            extra["from_draft"] = extra["from_draft"][: len(tokens)]
        rows = [np.array(r.astype(mx.float32)).reshape(-1, self.vocab_size) for r in raw]
        logits = np.concatenate(rows)[: len(tokens)] if rows else np.zeros((0, self.vocab_size), "<f4")
        first = first or end
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish, step_logits=logits,
                          prefill_seconds=first - start, decode_seconds=end - first, extra=extra)


def _note_drafts(steps: Any, flags: list[bool]) -> Any:
    for token, logprobs, from_draft in steps:
        flags.append(bool(from_draft))
        yield token, logprobs, from_draft
