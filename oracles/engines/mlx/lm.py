"""The MLX port: mlx-lm's own model code on MLX's default device (the CPU here).

Loads the verified snapshot folder as ``mlx_lm.utils.load`` does: float32, bfloat16 or float16 weights,
or a quantized conversion (``QuantizedLinear`` / ``QuantizedEmbedding``, every mode ``mlx_lm.convert``
writes). What it computes in is read from the loaded model (:mod:`oracles.engines.mlx.precision`) and
held against what the artifact declares (config.json's quantization block, the pin's precision);
numpy at the boundary is float32 (an mx array is cast with ``astype(mx.float32)`` before ``np.array``,
exact for bfloat16 and float16). The KV cache is mlx-lm's list of per-layer ``KVCache`` objects; a snapshot is a numpy copy
of each layer's keys and values up to its offset (``KVCache.update_and_fetch`` writes into its buffers
in place, so holding the mx arrays themselves would not be a snapshot).

Config translation (:mod:`oracles.engines.mlx.config`): what mlx-lm needs to read a transformers config
as transformers does, through mlx-lm's own ``model_config`` override, each one recorded as a
:class:`~oracles.engines.mlx.config.Translation` (:attr:`MlxPort.translations`, and in
:meth:`MlxPort.describe`). The artifact loaded without them is ``oracles/suite/test_as_shipped.py``'s.

mlx and mlx-lm are imported when the engine is built (``mx`` is a lazy module), so the registry can
import this file and ask :meth:`MlxPort.unavailable_reason` on a machine without them.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Generation, Prompt, Sampler, Step, check_forward_length, hub_offline, pinned_config
from oracles.engines.guards import single_file_artifact
from oracles.engines.mlx import hybrid as mlx_hybrid
from oracles.engines.mlx.cohort import MlxCohort, to_numpy
from oracles.engines.mlx.config import Translation, missing_model_module, mlx_reading, rope_overrides, translations
from oracles.engines.mlx.precision import LoadedPrecision, config_declaration, disagreements, loaded_precision, pin_declaration

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


class _LazyModule:
    """A module imported at its first attribute access, so the registry can import this file (and ask
    :meth:`MlxPort.unavailable_reason`) on a machine without mlx."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)


mx: Any = _LazyModule("mlx.core")


class _LayerTap:
    """Stands in for one decoder layer during a ``layers=True`` forward: calls it and keeps its
    output (the residual stream after the layer); every other attribute is the layer's own."""

    def __init__(self, layer: Any, rows: list[Any]) -> None:
        self._layer, self._rows = layer, rows

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._layer(*args, **kwargs)
        self._rows.append(out)
        return out

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._layer, attr)


class MlxPort(MlxCohort):
    """mlx-lm model and tokenizer from a verified snapshot, as ``mlx_lm.load`` builds them, MLX default device.

    Args:
        root: the snapshot folder (config, safetensors weights, tokenizer, chat template).
        pin: the loaded pin (its name is :attr:`pin`).
        threads: unused (MLX's CPU backend picks its own threads); recorded by :meth:`describe`.

    Raises:
        TypeError: the loaded floating parameters are of several dtypes (no one compute dtype), or the
            loaded precision contradicts what config.json or the pin declares (file and field named).
    """

    id = "mlx"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_lm") is None:
            extra = "mlx[cpu]" if platform.system() == "Linux" else "mlx"
            return f"mlx-lm is not installed (pip install 'pytest-oracles[mlx]', which brings {extra})"
        return None

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        """A vision pin, or one whose config.json names a ``model_type`` mlx-lm has no model module for
        (:func:`missing_model_module`): found at collection, so the pair is left out instead of every
        test loading the weights to learn it."""
        if pin.modality != "text":
            return f"mlx-lm loads text models; pin {pin.name} is {pin.model_class} (its port is mlx-vlm)"
        if single := single_file_artifact(pin):
            return f"mlx-lm loads a model folder (config.json and safetensors); pin {pin.name}'s artifact is {single}"
        config = pinned_config(pin)
        if config is None:
            return None
        if why := mlx_hybrid.unsupported_reason(config):
            return f"mlx-lm cannot load pin {pin.name} ({pin.model_class}): {why}"
        # the model type mlx-lm is given after the translation this port makes (a text-only Qwen3.5 is
        # loaded as mlx-lm's qwen3_5), not the one in config.json
        if (missing := missing_model_module({**config, **(mlx_hybrid.overrides(config) or {})})) is not None:
            return f"mlx-lm cannot load pin {pin.name} ({pin.model_class}): {missing}"
        return None

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        hub_offline()
        import mlx_lm
        from mlx_lm.utils import load

        config = json.loads((self.root / "config.json").read_text())
        self.overrides = self.config_overrides(config)
        # load returns (model, tokenizer), and the config third only when asked (return_config=True)
        loaded = load(str(self.root), model_config=self.overrides or None)
        self.model, self.tokenizer = loaded[0], loaded[1]
        self._precision = self._checked_precision(config)
        self._translations = translations(config, self.overrides, mlx_reading(config, self.overrides))
        args = self.model.args
        text = getattr(args, "text_config", None)
        text = text if isinstance(text, dict) else vars(args)
        self.vocab_size = int(text["vocab_size"])
        self.hidden_size = int(text["hidden_size"])
        self.num_layers = len(self.model.model.layers)
        self.max_context = int(text.get("max_position_embeddings", 0) or 0)
        self.eos_token_ids = frozenset(int(i) for i in self.tokenizer.eos_token_ids)
        self.tied = bool(text.get("tie_word_embeddings", False))
        self.mlx_lm_version = mlx_lm.__version__

    def _checked_precision(self, config: dict[str, Any]) -> LoadedPrecision:
        """The loaded model's precision, held against config.json's quantization block and the pin's
        declared precision.

        Raises:
            TypeError: no one compute dtype, or a declaration the loaded model contradicts (one line).
        """
        try:
            loaded = loaded_precision(self.model)
        except TypeError as exc:
            raise TypeError(f"mlx port of {self.pin} ({self.root}): {exc}") from None
        for source, declared in ((f"{self.root / 'config.json'}", config_declaration(config)),
                                 (f"pin file {self.pin_file.path}", pin_declaration(self.pin_file))):
            if wrong := disagreements(declared, loaded):
                raise TypeError(f"mlx port of {self.pin}: {source} disagrees with the loaded model: {'; '.join(wrong)}")
        return loaded

    def precision(self) -> LoadedPrecision:
        """What the loaded model computes in (:func:`oracles.engines.mlx.precision.loaded_precision`)."""
        return self._precision

    @property
    def translations(self) -> list[dict[str, Any]]:
        """Every config translation this port applied (JSON-safe
        :meth:`~oracles.engines.mlx.config.Translation.to_json`); [] when it loads the config as is."""
        return [t.to_json() for t in self._translations]

    def translation_records(self) -> tuple[Translation, ...]:
        """The translations as :class:`~oracles.engines.mlx.config.Translation` objects."""
        return tuple(self._translations)

    def translation_notes(self) -> tuple[str, ...]:
        """Each translation as one line (:meth:`~oracles.engines.mlx.config.Translation.note`), named in every verdict."""
        return tuple(t.note() for t in self._translations)

    def config_overrides(self, config: dict[str, Any]) -> dict[str, Any]:
        """The ``model_config`` entries mlx-lm needs to read ``config`` as transformers does (recorded
        in :meth:`describe`): a text-only Qwen3.5 as mlx-lm's ``qwen3_5`` with its layer placement
        (:func:`oracles.engines.mlx.hybrid.overrides`), else the RoPE base of ``rope_parameters``
        (:func:`rope_overrides`).

        Raises:
            Unsupported: a placement of full attention mlx-lm cannot express (its tests skip, naming it).
        """
        if why := mlx_hybrid.unsupported_reason(config):
            raise self._unsupported("load this snapshot", why)
        hybrid = mlx_hybrid.overrides(config)
        return rope_overrides(config) if hybrid is None else hybrid

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model_class": f"mlx_lm.models.{self.model.model_type}.Model",
                "dtype": self._precision.compute, "quantization": self._quantization(),
                "precision": self._precision.describe(), "device": str(mx.default_device()), "mlx": str(mx.__version__),
                "mlx_lm": str(self.mlx_lm_version), "threads": self.threads or None,
                "config_overrides": self.overrides, "translations": self.translations}

    def _quantization(self) -> dict[str, Any] | None:
        """``{"mode", "bits", "group_size"}`` of a quantized model (``variants`` when its modules
        differ), None for a float one."""
        p = self._precision
        if not p.variants:
            return None
        if len(p.variants) == 1:
            return {"mode": p.mode, "bits": p.bits, "group_size": p.group_size}
        return {"mode": p.weights, "variants": [list(v) for v in p.variants]}

    @property
    def compute_dtype(self) -> Any:
        """The mx dtype the activations are computed in (where numpy inputs are cast to)."""
        return getattr(mx, self._precision.compute)

    # -- forward and cache --------------------------------------------------------------------
    def make_cache(self, max_kv_size: int | None = None) -> list[Any]:
        """mlx-lm's prompt cache (``KVCache`` per attention layer, ``ArraysCache`` per recurrent one);
        with ``max_kv_size``, a ``RotatingKVCache(max_kv_size, keep=4)`` per layer, built here because
        ``make_prompt_cache`` ignores ``max_kv_size`` for a model with its own ``make_cache`` (Llama too).

        Raises:
            Unsupported: ``max_kv_size`` for a model whose cache has layers other than ``KVCache``
                (recurrent state, an own sliding window), which a rotating window cannot stand in for.
        """
        from mlx_lm.models.cache import KVCache, RotatingKVCache, make_prompt_cache

        cache = make_prompt_cache(self.model)
        if max_kv_size is None:
            return cache
        odd = sorted({type(c).__name__ for c in cache if type(c) is not KVCache})
        if odd:
            raise self._unsupported("bound its KV cache (max_kv_size)", f"its {odd} cache layers cannot be "
                                    "replaced by a rotating window")
        return [RotatingKVCache(max_size=max_kv_size, keep=4) for _ in cache]

    def cache_length(self, cache: Any) -> int:
        return next((int(c.offset) for c in cache or [] if hasattr(c, "offset")), 0)

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """Same contract as the reference: the hidden states are the final norm's output (what the
        model's own ``__call__`` feeds its head), the logits that head's output. ``layers=True`` wraps
        each entry of the model's layer list for the call (:class:`_LayerTap`) and takes row 0 from
        the embedding table."""
        ids = self.text_ids(prompt)
        check_forward_length(self, self.cache_length(cache), len(ids))
        x = mx.array([ids], dtype=mx.int32)
        inner = self.model.model
        rows: list[Any] = []
        if layers:
            rows.append(inner.embed_tokens(x))
            inner.layers[:] = [_LayerTap(layer, rows) for layer in inner.layers]
        try:
            hidden = inner(x, cache)[0]
        finally:
            if layers:
                inner.layers[:] = [tap._layer for tap in inner.layers]
        if keep:
            hidden = hidden[-keep:]
        logits = self._head(hidden)
        mx.eval(hidden, logits, *rows)
        stream = None
        if layers:
            stream = np.stack([to_numpy(r[0]) for r in rows])
            stream = stream[:, -keep:] if keep else stream
        return Step(logits=to_numpy(logits), hidden=to_numpy(hidden), layers=stream)

    def taps(self, prompt: Prompt | Sequence[int]) -> Any:
        """Layer taps by recorders standing in for each layer's attention and MLP (:func:`oracles.engines.taps.mlx_taps`)."""
        from oracles.engines.mlx.taps import mlx_taps

        return mlx_taps(self, self.text_ids(prompt))

    def _head(self, hidden: Any) -> Any:
        if self.tied:
            return self.model.model.embed_tokens.as_linear(hidden)
        holder = getattr(self.model, "language_model", self.model)
        return holder.lm_head(hidden)

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        """The head on float32 ``[T, D]`` ``hidden``, cast to the compute dtype first (exact for a
        forward's own hidden states, which are that dtype's values), float32 ``[T, V]`` out."""
        out = self._head(self._input(hidden))
        mx.eval(out)
        return to_numpy(out)

    def final_norm(self, residual: np.ndarray) -> np.ndarray:
        """The final norm on float32 ``[T, D]`` ``residual`` (cast as :meth:`lm_head` casts)."""
        out = self.model.model.norm(self._input(residual))
        mx.eval(out)
        return to_numpy(out)

    def _input(self, a: np.ndarray) -> Any:
        """A float32 numpy array as an mx array of the compute dtype: a float32 input into a bfloat16
        model would promote its ops to float32 (mlx's type promotion) and compute another graph."""
        return mx.array(np.ascontiguousarray(a, dtype=np.float32)).astype(self.compute_dtype)

    def is_trimmable(self, cache: Any) -> bool:
        """mlx-lm's own answer (``can_trim_prompt_cache``): every layer's ``is_trimmable()``; False for
        recurrent layers and for a ``RotatingKVCache`` that has wrapped."""
        from mlx_lm.models.cache import can_trim_prompt_cache

        return bool(can_trim_prompt_cache(cache))

    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` cached positions in place; False (nothing dropped) when a layer cannot."""
        from mlx_lm.models.cache import trim_prompt_cache

        if n == 0:
            return True
        if not self.is_trimmable(cache):
            return False
        return bool(trim_prompt_cache(cache, n) == n)

    # -- generation ---------------------------------------------------------------------------
    def _sampler(self, sampler: Sampler) -> Any:
        from mlx_lm.sample_utils import make_sampler

        mx.random.seed(sampler.seed)
        if sampler.greedy:
            return make_sampler(temp=0.0)
        return make_sampler(temp=sampler.temperature, top_p=sampler.top_p, top_k=sampler.top_k)

    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
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

        steps = generate_step(mx.array(self.text_ids(prompt), dtype=mx.int32), self.model, max_tokens=max_new_tokens,
                              sampler=self._sampler(sampler), logits_processors=[capture],
                              prompt_cache=None if max_kv_size is None else self.make_cache(max_kv_size))
        return self._collect(steps, raw, extra={"max_kv_size": max_kv_size})

    def speculative(self, prompt: Prompt | Sequence[int], draft: Engine, num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Generation:
        """mlx-lm's own ``speculative_generate_step``, greedy, ``num_draft`` drafts a cycle.

        ``max_kv_size`` builds both models' caches as ``RotatingKVCache(max_kv_size, keep=4)`` (mlx-lm's
        ``stream_generate`` drops that option for speculative decoding; passing the caches reaches the
        same code). ``extra["from_draft"]`` holds, per token, whether it was an accepted draft.
        """
        from mlx_lm.generate import speculative_generate_step

        if not isinstance(draft, MlxPort):
            raise self._unsupported("draft with another framework's model", f"draft engine {draft.id!r}")
        cache: list[Any] | None = None
        flags: list[bool] = []
        if max_kv_size is not None:
            cache = self.make_cache(max_kv_size) + draft.make_cache(max_kv_size)
        steps = speculative_generate_step(mx.array(self.text_ids(prompt), dtype=mx.int32), self.model, draft.model,
                                          num_draft_tokens=num_draft, max_tokens=max_new_tokens,
                                          sampler=self._sampler(Sampler()), prompt_cache=cache)
        return self._collect(((t, lp) for t, lp, _d in _note_drafts(steps, flags)), [],
                             extra={"from_draft": flags, "num_draft": num_draft, "max_kv_size": max_kv_size})

    def speculative_refusal(self) -> str | None:
        return mlx_hybrid.speculative_refusal(self.model)

    def known_gap(self, oracle: str, any_pin: bool = False) -> str | None:
        pins, note = mlx_hybrid.KNOWN_GAPS.get(oracle, (frozenset(), None))
        return note if any_pin or self.pin in pins else None

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
