"""Proof that a safetensors file is what its header says. Pure Python, no pytest, no torch.

The format (huggingface/safetensors, ``docs/source/index.mdx``, "Format"): 8 bytes little-endian
unsigned header length ``N``, then ``N`` bytes of JSON ``{name: {"dtype", "shape", "data_offsets":
[begin, end]}, "__metadata__": {...}}``, then the data buffer; offsets are relative to the start of
the buffer (byte ``8 + N`` of the file). The library requires that the regions cover the buffer with
no gap and no overlap (its ``validate`` refuses a "metadata incomplete buffer").

:func:`tile_problems` proves: every tensor's region has the size ``prod(shape) * itemsize`` of its
dtype; sorted by begin, the regions start at 0 and each begins where the previous ends; and
``8 + N + last end == file size``. Every problem names the tensor concerned.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

#: Bytes per element of each safetensors dtype code (safetensors ``Dtype``, ``src/tensor.rs``).
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2, "F16": 2, "BF16": 2,
            "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
#: torch dtype name (``str(dtype)`` without ``torch.``) -> safetensors code, for the meta-build comparison.
TORCH_TO_CODE = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64", "int64": "I64",
                 "int32": "I32", "int16": "I16", "int8": "I8", "uint8": "U8", "bool": "BOOL"}


@dataclass(frozen=True)
class Region:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


def regions(header: Mapping[str, Any]) -> tuple[list[Region], list[str]]:
    """The tensors of a parsed header as regions sorted by (begin, end, name), and the problems of
    entries that are not well formed (each naming the tensor)."""
    out, problems = [], []
    for name, v in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = v["dtype"], tuple(int(s) for s in v["shape"]), v["data_offsets"]
        except (KeyError, TypeError, ValueError):
            problems.append(f"tensor {name!r}: entry is not {{dtype, shape, data_offsets: [begin, end]}}: {v!r}")
            continue
        if type(begin) is not int or type(end) is not int or not 0 <= begin <= end:
            problems.append(f"tensor {name!r}: data_offsets {[begin, end]} are not 0 <= begin <= end")
            continue
        if dtype not in ITEMSIZE:
            problems.append(f"tensor {name!r}: unknown dtype {dtype!r}")
            continue
        want = math.prod(shape) * ITEMSIZE[dtype]
        if end - begin != want:
            problems.append(f"tensor {name!r}: region of {end - begin} bytes, but {dtype} {list(shape)} needs {want}")
        out.append(Region(name, dtype, shape, begin, end))
    out.sort(key=lambda r: (r.begin, r.end, r.name))
    return out, problems


def tile_problems(header: Mapping[str, Any], header_len: int, file_size: int) -> tuple[list[str], dict[str, Any]]:
    """Every way the header fails to describe the file, and the figures of the proof.

    Args:
        header: the parsed header JSON; header_len: ``N``; file_size: bytes of the file.
    Returns:
        (problems, figures): problems name the tensor (empty when the proof holds); figures hold
        ``tensors``, ``data_bytes`` (last end), ``header_bytes``, ``file_bytes``, ``dtypes``.
    """
    regs, problems = regions(header)
    buffer = file_size - 8 - header_len
    prev: Region | None = None
    for r in regs:
        start = 0 if prev is None else prev.end
        if r.begin > start:
            after = "the start of the data" if prev is None else f"tensor {prev.name!r} (ends at {prev.end})"
            problems.append(f"tensor {r.name!r}: gap of {r.begin - start} bytes before it (begins at {r.begin}, after {after})")
        elif r.begin < start and prev is not None:
            problems.append(f"tensor {r.name!r}: overlaps tensor {prev.name!r} ({r.begin} < {prev.end})")
        if r.end > buffer:
            problems.append(f"tensor {r.name!r}: region [{r.begin}, {r.end}) runs past the end of the data "
                            f"({buffer} bytes after the header; the file is truncated)")
        prev = r if prev is None or r.end >= prev.end else prev
    last = max((r.end for r in regs), default=0)
    if 8 + header_len + last != file_size and last <= buffer:
        tail = regs[-1].name if regs else None
        problems.append(f"8 + header {header_len} + last end {last} = {8 + header_len + last} != file size {file_size}"
                        f" ({file_size - 8 - header_len - last} bytes after the last tensor {tail!r})")
    dtypes: dict[str, int] = {}
    for r in regs:
        dtypes[r.dtype] = dtypes.get(r.dtype, 0) + 1
    return problems, {"tensors": len(regs), "data_bytes": last, "header_bytes": header_len, "file_bytes": file_size,
                      "dtypes": dtypes}


def compare_to_model(header: Mapping[str, Any], model: Mapping[str, tuple[str, tuple[int, ...]]],
                     tied: Mapping[str, str]) -> dict[str, Any]:
    """Header tensors against a model's (name -> (safetensors dtype code, shape)).

    ``tied`` maps a model tensor that shares its storage with another (e.g. ``lm_head.weight`` ->
    ``model.embed_tokens.weight``); a tied tensor is expected *not* to be in the header.
    Returns the counts and lists (``missing_in_model``, ``not_in_header``, ``shape_differences``,
    ``dtype_differences``, ``tied_in_header``) and ``equal`` (all lists empty).
    """
    names = {k: v for k, v in header.items() if k != "__metadata__"}
    own = {k: v for k, v in model.items() if k not in tied}
    out = {
        "header_tensors": len(names), "model_tensors": len(model), "tied": dict(tied),
        "matched": sum(1 for k in names if k in own and tuple(names[k]["shape"]) == own[k][1] and names[k]["dtype"] == own[k][0]),
        "missing_in_model": sorted(k for k in names if k not in own),
        "not_in_header": sorted(k for k in own if k not in names),
        "shape_differences": sorted(k for k in names if k in own and tuple(names[k]["shape"]) != own[k][1]),
        "dtype_differences": sorted(k for k in names if k in own and names[k]["dtype"] != own[k][0]),
        "tied_in_header": sorted(k for k in tied if k in names),
    }
    out["equal"] = not any(out[k] for k in ("missing_in_model", "not_in_header", "shape_differences",
                                            "dtype_differences", "tied_in_header"))
    return out
