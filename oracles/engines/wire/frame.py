"""The wire's frame: one message, a fixed prefix, a JSON header, then the raw arrays (``docs/wire.md``).

::

    offset  size  field
    0       4     magic b"ORWP"
    4       4     header length H, u32 little-endian
    8       8     body length B, u64 little-endian
    16      H     header: one JSON object, UTF-8
    16+H    B     body: the arrays the header lists, in order, each C-contiguous little-endian, no padding

The header's ``"arrays"`` lists one descriptor per array, ``{"dtype": "f32", "shape": [T, V], "nbytes": N}``;
a value in the header stands for array ``i`` as ``{"array": i}``. Every length is checked against the
reader's :class:`Limits` before anything is allocated, and every descriptor against its bytes: a frame
that breaks a rule is a :class:`FrameError` naming the field. numpy and the standard library only.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np

from oracles.errors import OracleError

MAGIC = b"ORWP"
#: The protocol version this package speaks (the ``hello`` call's ``protocol``).
PROTOCOL = 1
PREFIX = struct.Struct("<4sIQ")
#: Wire dtype names -> numpy dtypes (all little-endian; ``u8`` carries pictures' pixels).
DTYPES: dict[str, np.dtype[Any]] = {"f32": np.dtype("<f4"), "i32": np.dtype("<i4"), "i64": np.dtype("<i8"),
                                    "u8": np.dtype("u1")}
_NAMES = {dt: name for name, dt in DTYPES.items()}


class FrameError(OracleError):
    """A frame that breaks the format: bad magic, a length past the limits, a header that is not a JSON
    object, a descriptor that does not match its bytes (the field named)."""


@dataclass(frozen=True)
class Limits:
    """What a reader accepts, checked before it allocates: ``header`` bytes of JSON (64 MiB: a
    generation's ids and text are kilobytes) and ``body`` bytes of arrays (8 GiB: ``[T, V]`` float32
    logits of a 4,096-token prefill at V = 151,936 are 2.5 GB), and ``arrays`` per frame."""

    header: int = 64 << 20
    body: int = 8 << 30
    arrays: int = 4096


@dataclass
class Frame:
    """One message: its JSON ``header`` (without ``"arrays"``) and its ``arrays`` (index = the ``{"array": i}``
    that stands for it in the header)."""

    header: dict[str, Any]
    arrays: list[np.ndarray] = field(default_factory=list)


def dtype_name(a: np.ndarray) -> str:
    """The wire name of ``a``'s dtype (after :func:`wire_array`)."""
    return _NAMES[a.dtype]


def wire_array(a: Any) -> np.ndarray:
    """``a`` as an array the wire carries: little-endian, C-contiguous, one of :data:`DTYPES` (a float array
    other than float32 is refused, never cast: the wire carries what the engine computed).

    Raises:
        FrameError: a dtype the wire does not carry.
    """
    arr = np.asarray(a)
    kind = arr.dtype
    if kind.kind == "b":
        kind = np.dtype("u1")
    for dt in DTYPES.values():
        if kind == dt or (kind.kind == dt.kind and kind.itemsize == dt.itemsize):
            return np.ascontiguousarray(arr, dtype=dt)
    raise FrameError(f"dtype {arr.dtype} is not one the wire carries ({', '.join(DTYPES)})")


def encode(header: dict[str, Any], arrays: Sequence[np.ndarray] = ()) -> list[bytes | memoryview]:
    """The chunks of one frame (written in order): prefix and header, then each array's bytes (not copied).

    Raises:
        FrameError: ``header`` is not JSON-able (strict: no NaN), or an array's dtype is not carried.
    """
    arrays = [wire_array(a) for a in arrays]
    described = [{"dtype": dtype_name(a), "shape": list(a.shape), "nbytes": int(a.nbytes)} for a in arrays]
    try:
        text = json.dumps({**header, "arrays": described}, allow_nan=False, separators=(",", ":")).encode()
    except (TypeError, ValueError) as exc:
        raise FrameError(f"header is not JSON: {exc}") from None
    body = sum(int(a.nbytes) for a in arrays)
    chunks: list[bytes | memoryview] = [PREFIX.pack(MAGIC, len(text), body) + text]
    chunks += [a.data.cast("B") for a in arrays if a.nbytes]
    return chunks


def read_prefix(prefix: bytes, limits: Limits) -> tuple[int, int]:
    """(header length, body length) of a frame's 16-byte prefix, both within ``limits``.

    Raises:
        FrameError: not the magic (the first bytes quoted), or a length past a limit.
    """
    magic, header, body = PREFIX.unpack(prefix)
    if magic != MAGIC:
        raise FrameError(f"magic is {prefix[:16]!r}, not {MAGIC!r}: not a frame (text on the harness's stdout?)")
    if header > limits.header:
        raise FrameError(f"header length {header} bytes passes the limit of {limits.header}")
    if body > limits.body:
        raise FrameError(f"body length {body} bytes passes the limit of {limits.body}")
    return header, body


def parse(header_bytes: bytes, body: bytearray, limits: Limits) -> Frame:
    """The frame of a header and its body (arrays are writable views of ``body``).

    Raises:
        FrameError: the header is not a UTF-8 JSON object, or an ``arrays`` descriptor is malformed, names
            a dtype not carried, or the descriptors' bytes do not add up to the body (field named).
    """
    try:
        header = json.loads(header_bytes.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FrameError(f"header is not UTF-8 JSON: {exc}; it begins {header_bytes[:60]!r}") from None
    if not isinstance(header, dict):
        raise FrameError(f"header is a JSON {type(header).__name__}, not an object")
    described = header.pop("arrays", [])
    if not isinstance(described, list) or len(described) > limits.arrays:
        raise FrameError(f"field arrays: expected a list of at most {limits.arrays} descriptors")
    arrays, at = [], 0
    for i, d in enumerate(described):
        dtype, shape = _descriptor(d, i)
        nbytes = dtype.itemsize * math.prod(shape)
        if d.get("nbytes", nbytes) != nbytes:
            raise FrameError(f"field arrays[{i}].nbytes: {d.get('nbytes')} for {_NAMES[dtype]} {shape} ({nbytes} bytes)")
        if at + nbytes > len(body):
            raise FrameError(f"field arrays[{i}]: its {nbytes} bytes pass the body's end ({len(body)} bytes)")
        arrays.append(np.frombuffer(body, dtype=dtype, count=math.prod(shape), offset=at).reshape(shape))
        at += nbytes
    if at != len(body):
        raise FrameError(f"field arrays: the descriptors hold {at} bytes, the body {len(body)}")
    return Frame(header, arrays)


def _descriptor(d: Any, i: int) -> tuple[np.dtype[Any], list[int]]:
    if not isinstance(d, dict) or d.get("dtype") not in DTYPES:
        got = d.get("dtype") if isinstance(d, dict) else d
        raise FrameError(f"field arrays[{i}].dtype: {got!r} is not one of {', '.join(DTYPES)}")
    shape = d.get("shape")
    if not (isinstance(shape, list) and all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise FrameError(f"field arrays[{i}].shape: {shape!r} is not a list of non-negative integers")
    return DTYPES[d["dtype"]], shape


def read_frame(recv: Callable[[memoryview, str], None], limits: Limits) -> Frame:
    """One frame read through ``recv(buffer, what)``, which fills ``buffer`` or raises (a transport's read
    with its deadline, or a blocking one); the lengths are checked before anything is allocated.

    Raises:
        FrameError: as :func:`read_prefix` and :func:`parse`; what ``recv`` raises, unchanged.
    """
    prefix = bytearray(PREFIX.size)
    recv(memoryview(prefix), "a frame's prefix")
    header_len, body_len = read_prefix(bytes(prefix), limits)
    header = bytearray(header_len)
    recv(memoryview(header), f"a {header_len}-byte header")
    body = bytearray(body_len)
    if body_len:
        recv(memoryview(body), f"a {body_len}-byte body")
    return parse(bytes(header), body, limits)
