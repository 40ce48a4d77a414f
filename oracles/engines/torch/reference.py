"""The reference engine: the provider's transformers code, float32, ``torch.inference_mode``, on the CPU.

The final-norm hidden states are captured with a forward hook on the decoder's final norm module, so
the head re-run reads exactly what the LM head read; ``forward(layers=True)`` adds hooks' captures of
the embedding output and every decoder layer's output (the residual stream). Nothing in the model is
replaced. torch and transformers are imported when the engine is built, not with this module: the
registry asks :meth:`TorchReference.unavailable_reason` at collection.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, ParamSpec, Sequence, TypeVar

import numpy as np

from oracles.engines.base import Engine, Generation, Prompt, Sampler, Step, check_forward_length, hub_offline
from oracles.engines.torch import cohort_dsv4 as dsv4
from oracles.engines.torch.cohort import TorchCohort
from oracles.engines.torch.device import to_f4
from oracles.engines.torch.lfm2_vl import TorchDecisions
from oracles.engines.torch.mtp import TorchMtp
from oracles.engines.torch.placement import Placement, load_placed, placement_facts

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

P = ParamSpec("P")
R = TypeVar("R")


def inference_mode(fn: Callable[P, R]) -> Callable[P, R]:
    """``torch.inference_mode()`` around ``fn``, importing torch at call time, not at decoration."""
    @functools.wraps(fn)
    def wrapped(*args: P.args, **kwargs: P.kwargs) -> R:
        import torch

        with torch.inference_mode():
            return fn(*args, **kwargs)

    return wrapped


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]


#: Names decoders give their final norm (Llama-like ``norm``; Phi-1/2 ``final_layernorm``; OPT-like
#: ``final_layer_norm``; LFM2's ``embedding_norm``), each the module whose output the LM head reads.
FINAL_NORMS = ("norm", "final_layernorm", "final_layer_norm", "embedding_norm")
#: Vision-language classes whose text path this engine runs (a forward refuses pictures): their own systems
#: are its capabilities (Inkling's MTP layer, :mod:`.mtp`; System One on LFM2-VL, :mod:`.lfm2_vl`).
TEXT_PATH_CLASSES = ("InklingForConditionalGeneration", "Lfm2VlForConditionalGeneration")


def decoder_norm(decoder: Any, pin: str, model_class: str) -> Any:
    """The decoder's final norm, after checking that the hooks this engine sets capture what its
    docstring promises: ``embed_tokens`` output is the residual stream entering layer 0, each of
    ``layers`` outputs the stream after it, and the final norm's output is what the LM head reads.

    Raises:
        OracleError: one line naming pin, model class and what is missing or in the way.
    """
    from oracles.errors import OracleError

    where = f"the torch reference cannot hook pin {pin} ({model_class}, decoder {type(decoder).__name__})"
    norm = next((getattr(decoder, n) for n in FINAL_NORMS if getattr(decoder, n, None) is not None), None)
    missing = [n for n in ("embed_tokens", "layers") if getattr(decoder, n, None) is None]
    if norm is None:
        missing.append(f"a final norm named {' or '.join(FINAL_NORMS)}")
    if missing:
        raise OracleError(f"{where}: it has no {', no '.join(missing)}")
    # learned positions added after embed_tokens (OPT, GPT-2 style): the embedding tap would miss them
    for name in ("embed_positions", "wpe"):
        if getattr(decoder, name, None) is not None:
            raise OracleError(f"{where}: it adds learned position embeddings ({name}) after embed_tokens, so the "
                              "embedding tap would not be the residual stream entering layer 0")
    # a projection after the final norm (OPT's project_out): the head would not read the norm's output
    if getattr(decoder, "project_out", None) is not None:
        raise OracleError(f"{where}: project_out runs after the final norm, so the norm's output is not what "
                          "the LM head reads")
    return norm


class TorchReference(TorchMtp, TorchDecisions, TorchCohort):
    """transformers ``AutoModelForCausalLM`` from a verified snapshot, float32 on :attr:`device`; MTP drafting
    and System One where the model has them (:class:`~oracles.engines.torch.mtp.TorchMtp`, :class:`TorchDecisions`).

    Args:
        root: the snapshot folder (config, weights, tokenizer, chat template).
        pin: the loaded pin (its name, :attr:`pin`, is recorded with every figure).
        threads: ``torch.set_num_threads`` value; 0 leaves torch's default.
        device: ``"cpu"`` (the default, :attr:`device`), ``"cuda"`` or ``"mps"`` (``--reference-device``;
            float32 with TF32 off on CUDA: :mod:`oracles.engines.torch.cuda`).
        dtype: ``"float32"`` (the reference), or ``"bfloat16"`` / ``"float16"``: the same code with the
            weights cast and every activation computed in that dtype, the band a reduced-precision port is
            calibrated against; or ``"q8_1"`` / ``"q8_0"`` / ``"q8_K"`` / ``"per-tensor"`` (each Linear as the
            snapshot's ``ggml_rounding.json`` says): float32 with every Linear's input rounded to ggml's 8-bit
            activation blocks (:mod:`oracles.engines.torch.activations`), the band of llama.cpp's CPU
            on a quantized GGUF. Its id is then ``torch@<dtype>``. Outputs are float32 numpy either way.
        max_memory: bytes of the weights held in CPU memory, the rest read from disk as each module runs
            (``--reference-max-memory``); ``device_map``: ``"auto"`` spreads them over the visible GPUs
            (``--reference-device-map``): :mod:`oracles.engines.torch.placement`.

    Raises:
        ValueError: another ``dtype``, or both ``max_memory`` and ``device_map``.
    """

    id = "torch"
    #: The placements this engine takes (``--reference-max-memory``, ``--reference-device-map``).
    placements: ClassVar[tuple[str, ...]] = ("max_memory", "device_map")
    device = "cpu"
    devices: ClassVar[tuple[str, ...]] = ("cpu", "cuda", "mps")

    @classmethod
    def device_unavailable(cls, device: str) -> str | None:
        """Why ``device`` cannot run this engine here (what was probed), or None."""
        from oracles.engines.torch.device import probe_device

        return probe_device(device)

    @classmethod
    def unavailable_reason(cls) -> str | None:
        for module, extra in (("torch", "torch"), ("transformers", "torch")):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install 'pytest-oracles[{extra}]')"
        return None

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        from oracles.engines.guards import single_file_artifact
        from oracles.engines.torch.vision import VISION_CLASSES

        if single := single_file_artifact(pin):
            return f"transformers loads a model folder (config.json and weights); pin {pin.name}'s artifact is {single}"
        if pin.modality != "text" and pin.model_class not in VISION_CLASSES + TEXT_PATH_CLASSES:
            return (f"this adapter loads text models, the vision-language classes {', '.join(VISION_CLASSES)} and the "
                    f"text paths of {', '.join(TEXT_PATH_CLASSES)}; pin {pin.name} is {pin.model_class}")
        return None

    #: The compute dtypes this engine runs in: float32 is the reference; a lower one is the band engine
    #: a reduced-precision port is calibrated against (:mod:`oracles.checks.judgment`).
    DTYPES: ClassVar[tuple[str, ...]] = ("float32", "bfloat16", "float16", "q8_0", "q8_1", "q8_K", "per-tensor")

    def __init__(self, root: Path, pin: Pin, threads: int = 0, device: str | None = None,
                 dtype: str = "float32", max_memory: int | None = None, device_map: str | None = None) -> None:
        super().__init__(root, pin, threads)
        if dtype not in self.DTYPES:
            raise ValueError(f"engine {self.id}: dtype {dtype!r}; expected one of {', '.join(self.DTYPES)}")
        self.dtype = dtype
        if dtype != "float32":  # its own runs: the session's runs are keyed by engine id and pin
            self.id = f"{type(self).id}@{dtype}"  # type: ignore[misc]  # an instance id, one per dtype
        hub_offline()
        import torch
        from transformers import AutoTokenizer

        from oracles.engines.torch.device import strict_float32
        from oracles.engines.torch.vision import VisionPath, is_vision_config, model_class

        self.device = device or type(self).device
        self._device_facts = strict_float32(self.device)  # TF32 off before any CUDA matmul
        if threads > 0:
            torch.set_num_threads(threads)
        self.tokenizer = AutoTokenizer.from_pretrained(self.root)
        rounded = dtype.startswith("q8") or dtype == "per-tensor"  # float32 with ggml's 8-bit activation blocks
        self._torch_dtype = torch.float32 if rounded else getattr(torch, dtype)
        self._placement = Placement(max_memory, device_map)  # accelerate's offload or spread, else one device
        self.model = load_placed(model_class(self.root), self.root, self._torch_dtype, self.device, self._placement)
        if rounded:
            from oracles.engines.torch.activations import install_q8_activations, read_plan

            install_q8_activations(self.model, dtype, read_plan(self.root) if dtype == "per-tensor" else None)
        cfg = self.model.config.get_text_config()  # a VL config holds the text model's under text_config
        self.vocab_size = int(cfg.vocab_size)
        self.hidden_size = int(cfg.hidden_size)
        self.num_layers = int(cfg.num_hidden_layers)
        self.max_context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.eos_token_ids = frozenset(_as_list(self.model.generation_config.eos_token_id or cfg.eos_token_id))
        self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        self._decoder = self.model.get_decoder()
        self._norm = decoder_norm(self._decoder, self.pin, type(self.model).__name__)
        self._streams = dsv4.stream_refusal(self._decoder)  # dsv4: no [T, D] residual row to tap
        self._captured: list[Any] = []
        self._layer_rows: list[Any] | None = None  # set while a layers=True forward runs
        self._norm.register_forward_hook(lambda _m, _i, out: self._captured.append(out))
        self._decoder.embed_tokens.register_forward_hook(self._tap_layer)
        for layer in self._decoder.layers:
            layer.register_forward_hook(self._tap_layer)
        text_path = pin.model_class in TEXT_PATH_CLASSES
        self._vision = VisionPath(self) if is_vision_config(self.root) and not text_path else None  # images and video

    def _tap_layer(self, _module: Any, _inputs: Any, output: Any) -> None:
        if self._layer_rows is not None:  # decoder layers of some classes return a tuple headed by the tensor
            self._layer_rows.append(output[0] if isinstance(output, tuple) else output)

    def describe(self) -> dict[str, Any]:
        import torch

        return {**super().describe(), "model_class": type(self.model).__name__, "threads": torch.get_num_threads(),
                "dtype": self.dtype, "device": self.device, **self._device_facts, "torch": str(torch.__version__),
                **placement_facts(self.model, self._placement)}

    # -- forward and cache --------------------------------------------------------------------
    def make_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def cache_length(self, cache: Any) -> int:
        return int(cache.get_seq_length()) if cache is not None else 0

    def _ids_tensor(self, rows: Sequence[Sequence[int]]) -> Any:
        import torch

        return torch.tensor([list(r) for r in rows], dtype=torch.long, device=self.device)

    @inference_mode
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        if self._vision is not None:
            return self._vision.forward(prompt, cache, keep, layers)
        if layers and self._streams:
            raise self._unsupported("return per-layer rows", self._streams)
        ids = self.text_ids(prompt)
        check_forward_length(self, self.cache_length(cache), len(ids))
        self._captured.clear()
        self._layer_rows = [] if layers else None
        try:
            out = self.model(input_ids=self._ids_tensor([ids]), cache=cache, use_cache=cache is not None,
                             logits_to_keep=keep)
            hidden = self._captured[-1][0]
            stream = None
            if layers:
                stream = np.stack([to_f4(t[0]) for t in self._layer_rows or []])
                stream = stream[:, -keep:] if keep else stream
        finally:
            self._captured.clear()
            self._layer_rows = None
        if keep:
            hidden = hidden[-keep:]
        return Step(logits=to_f4(out.logits[0]), hidden=to_f4(hidden), layers=stream)

    def taps(self, prompt: Prompt | Sequence[int]) -> Any:
        """Layer taps by forward hooks on each layer's attention and MLP (:func:`oracles.engines.taps.torch_taps`)."""
        from oracles.engines.torch.taps import torch_taps

        return torch_taps(self, self.text_ids(prompt))

    @inference_mode
    def plain_logits(self, prompt: Prompt | Sequence[int]) -> np.ndarray:
        """``[T, V]`` float32 logits of a plain ``model(**inputs)`` call on a cold prompt (no cache,
        nothing captured): the independent forward a hooked run is held against."""
        if self._vision is not None:
            return self._vision.plain_logits(prompt)
        try:
            return to_f4(self.model(input_ids=self._ids_tensor([self.text_ids(prompt)])).logits[0])
        finally:
            self._captured.clear()

    @inference_mode
    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        return to_f4(self.model.get_output_embeddings()(self._from_f4(hidden)))

    @inference_mode
    def final_norm(self, residual: np.ndarray) -> np.ndarray:
        self._captured.clear()
        out = to_f4(self._norm(self._from_f4(residual)))
        self._captured.clear()
        return out

    def _from_f4(self, a: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(a, dtype=np.float32)).to(self.device, dtype=self._torch_dtype)

    def is_trimmable(self, cache: Any) -> bool:
        """A transformers cache can be cropped when every layer can: attention layers always,
        linear-attention layers only with past recording on (``is_croppable``); never a DeepSeek-V4 cache
        (dsv4: a crop would leave its compressors' state as it was, whatever ``is_croppable`` claims)."""
        return all(_croppable(layer) for layer in cache.layers) and not dsv4.is_compressed(cache)

    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` cached positions in place (``DynamicCache.crop(-n)``: transformers 5
        takes the count to remove as a negative int); False when a layer cannot be cropped."""
        if n == 0:
            return True
        if not self.is_trimmable(cache):
            return False
        cache.crop(-n)
        return True

    def snapshot(self, cache: Any) -> Any:
        return copy.deepcopy(cache)

    def restore(self, snapshot: Any) -> Any:
        return copy.deepcopy(snapshot)

    # -- generation ---------------------------------------------------------------------------
    @inference_mode
    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """transformers' own ``generate`` (greedy, or sampled with ``torch.manual_seed(seed)``).

        Raises:
            Unsupported: ``max_kv_size``: a ``DynamicCache`` has no size limit to set.
        """
        import torch
        from transformers import GenerationConfig

        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)", "transformers' DynamicCache has no size "
                                    "limit; its one limit, max_position_embeddings, is refused by forward")
        ids = self.text_ids(prompt)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not sampler.greedy,
                               eos_token_id=sorted(self.eos_token_ids), pad_token_id=min(self.eos_token_ids),
                               output_logits=True, return_dict_in_generate=True,
                               **({} if sampler.greedy else {"temperature": sampler.temperature,
                                                             "top_p": sampler.top_p, "top_k": sampler.top_k}))
        torch.manual_seed(sampler.seed)
        timer = _FirstTokenTimer()
        start = time.perf_counter()
        out = self.model.generate(self._ids_tensor([ids]), generation_config=cfg, streamer=timer)
        end = time.perf_counter()
        tokens = [int(t) for t in out.sequences[0, len(ids):]]
        finish = "stop" if tokens and tokens[-1] in self.eos_token_ids else "length"
        logits = (np.stack([to_f4(s[0]) for s in out.logits]) if out.logits
                  else np.zeros((0, self.vocab_size), "<f4"))
        first = timer.first_token_at or end
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish, step_logits=logits,
                          prefill_seconds=first - start, decode_seconds=end - first)

    @inference_mode
    def speculative(self, prompt: Prompt | Sequence[int], draft: Engine, num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Generation:
        """transformers' own assisted generation, greedy: ``generate(assistant_model=draft.model)``
        with a constant ``num_draft`` draft tokens a cycle (no confidence cut-off).

        Raises:
            Unsupported: ``max_kv_size`` (see :meth:`generate`), or a draft that is not a transformers model.
        """
        from transformers import GenerationConfig

        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)", "transformers' DynamicCache has no size limit")
        if not isinstance(draft, TorchReference):
            raise self._unsupported("draft with another framework's model", f"draft engine {draft.id!r}")
        ids = self.text_ids(prompt)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(self.eos_token_ids),
                               pad_token_id=min(self.eos_token_ids), num_assistant_tokens=num_draft,
                               num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        start = time.perf_counter()
        out = self.model.generate(self._ids_tensor([ids]), generation_config=cfg, assistant_model=draft.model)
        end = time.perf_counter()
        tokens = [int(t) for t in out[0, len(ids):]]
        if self.eos_token_ids & set(tokens):  # assisted generation may run past a stop inside an accepted window
            tokens = tokens[: next(i for i, t in enumerate(tokens) if t in self.eos_token_ids) + 1]
        finish = "stop" if tokens and tokens[-1] in self.eos_token_ids else "length"
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish,
                          step_logits=np.zeros((0, self.vocab_size), "<f4"), prefill_seconds=0.0,
                          decode_seconds=end - start, extra={"num_draft": num_draft, "assisted": True})

    @inference_mode
    def speculative_refusal(self) -> str | None:
        """transformers refuses assisted generation for a model class with ``_is_stateful`` (its
        recurrent cache cannot be reset to a subset of the generated text): ``generate`` raises that
        ``ValueError`` while validating its arguments, before any forward, so the message is taken
        from a one-token call."""
        import transformers
        from transformers import GenerationConfig

        if not getattr(self.model, "_is_stateful", False):
            return None
        cfg = GenerationConfig(max_new_tokens=1, do_sample=False, eos_token_id=sorted(self.eos_token_ids),
                               pad_token_id=min(self.eos_token_ids), num_assistant_tokens=1)
        try:
            self.model.generate(self._ids_tensor([[min(self.eos_token_ids)]]), generation_config=cfg,
                                assistant_model=self.model)
        except ValueError as exc:
            return f"transformers {transformers.__version__} generate(assistant_model=...): {exc}"
        return None


def _croppable(layer: Any) -> bool:
    """A cache layer's ``is_croppable``: a class attribute on attention layers, a method on linear ones."""
    value = getattr(layer, "is_croppable", True)
    return bool(value() if callable(value) else value)


class _FirstTokenTimer:
    """A minimal streamer: notes when the first generated token arrives (prefill end)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:  # the first put is the prompt itself
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass
