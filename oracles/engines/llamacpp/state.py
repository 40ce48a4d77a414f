"""A llama.cpp sequence state (``llama_state_seq_get_data``'s bytes) read back as per-layer key and value
buffers, for :meth:`oracles.engines.base.Engine.snapshot_buffers`.

The layout llama.cpp b11739 writes for one sequence of a KV cache (``llama_kv_cache::state_write``,
little-endian): an 8-byte header, ``n_stream`` (u32), and per stream ``cell_count`` (u32) followed, when
non-zero, by each cell's ``pos`` (i32), ``n_seq_id`` (u32) and its seq ids (i32 each), then ``v_trans``
(u32), ``n_layer`` (u32) and 8 bytes (0 here; the header and these found by reading the bytes: the
llama-cpp-python 0.3.36 vendored source writes neither). Per layer the keys: ggml type (i32), row size
(u64), ``cell_count`` rows; then the values, as the keys (``v_trans == 0``) or transposed: type (i32),
element size (u32), ``n_embd_v_gqa`` (u32), and for each of those channels the ``cell_count`` elements.
A row holds the KV heads one after another (``[n_head_kv, head_dim]``, head_dim fastest). numpy only.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from oracles.errors import OracleError

#: ggml type id -> numpy dtype of the KV types read here.
DTYPES: dict[int, np.dtype[Any]] = {0: np.dtype("<f4"), 1: np.dtype("<f2")}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.at = data, 0

    def take(self, fmt: str) -> int:
        (value,) = struct.unpack_from(fmt, self.data, self.at)
        self.at += struct.calcsize(fmt)
        return int(value)

    def array(self, dtype: np.dtype[Any], count: int) -> np.ndarray:
        out = np.frombuffer(self.data, dtype=dtype, count=count, offset=self.at)
        self.at += dtype.itemsize * count
        return out


def _dtype(kind: int) -> np.dtype[Any]:
    if kind not in DTYPES:
        raise OracleError(f"llama.cpp state: KV ggml type {kind} is not f32 or f16")
    return DTYPES[kind]


def state_buffers(data: bytes, n_head_kv: int) -> dict[str, np.ndarray]:
    """``layers.<i>.keys`` and ``layers.<i>.values`` float32 ``[1, n_head_kv, T, head_dim]`` (T the cells the
    state holds, in cell order; the keys' head_dim in transformers' order, :func:`hf_rotary_order`), as
    the reference's cache holds them, from one sequence's state bytes (module docstring).

    Raises:
        OracleError: more than one non-empty stream, a KV type other than f32/f16, or bytes that end early.
    """
    r = _Reader(data)
    try:
        r.take("<Q")
        streams = r.take("<I")
        found: dict[str, np.ndarray] = {}
        for _ in range(streams):
            cells = r.take("<I")
            if cells == 0:
                continue
            if found:
                raise OracleError("llama.cpp state: more than one non-empty KV stream")
            for _cell in range(cells):
                r.take("<i")
                n_seq = r.take("<I")
                r.at += 4 * n_seq
            found = _layers(r, cells, n_head_kv)
        return found
    except struct.error as exc:
        raise OracleError(f"llama.cpp state: {len(data)} bytes end early at byte {r.at}: {exc}") from None


def _layers(r: _Reader, cells: int, n_head_kv: int) -> dict[str, np.ndarray]:
    v_trans, n_layer = r.take("<I"), r.take("<I")
    r.take("<Q")  # b11739 writes 8 more bytes here (0 on a llama KV cache) before the layers
    keys = []
    for _ in range(n_layer):
        dtype = _dtype(r.take("<i"))
        row = r.take("<Q") // dtype.itemsize
        keys.append(r.array(dtype, cells * row).reshape(cells, n_head_kv, -1).transpose(1, 0, 2))
    values = []
    for _ in range(n_layer):
        dtype = _dtype(r.take("<i"))
        if v_trans:
            r.take("<I")
            channels = r.take("<I")
            v = r.array(dtype, channels * cells).reshape(n_head_kv, -1, cells).transpose(0, 2, 1)
        else:
            row = r.take("<Q") // dtype.itemsize
            v = r.array(dtype, cells * row).reshape(cells, n_head_kv, -1).transpose(1, 0, 2)
        values.append(v)
    out: dict[str, np.ndarray] = {}
    for i, (k, v) in enumerate(zip(keys, values)):
        out[f"layers.{i}.keys"] = np.ascontiguousarray(hf_rotary_order(k)[None], dtype="<f4")
        out[f"layers.{i}.values"] = np.ascontiguousarray(v[None], dtype="<f4")
    return out


def hf_rotary_order(keys: np.ndarray) -> np.ndarray:
    """Keys ``[..., head_dim]`` from llama.cpp's rotary layout (pairs ``2i, 2i + 1`` rotate together:
    ``convert_hf_to_gguf.py`` permutes each head's Q and K rows so) back to transformers' (``i`` and
    ``i + head_dim / 2`` rotate together): ``hf[j * half + i] = llama[2 * i + j]``, an exact reindexing."""
    half = keys.shape[-1] // 2
    return keys.reshape(*keys.shape[:-1], half, 2).swapaxes(-1, -2).reshape(keys.shape)
