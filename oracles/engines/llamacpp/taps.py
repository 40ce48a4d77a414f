"""Layer taps of the llama.cpp port: the graph callback ``cb_eval`` of ``llama_context_params`` (what
``llama-eval-callback`` sets) hands each named tensor of the compute graph to Python as it is computed,
and the ones below fill the same :class:`oracles.engines.taps.Taps` record the reference's hooks fill.

Asked first (``ask = true``) for every node, the callback answers true only for the tensors below, so
the scheduler splits the graph after each of them and calls back (``ask = false``) with the tensor
computed; its ``float32`` data is copied then (``ggml_backend_tensor_get``), before a later node can
reuse the buffer. The binding's CFFI declarations leave ``struct ggml_tensor`` opaque: the tensor's
name and sizes come from libggml-base's own accessors (``ggml_get_name``, ``ggml_nelements``,
``ggml_nbytes``, ``ggml_element_size``, ``ggml_is_contiguous``), and its type and shape from the
struct's leading fields (``type``, ``buffer``, ``ne[4]``, ``nb[4]``, as ``ggml.h`` declares them),
checked on every tensor read against those accessors (a layout that disagrees is refused, naming both).

The mapping, llama.cpp b11739's llama graph (``src/models/llama.cpp``; ``NAME-l`` for layer ``l``)::

    Taps field      llama.cpp tensor   what it is
    stream[0]       embd               the token embeddings (get_rows of token_embd)
    attn_norm[l]    attn_norm-l        RMSNorm(x) * attn_norm.weight: transformers' input_layernorm output
    attn[l]         attn_out-l         attn_output.weight @ attention: the self_attn module's output
    mlp_norm[l]     ffn_norm-l         RMSNorm(h) * ffn_norm.weight: post_attention_layernorm's output
    mlp[l]          ffn_out-l          ffn_down @ (silu(gate) * up): the MLP module's output
    stream[l + 1]   l_out-l            ffn_out + ffn_inp, the layer's output
    hidden          (embeddings)       result_norm, read by ``llama_get_embeddings_ith`` as ``forward``
    logits          (logits)           result_output, read by ``llama_get_logits_ith`` as ``forward``

Where llama.cpp orders things otherwise than transformers, nothing here needs mapping: it applies the
rotary embedding inside the attention block (``Qcur``/``Kcur`` after ``ggml_rope_ext``), as transformers'
attention module does, so ``attn_out`` is the same quantity; both norms' outputs are after the weight
multiply (llama.cpp's ``build_norm`` names the bare normalisation ``norm-l`` and the product
``attn_norm-l``/``ffn_norm-l``). The graph names two tensors ``ffn_out-l``: the MLP's output and the sum
after it, which ``cb(cur, "l_out", il)`` renames before the graph runs, so one ``ffn_out-l`` is computed.
At the last layer llama.cpp selects the output rows (``ggml_get_rows`` with ``out_ids``) between
``attn_out`` and ``ffn_inp``; every position is an output here, so the selection keeps every row, in order.

A tensor the graph does not compute under its name (another architecture's graph, an op fused or done in
place) is refused as :class:`~oracles.engines.types.Unsupported`, naming the stage and the tensor. Only
the CPU backend is read (the engine runs ``n_gpu_layers = 0``): a tensor outside host memory is refused.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.taps import Taps
from oracles.engines.types import Unsupported
from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.engines.llamacpp.runtime import Context, Runtime

#: libggml-base's accessors and the leading fields of ``struct ggml_tensor`` (ggml.h: ``enum ggml_type
#: type; struct ggml_backend_buffer * buffer; int64_t ne[4]; size_t nb[4];``), under names of their own
#: so they never meet the binding's opaque ``struct ggml_tensor``.
CDEF = """
struct oracles_ggml_tensor_head { int32_t type; void * buffer; int64_t ne[4]; size_t nb[4]; };
const char * ggml_get_name(const void * tensor);
int64_t ggml_nelements(const void * tensor);
size_t ggml_nbytes(const void * tensor);
size_t ggml_element_size(const void * tensor);
bool ggml_is_contiguous(const void * tensor);
bool ggml_backend_buffer_is_host(void * buffer);
void ggml_backend_tensor_get(const void * tensor, void * data, size_t offset, size_t size);
"""
#: ggml's type id of float32 (``GGML_TYPE_F32``).
GGML_F32 = 0
#: llama.cpp's per-layer tensor -> (the Taps field it fills, the stage it is in a refusal): module docstring.
LAYER_TENSORS = {"attn_norm": ("attn_norm", "attention norm"), "attn_out": ("attn", "attention output"),
                 "ffn_norm": ("mlp_norm", "MLP norm"), "ffn_out": ("mlp", "MLP output"), "l_out": ("stream", "output")}
#: The embedding's tensor (row 0 of the stream).
EMBEDDING = "embd"
_GGML: dict[Path, Any] = {}


class Ggml:
    """libggml-base's accessors, opened from the folder libllama was opened from (the same file, so the
    same loaded library)."""

    def __init__(self, folder: Path) -> None:
        from cffi import FFI  # type: ignore[import-untyped]  # cffi ships no types

        if folder not in _GGML:
            ffi = FFI()
            ffi.cdef(CDEF)
            path = folder / "libggml-base.so.0"
            try:
                _GGML[folder] = (ffi, ffi.dlopen(str(path)))
            except OSError as exc:
                raise OracleError(f"{path}: cannot be opened: {exc}") from None
        self.ffi, self.lib = _GGML[folder]

    def name(self, tensor: Any) -> str:
        """The tensor's name (``ggml_get_name``)."""
        return str(self.ffi.string(self.lib.ggml_get_name(tensor)).decode("utf-8", "replace"))

    def read(self, tensor: Any) -> np.ndarray:
        """A copy of a computed float32 tensor, ``[ne[3], ne[2], ne[1], ne[0]]`` (ggml's first dimension
        is the fastest: a ``[D, T]`` activation is ``[1, 1, T, D]`` here).

        Raises:
            OracleError: not float32, not contiguous, outside host memory, or a layout that disagrees
                with libggml-base's accessors (both readings named).
        """
        head = self.ffi.cast("struct oracles_ggml_tensor_head *", tensor)
        ne, nb = [int(head.ne[i]) for i in range(4)], [int(head.nb[i]) for i in range(4)]
        name = self.name(tensor)
        if int(head.type) != GGML_F32:
            raise OracleError(f"llama.cpp tensor {name!r}: ggml type {int(head.type)}, not F32 ({GGML_F32})")
        lib = self.lib
        count, size, elem = int(lib.ggml_nelements(tensor)), int(lib.ggml_nbytes(tensor)), int(lib.ggml_element_size(tensor))
        if (count, size, elem) != (int(np.prod(ne)), 4 * int(np.prod(ne)), 4) or nb[0] != 4:
            raise OracleError(f"llama.cpp tensor {name!r}: the ggml_tensor layout read here (ne {ne}, nb {nb}) disagrees "
                              f"with libggml-base (ggml_nelements {count}, ggml_nbytes {size}, element size {elem})")
        if not self.lib.ggml_is_contiguous(tensor):
            raise OracleError(f"llama.cpp tensor {name!r}: not contiguous (ne {ne}, nb {nb})")
        if head.buffer == self.ffi.NULL or not self.lib.ggml_backend_buffer_is_host(head.buffer):
            raise OracleError(f"llama.cpp tensor {name!r}: not in host memory (a non-CPU backend's buffer)")
        out = np.empty(ne[::-1], dtype="<f4")
        self.lib.ggml_backend_tensor_get(tensor, self.ffi.cast("void *", out.ctypes.data), 0, size)
        return out


@dataclass
class _Capture:
    """One decode's wanted tensors, each a list of ``[T_ubatch, D]`` arrays (one a micro-batch)."""

    wanted: frozenset[str]
    got: dict[str, list[np.ndarray]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class GraphTap:
    """The ``cb_eval`` callback of one tapped context: idle (asks for nothing) unless a capture is open."""

    def __init__(self, rt: Runtime) -> None:
        self.ggml = Ggml(rt.library.parent)
        self.capture: _Capture | None = None
        self.callback = rt.ffi.callback("ggml_backend_sched_eval_callback", self._called, onerror=self._failed)

    def _called(self, tensor: Any, ask: bool, _data: Any) -> bool:
        cap = self.capture
        if cap is None:
            return False
        pointer = self.ggml.ffi.cast("const void *", int(self.ggml.ffi.cast("uintptr_t", tensor)))
        name = self.ggml.name(pointer)
        if ask:
            return name in cap.wanted
        if name in cap.wanted:
            try:
                rows = self.ggml.read(pointer)
            except OracleError as exc:
                cap.errors.append(str(exc))
            else:
                cap.got.setdefault(name, []).append(rows.reshape(-1, rows.shape[-1]))
        return True  # false would stop the graph's compute

    def _failed(self, exc_type: Any, exc: Any, _tb: Any) -> bool:
        if self.capture is not None:
            self.capture.errors.append(f"{exc_type.__name__}: {exc}")
        return True


def wanted_names(n_layer: int) -> frozenset[str]:
    """Every tensor name the taps read for ``n_layer`` layers (module docstring)."""
    return frozenset([EMBEDDING, *(f"{t}-{i}" for t in LAYER_TENSORS for i in range(n_layer))])


def tapped_decode(ctx: Context, tap: GraphTap, ids: Sequence[int]) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """A cold prefill of ``ids`` in ``ctx`` (emptied first, every position an output) with ``tap``
    capturing: ({name: ``[T, D]`` float32 over every micro-batch}, logits ``[T, V]``, hidden ``[T, D]``).

    Raises:
        OracleError: a tensor could not be read, or ``llama_decode`` fails.
    """
    ctx.remove_from(0)
    tap.capture = cap = _Capture(wanted_names(ctx.rt.n_layer))
    try:
        logits, hidden = ctx.decode(list(ids), len(ids))
    finally:
        tap.capture = None
    if cap.errors:
        raise OracleError(f"{ctx.rt.gguf}: layer taps: {cap.errors[0]} ({len(cap.errors)} tensor(s) unread)")
    return {k: np.concatenate(v) for k, v in cap.got.items()}, logits, hidden


def taps_of(found: dict[str, np.ndarray], logits: np.ndarray, hidden: np.ndarray, n_layer: int,
            engine_id: str) -> Taps:
    """The :class:`Taps` of a :func:`tapped_decode` (module docstring's mapping).

    Raises:
        Unsupported: a tensor the graph did not compute under its name, or one of the wrong shape
            (the stage named: llama.cpp's graph for this architecture, or a fused op, leaves it out).
    """
    rows, width = hidden.shape

    def get(name: str, stage: str) -> np.ndarray:
        array = found.get(name)
        if array is None:
            raise Unsupported(engine_id, f"tap {stage}", f"llama.cpp's graph computed no tensor named {name!r} (another "
                              "architecture's graph, or an op fused or done in place, leaves it unnamed)")
        if array.shape != (rows, width):
            raise Unsupported(engine_id, f"tap {stage}", f"llama.cpp's {name!r} is {list(array.shape)}, not [T, D] = "
                              f"[{rows}, {width}]")
        return array

    per_layer = {key: np.stack([get(f"{tensor}-{i}", f"layer {i}'s {what}") for i in range(n_layer)])
                 for tensor, (key, what) in LAYER_TENSORS.items()}
    stream = np.concatenate([get(EMBEDDING, "the embedding")[None], per_layer.pop("stream")])
    return Taps(stream=stream, hidden=hidden, logits=logits, mixers=["self_attn"] * n_layer, **per_layer)


def llamacpp_taps(rt: Runtime, ids: Sequence[int], engine_id: str) -> Taps:
    """Taps of a cold prefill of ``ids`` on the loaded model ``rt``, in a context of its own made with
    the callback and the engine's settings (freed with it: its KV cache is not held between calls;
    module docstring). ``engine_id`` names the engine in a refusal.

    Raises:
        Unsupported: a stage the graph does not compute under its llama name (:func:`taps_of`).
        OracleError: a tensor could not be read, or llama.cpp cannot make the context or decode.
    """
    tap = GraphTap(rt)
    found, logits, hidden = tapped_decode(rt.context(tap.callback), tap, ids)
    return taps_of(found, logits, hidden, rt.n_layer, engine_id)


__all__ = ["CDEF", "EMBEDDING", "LAYER_TENSORS", "Ggml", "GraphTap", "llamacpp_taps", "taps_of", "tapped_decode",
           "wanted_names"]
