"""The llama.cpp port: a pin's GGUF file run by libllama (``llama-cpp-py-sync``'s prebuilt CPU library,
its C API through CFFI), numpy float32 at the boundary.

- forward: one ``llama_decode`` per ``n_batch`` tokens with every asked position marked as an output;
  logits ``[T, V]`` and the final-norm hidden states ``[T, D]`` of the same decode
  (:mod:`oracles.engines.llamacpp.runtime`).
- cache: llama.cpp's own KV cache, one ``llama_context`` per cache (:class:`LlamaCache`); ``trim`` is
  ``llama_memory_seq_rm``, a snapshot is ``llama_state_seq_get_data``'s bytes and a restore sets them
  into a fresh context (``llama_state_seq_set_data``).
- generate: llama.cpp's sampler chain (greedy: ``llama_sampler_init_greedy``; else top-k, top-p,
  temperature, ``dist(seed)``), sampling from the context's last logits each step.
- tokenizer and chat: llama.cpp's (:mod:`oracles.engines.llamacpp.tokenizer`).
- taps: the residual stream, each layer's attention and MLP outputs and the norms before them, read from
  llama.cpp's compute graph by its ``cb_eval`` callback in a context of their own
  (:mod:`oracles.engines.llamacpp.taps`), for ``oracles bisect`` and the layer-tap checks.

Settings (all in :meth:`LlamaCppPort.describe`): the KV cache type (``kv_type``: ``"f32"``, the
default, which a float32 verdict needs, or ``"f16"``, llama.cpp's own default), ``threads``, ``n_ctx``
and flash attention (off by default). Before llama.cpp sees the file, its header is read
(:mod:`oracles.pins.gguf_file`): a truncated file and a vocabulary other than the pin's tokenizer.json
are refused in one line naming file and field; an architecture llama.cpp does not know is its own
refusal, quoted with the field. The library is imported when the engine is built, never at import.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Generation, Prompt, Sampler, Step, check_forward_length
from oracles.errors import OracleError, PinError

if TYPE_CHECKING:
    from oracles.engines.llamacpp.runtime import Context, Runtime
    from oracles.engines.taps import Taps
    from oracles.pins.pin import Pin

#: The distribution the library comes from.
DIST = "llama-cpp-py-sync"


@dataclass
class LlamaCache:
    """A live cache: one llama.cpp context (its KV cache holds ``ctx.length`` positions)."""

    ctx: "Context"


@dataclass(frozen=True)
class LlamaSnapshot:
    """A cache's sequence state as llama.cpp serialises it (``state``) and the positions it holds."""

    state: bytes
    length: int


def gguf_of(pin: "Pin") -> str | None:
    """The one pinned ``.gguf`` file of ``pin``, else None."""
    found = [f for f in pin.files if f.endswith(".gguf")]
    return found[0] if len(found) == 1 else None


class LlamaCppPort(Engine):
    """llama.cpp on a pin's GGUF file (module docstring).

    Args:
        root: the verified snapshot folder (the ``.gguf`` and the reference's tokenizer files).
        pin: the loaded pin (one ``.gguf`` among its files).
        threads: llama.cpp's ``n_threads`` and ``n_threads_batch`` (0: its default).
        kv_type: ``"f32"`` or ``"f16"`` (``type_k`` = ``type_v``).
        n_ctx: positions each cache holds.
        flash_attn: llama.cpp's flash-attention path.
        chat_mode: how ``chat_ids`` renders the GGUF's template: ``"jinja"`` (as llama.cpp's ``--jinja``)
            or ``"builtin"`` (``llama_chat_apply_template``; :mod:`oracles.engines.llamacpp.tokenizer`).

    Raises:
        PinError: a truncated GGUF, or its ``tokenizer.ggml.tokens`` differ from the snapshot's
            tokenizer.json (file and field named).
        OracleError: llama.cpp refuses the file (an unknown ``general.architecture``: field named, and
            llama.cpp's reason quoted), or the library cannot be opened.
        ValueError: a ``kv_type`` other than f32 / f16, a ``chat_mode`` other than jinja / builtin.
    """

    id = "llamacpp"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("llama_cpp_py_sync") is None or importlib.util.find_spec("cffi") is None:
            return f"{DIST} is not installed (pip install 'pytest-oracles[llamacpp]')"
        return None

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        """A pin without exactly one pinned ``.gguf`` file (llama.cpp loads GGUF files only)."""
        found = sorted(f for f in pin.files if f.endswith(".gguf"))
        if len(found) != 1:
            what = "no .gguf file" if not found else f"{len(found)} .gguf files ({', '.join(found)})"
            return f"llama.cpp loads one GGUF file; pin {pin.name} ({pin.path.name}) pins {what}"
        return None

    def __init__(self, root: Path, pin: "Pin", threads: int = 0, *, kv_type: str = "f32", n_ctx: int = 2048,
                 flash_attn: bool = False, chat_mode: str = "jinja") -> None:
        super().__init__(root, pin, threads)
        from oracles.engines.llamacpp.runtime import KV_TYPES, Runtime, Settings
        from oracles.engines.llamacpp.tokenizer import LlamaTokenizer

        if kv_type not in KV_TYPES:
            raise ValueError(f"llamacpp engine: kv_type {kv_type!r} is not one of {', '.join(KV_TYPES)}")
        if (why := self.unsupported_pin(pin)) is not None:
            raise PinError(f"{pin.path}: field 'files': {why}")
        self.gguf = self.root / str(gguf_of(pin))
        self.header = self._checked_header()
        self.settings = Settings(kv_type=kv_type, threads=threads, n_ctx=n_ctx, flash_attn=flash_attn)
        self.rt = self._load(Runtime)
        self.vocab_size, self.hidden_size, self.num_layers = self.rt.n_vocab, self.rt.n_embd, self.rt.n_layer
        self.max_context = min(n_ctx, self.rt.n_ctx_train) if self.rt.n_ctx_train > 0 else n_ctx
        lib = self.rt.lib
        self.eos_token_ids = frozenset(i for i in range(self.vocab_size) if lib.llama_vocab_is_eog(self.rt.vocab, i))
        self.llama_tokenizer = LlamaTokenizer(self.rt, chat_mode)
        self.tokenizer = self.llama_tokenizer
        self._scratch: Context | None = None

    def _checked_header(self) -> Any:
        """The GGUF header, after the checks llama.cpp's loader would make less clearly (module docstring).

        Raises:
            PinError: truncated, or a vocabulary other than the snapshot's tokenizer.json.
        """
        from oracles.pins.gguf_file import read_header, vocabulary_disagreement

        header = read_header(self.gguf)
        header.check_complete()
        tokenizer_json = self.root / "tokenizer.json"
        if tokenizer_json.is_file() and (why := vocabulary_disagreement(header, tokenizer_json)):
            raise PinError(why)
        return header

    def _load(self, runtime: "type[Runtime]") -> "Runtime":
        try:
            return runtime(self.gguf, self.settings)
        except OracleError as exc:
            if "architecture" in str(exc):
                raise OracleError(f"{self.gguf}: field 'general.architecture' is {self.header.architecture!r}, which "
                                  f"llama.cpp {self._tag()} does not know ({exc})") from None
            raise

    @staticmethod
    def _tag() -> str:
        from llama_cpp_py_sync import _version

        return f"{_version.__llama_cpp_tag__} ({_version.__llama_cpp_commit__})"

    def describe(self) -> dict[str, Any]:
        from llama_cpp_py_sync import _version

        s = self.settings
        return {**super().describe(), "model_class": f"llama.cpp {self.header.architecture}",
                "dtype": self.pin_file.precision.compute,  # float32, or q8_1 on a Q4_1 file's products
                "device": "cpu", DIST: importlib.metadata.version(DIST), "llama_cpp_commit": _version.__llama_cpp_commit__,
                "llama_cpp_tag": _version.__llama_cpp_tag__, "library": str(self.rt.library),
                "library_patch": self.rt.patch, "gguf": self.gguf.name, "gguf_type": self.header.file_type,
                "kv_type": s.kv_type, "threads": self.threads or None, "n_threads": self._context().threads,
                "n_ctx": s.n_ctx, "n_batch": s.n_batch, "flash_attn": s.flash_attn,
                "chat_mode": self.llama_tokenizer.chat_mode,
                "system_info": self.rt.ffi.string(self.rt.lib.llama_print_system_info()).decode().strip(),
                "precision": self.pin_file.precision.describe(), "config_overrides": {}}

    # -- forward and cache -------------------------------------------------------------------
    def _context(self) -> "Context":
        """The scratch context cold forwards run in (emptied before each)."""
        if self._scratch is None:
            self._scratch = self.rt.context()
        return self._scratch

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """Run ``prompt`` after what ``cache`` holds (appending to it); ``cache=None``: a cold prefill.

        Returns logits ``[T, V]`` and hidden ``[T, D]`` float32 (the last ``keep`` positions when
        ``keep > 0``), both from the same ``llama_decode``.

        Raises:
            Unsupported: ``layers=True`` (llama.cpp's API gives the final norm's output and the logits only;
                :meth:`taps` reads the layers from its graph callback), or a prompt with pictures.
            ValueError: an empty prompt or one past :attr:`max_context`.
            OracleError: ``llama_decode`` fails.
        """
        if layers:
            raise self._unsupported("return the residual stream after each layer (layers=True)",
                                    "llama.cpp's C API gives the final-norm embeddings and the logits only")
        ids = self.text_ids(prompt)
        check_forward_length(self, self.cache_length(cache), len(ids))
        ctx = cache.ctx if cache is not None else self._context()
        if cache is None:
            ctx.remove_from(0)
        rows = min(keep, len(ids)) if keep > 0 else len(ids)
        logits, hidden = ctx.decode(ids, rows)
        return Step(logits=logits, hidden=hidden)

    def taps(self, prompt: Prompt | Sequence[int]) -> "Taps":
        """A cold prefill of ``prompt`` with the residual stream, each layer's attention and MLP outputs and
        the norms before them, read from llama.cpp's graph as it computes them (its ``cb_eval`` callback,
        in a context made for the call and freed after; the tensors and how they map:
        :mod:`oracles.engines.llamacpp.taps`); logits and hidden states as :meth:`forward` reads them.

        Raises:
            Unsupported: a stage llama.cpp's graph for this architecture does not compute under the llama
                graph's tensor name (the stage and the tensor named), or a prompt with pictures.
            ValueError: an empty prompt or one past :attr:`max_context`.
            OracleError: a tensor cannot be read as float32 on the CPU, or ``llama_decode`` fails.
        """
        from oracles.engines.llamacpp.taps import llamacpp_taps

        ids = self.text_ids(prompt)
        check_forward_length(self, 0, len(ids))
        return llamacpp_taps(self.rt, ids, self.id)

    def make_cache(self) -> LlamaCache:
        """An empty cache: a new llama.cpp context with this engine's settings."""
        return LlamaCache(self.rt.context())

    def cache_length(self, cache: Any) -> int:
        return 0 if cache is None else int(cache.ctx.length)

    def is_trimmable(self, cache: Any) -> bool:
        return True

    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` positions (``llama_memory_seq_rm``); False when llama.cpp cannot."""
        if n <= 0:
            return n == 0
        return cache.ctx.remove_from(max(cache.ctx.length - n, 0))

    def snapshot(self, cache: Any) -> LlamaSnapshot:
        """The cache's sequence state (``llama_state_seq_get_data``), independent of later forwards."""
        return LlamaSnapshot(cache.ctx.state(), int(cache.ctx.length))

    def restore(self, snapshot: Any) -> LlamaCache:
        """A new live cache (a fresh context) holding ``snapshot`` (``llama_state_seq_set_data``)."""
        cache = self.make_cache()
        cache.ctx.load_state(snapshot.state, snapshot.length)
        return cache

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        """Each layer's keys and values ``[1, n_head_kv, T, head_dim]`` float32 read back from the snapshot's
        state bytes (:func:`oracles.engines.llamacpp.state.state_buffers`: an f16 cache widened, the keys'
        rotary pairs back in transformers' order)."""
        from oracles.engines.llamacpp.state import state_buffers

        return state_buffers(snapshot.state, int(self.rt.lib.llama_model_n_head_kv(self.rt.model)))

    def resident_bytes(self, obj: Any) -> int:
        """A snapshot's serialised bytes; a live cache's state bytes as llama.cpp would serialise them."""
        return len(obj.state) if isinstance(obj, LlamaSnapshot) else len(obj.ctx.state())

    # -- chat and generation -----------------------------------------------------------------
    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Ids (llama.cpp's tokenizer) of ``messages`` rendered from the GGUF's chat template the
        ``chat_mode`` way (:class:`oracles.engines.llamacpp.tokenizer.LlamaTokenizer`).

        Raises:
            Unsupported: the GGUF has no chat template, or it cannot be rendered (why quoted).
        """
        tok = self.llama_tokenizer
        if not tok.chat_template:
            raise self._unsupported("render a chat", f"{self.gguf.name} has no tokenizer.chat_template")
        try:
            text = tok.render(list(messages), add_generation_prompt)
        except OracleError as exc:
            raise self._unsupported("render a chat", str(exc)) from None
        return tok.encode(text, add_special_tokens=False)

    def _sampler_chain(self, sampler: Sampler) -> Any:
        lib = self.rt.lib
        chain = lib.llama_sampler_chain_init(lib.llama_sampler_chain_default_params())
        if sampler.greedy:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_greedy())
            return chain
        if sampler.top_k > 0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_k(sampler.top_k))
        if sampler.top_p < 1.0:
            lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_top_p(sampler.top_p, 1))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_temp(sampler.temperature))
        lib.llama_sampler_chain_add(chain, lib.llama_sampler_init_dist(sampler.seed & 0xFFFFFFFF))
        return chain

    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """llama.cpp's own sampler chain on a fresh context: each token is ``llama_sampler_sample`` of the
        last decode's logits (recorded raw as ``step_logits`` ``[N, V]`` float32), until an end-of-generation
        token (``llama_vocab_is_eog``) or ``max_new_tokens``.

        Raises:
            Unsupported: ``max_kv_size`` (llama.cpp has no rotating KV window).
        """
        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)", "llama.cpp has no rotating KV window")
        ids = self.text_ids(prompt)
        check_forward_length(self, 0, len(ids) + max(max_new_tokens - 1, 0))
        lib, ctx, chain = self.rt.lib, self.rt.context(), self._sampler_chain(sampler)
        tokens: list[int] = []
        rows: list[np.ndarray] = []
        finish, start, first = "length", time.perf_counter(), 0.0
        try:
            logits, _ = ctx.decode(ids, 1)
            while True:
                rows.append(logits[-1])
                tokens.append(int(lib.llama_sampler_sample(chain, ctx.ctx, -1)))
                first = first or time.perf_counter()
                if tokens[-1] in self.eos_token_ids:
                    finish = "stop"
                    break
                if len(tokens) >= max_new_tokens:
                    break
                logits, _ = ctx.decode([tokens[-1]], 1)
        finally:
            lib.llama_sampler_free(chain)
        end = time.perf_counter()
        step_logits = np.stack(rows).astype("<f4") if rows else np.zeros((0, self.vocab_size), "<f4")
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish, step_logits=step_logits,
                          prefill_seconds=(first or end) - start, decode_seconds=end - (first or end),
                          extra={"sampler": "llama_sampler_init_greedy" if sampler.greedy else "chain"})

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` by llama.cpp's detokenizer, special tokens kept."""
        return self.llama_tokenizer.decode(list(ids), skip_special_tokens=False)
