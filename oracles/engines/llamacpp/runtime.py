"""llama.cpp's model and contexts through its C API (``llama-cpp-py-sync``'s CFFI declarations): load a
GGUF, make a context with the engine's settings, decode a batch and read what it wrote.

One :class:`Runtime` per engine holds the opened library and the loaded ``llama_model``; every cache is
a :class:`Context` of its own (one ``llama_context``, one sequence, its own KV cache), freed when the
cache object is collected. A context is made with ``embeddings = true`` and pooling ``NONE``, so one
``llama_decode`` writes both, for every position marked as an output: the logits
(``llama_get_logits_ith``, ``[V]`` float32, the LM head's output) and the embeddings
(``llama_get_embeddings_ith``, ``[D]`` float32: the graph's ``t_embd``, which llama.cpp's llama graph
sets to ``result_norm``, the final RMSNorm's output the head reads).

llama.cpp's log lines go to a callback that keeps the last ones (:data:`LOG`), so a load that fails
(``llama_model_load_from_file`` returns NULL) is one line quoting llama.cpp's own reason.
"""

from __future__ import annotations

import collections
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.errors import OracleError

#: ggml type ids of the KV cache types an engine option may name (``type_k`` / ``type_v``).
KV_TYPES = {"f32": 0, "f16": 1}
#: llama.cpp's last log lines (level, text), newest last.
LOG: collections.deque[tuple[int, str]] = collections.deque(maxlen=64)
_KEEP: dict[str, Any] = {}


@dataclass(frozen=True)
class Settings:
    """What a context is made with (all recorded by the engine's ``describe()``): ``kv_type`` (a key of
    :data:`KV_TYPES`), ``threads`` (0: llama.cpp's default), ``n_ctx`` (positions a cache holds),
    ``n_batch`` (tokens one ``llama_decode`` takes; ``n_ubatch`` is the same), ``flash_attn``."""

    kv_type: str = "f32"
    threads: int = 0
    n_ctx: int = 2048
    n_batch: int = 512
    flash_attn: bool = False


def _install_log(ffi: Any, lib: Any) -> None:
    if "log" in _KEEP:
        return

    @ffi.callback("void(enum ggml_log_level, const char *, void *)")
    def keep(level: int, text: Any, _data: Any) -> None:
        LOG.append((int(level), ffi.string(text).decode("utf-8", "replace")))

    _KEEP["log"] = keep
    lib.llama_log_set(keep, ffi.NULL)


def last_error() -> str:
    """llama.cpp's last error-level log line (level 4), stripped; ``""`` when none."""
    return next((text.strip() for level, text in reversed(LOG) if level == 4 and text.strip()), "")


class Runtime:
    """The library and one loaded GGUF model.

    Raises (from ``__init__``):
        OracleError: the library cannot be opened, or llama.cpp refuses the file (its reason quoted).
    """

    def __init__(self, gguf: Path, settings: Settings) -> None:
        from oracles.engines.llamacpp.native import load_library

        loaded = load_library()
        self.ffi, self.lib, self.library, self.patch = loaded.ffi, loaded.lib, loaded.path, loaded.patch
        _install_log(self.ffi, self.lib)
        self.gguf, self.settings = gguf, settings
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        LOG.clear()
        self.model = self.lib.llama_model_load_from_file(str(gguf).encode(), params)
        if self.model == self.ffi.NULL:
            raise OracleError(f"{gguf}: llama.cpp cannot load it: {last_error() or 'llama_model_load_from_file failed'}")
        weakref.finalize(self, self.lib.llama_model_free, self.model)
        self.vocab = self.lib.llama_model_get_vocab(self.model)
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(self.vocab))
        self.n_embd = int(self.lib.llama_model_n_embd(self.model))
        self.n_layer = int(self.lib.llama_model_n_layer(self.model))
        self.n_ctx_train = int(self.lib.llama_model_n_ctx_train(self.model))

    def meta(self, key: str) -> str | None:
        """The GGUF metadata value ``key`` as llama.cpp renders it, None when absent."""
        size = int(self.lib.llama_model_meta_val_str(self.model, key.encode(), self.ffi.NULL, 0))
        if size < 0:
            return None
        buf = self.ffi.new("char[]", size + 1)
        self.lib.llama_model_meta_val_str(self.model, key.encode(), buf, size + 1)
        return str(self.ffi.string(buf).decode("utf-8", "replace"))

    def chat_template(self) -> str | None:
        """The GGUF's ``tokenizer.chat_template`` (``llama_model_chat_template``), None when absent."""
        found = self.lib.llama_model_chat_template(self.model, self.ffi.NULL)
        return None if found == self.ffi.NULL else str(self.ffi.string(found).decode("utf-8"))

    def context(self, eval_callback: Any = None) -> "Context":
        """A new context with :attr:`settings` (module docstring); ``eval_callback``: a CFFI callback of
        type ``ggml_backend_sched_eval_callback`` set as the context's ``cb_eval`` (the graph callback
        ``llama-eval-callback`` uses; :mod:`oracles.engines.llamacpp.taps`), kept alive by the context.

        Raises:
            OracleError: llama.cpp cannot make it (its reason quoted).
        """
        return Context(self, eval_callback)


class Context:
    """One ``llama_context`` holding one sequence (id 0): its KV cache and the outputs of its last decode.

    ``length`` is the positions its KV cache holds (the next token's position).
    """

    def __init__(self, rt: Runtime, eval_callback: Any = None) -> None:
        s, lib = rt.settings, rt.lib
        params = lib.llama_context_default_params()
        params.n_ctx, params.n_batch, params.n_ubatch, params.n_seq_max = s.n_ctx, s.n_batch, s.n_batch, 1
        if s.threads:
            params.n_threads = params.n_threads_batch = s.threads
        params.type_k = params.type_v = KV_TYPES[s.kv_type]
        params.flash_attn_type = 1 if s.flash_attn else 0
        params.embeddings, params.pooling_type = True, 0
        self.eval_callback = eval_callback  # referenced for as long as llama.cpp may call it
        if eval_callback is not None:
            params.cb_eval, params.cb_eval_user_data = eval_callback, rt.ffi.NULL
        LOG.clear()
        self.ctx = lib.llama_init_from_model(rt.model, params)
        if self.ctx == rt.ffi.NULL:
            raise OracleError(f"{rt.gguf}: llama.cpp cannot make a context ({s}): {last_error() or 'NULL'}")
        weakref.finalize(self, lib.llama_free, self.ctx)
        self.rt, self.length = rt, 0
        self.threads = int(lib.llama_n_threads(self.ctx)) if hasattr(lib, "llama_n_threads") else s.threads
        self.n_ctx = int(lib.llama_n_ctx(self.ctx))

    def decode(self, ids: Sequence[int], outputs: int) -> tuple[np.ndarray, np.ndarray]:
        """Append ``ids`` at positions ``length...``, in batches of ``n_batch``, the last ``outputs``
        positions marked as outputs; returns their (logits ``[outputs, V]``, embeddings ``[outputs, D]``)
        float32, read after each batch.

        Raises:
            OracleError: ``llama_decode`` returns non-zero (its code and llama.cpp's reason quoted).
        """
        lib, n_batch = self.rt.lib, self.rt.settings.n_batch
        first_out = len(ids) - outputs
        got: list[tuple[np.ndarray, np.ndarray]] = []
        for start in range(0, len(ids), n_batch):
            chunk = ids[start:start + n_batch]
            batch = lib.llama_batch_init(len(chunk), 0, 1)
            try:
                for j, token in enumerate(chunk):
                    batch.token[j], batch.pos[j] = int(token), self.length + j
                    batch.n_seq_id[j], batch.seq_id[j][0] = 1, 0
                    batch.logits[j] = 1 if start + j >= first_out else 0
                batch.n_tokens = len(chunk)
                LOG.clear()
                code = int(lib.llama_decode(self.ctx, batch))
            finally:
                lib.llama_batch_free(batch)
            if code != 0:
                raise OracleError(f"{self.rt.gguf}: llama_decode returned {code} at position {self.length}: "
                                  f"{last_error() or 'no reason logged'}")
            self.length += len(chunk)
            if (marked := start + len(chunk) - max(first_out, start)) > 0:
                got.append(self.read(marked))
        if not got:
            return np.zeros((0, self.rt.n_vocab), "<f4"), np.zeros((0, self.rt.n_embd), "<f4")
        return np.concatenate([g[0] for g in got]), np.concatenate([g[1] for g in got])

    def read(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """(logits ``[rows, V]``, embeddings ``[rows, D]``) float32 copies of the last ``rows`` outputs of
        the last ``llama_decode``."""
        rt, ffi = self.rt, self.rt.ffi
        logits = np.empty((rows, rt.n_vocab), dtype=np.float32)
        hidden = np.empty((rows, rt.n_embd), dtype=np.float32)
        for r in range(rows):
            i = r - rows
            logits[r] = np.frombuffer(ffi.buffer(rt.lib.llama_get_logits_ith(self.ctx, i), 4 * rt.n_vocab), "<f4")
            hidden[r] = np.frombuffer(ffi.buffer(rt.lib.llama_get_embeddings_ith(self.ctx, i), 4 * rt.n_embd), "<f4")
        return logits, hidden

    def remove_from(self, position: int) -> bool:
        """Drop positions ``position...`` of the KV cache (``llama_memory_seq_rm``); True when done."""
        mem = self.rt.lib.llama_get_memory(self.ctx)
        done = bool(self.rt.lib.llama_memory_seq_rm(mem, 0, position, -1))
        if done:
            self.length = min(self.length, position)
        return done

    def state(self) -> bytes:
        """The sequence's state (``llama_state_seq_get_data``: its KV rows and positions), as bytes."""
        lib, ffi = self.rt.lib, self.rt.ffi
        size = int(lib.llama_state_seq_get_size(self.ctx, 0))
        buf = ffi.new("uint8_t[]", size)
        wrote = int(lib.llama_state_seq_get_data(self.ctx, buf, size, 0))
        return bytes(ffi.buffer(buf, wrote))

    def load_state(self, data: bytes, length: int) -> None:
        """Set the sequence's state from :meth:`state`'s bytes (``llama_state_seq_set_data``).

        Raises:
            OracleError: llama.cpp reads none of it (returns 0).
        """
        lib, ffi = self.rt.lib, self.rt.ffi
        buf = ffi.from_buffer("uint8_t[]", data)
        if data and int(lib.llama_state_seq_set_data(self.ctx, buf, len(data), 0)) == 0:
            raise OracleError(f"{self.rt.gguf}: llama_state_seq_set_data read none of a {len(data)}-byte snapshot: "
                              f"{last_error() or 'no reason logged'}")
        self.length = length
