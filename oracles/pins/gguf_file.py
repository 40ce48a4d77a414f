"""What a GGUF file says about itself, read from its header alone (no tensor data, no llama.cpp).

A GGUF file (version 2 or 3) is: magic ``GGUF``, version (u32), tensor count and metadata count
(u64 each), the metadata key/value pairs, then one info per tensor (name, dims, ggml type, offset
into the data section), then the data section at the next multiple of ``general.alignment`` (default
32). :func:`read_header` parses all of that with ``struct`` (the vocabulary array of SmolLM2, 49,152
strings, in ~60 ms) and :meth:`GgufHeader.check_complete` holds the file's length to the end of its
last tensor, so a truncated file is one line naming the tensor it cuts, before any loader maps it.

Also the checks a GGUF pin runs before its engine loads: the vocabulary against the pin's
tokenizer.json (:func:`vocabulary_disagreement`). Nothing heavy is imported: the ``gguf`` package
(numpy only) lends its table of block sizes inside :meth:`GgufHeader.data_end`.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from oracles.errors import PinError

MAGIC = b"GGUF"
#: metadata value type -> struct format of a scalar (8: string, 9: array, handled apart).
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
#: ``general.file_type`` values (``llama_ftype`` in llama.h) as gguf.LlamaFileType spells them (gguf 0.19.0).
FILE_TYPES = {0: "ALL_F32", 1: "MOSTLY_F16", 2: "MOSTLY_Q4_0", 3: "MOSTLY_Q4_1", 7: "MOSTLY_Q8_0", 8: "MOSTLY_Q5_0",
              9: "MOSTLY_Q5_1", 10: "MOSTLY_Q2_K", 11: "MOSTLY_Q3_K_S", 12: "MOSTLY_Q3_K_M", 13: "MOSTLY_Q3_K_L",
              14: "MOSTLY_Q4_K_S", 15: "MOSTLY_Q4_K_M", 16: "MOSTLY_Q5_K_S", 17: "MOSTLY_Q5_K_M", 18: "MOSTLY_Q6_K",
              19: "MOSTLY_IQ2_XXS", 20: "MOSTLY_IQ2_XS", 21: "MOSTLY_Q2_K_S", 22: "MOSTLY_IQ3_XS", 23: "MOSTLY_IQ3_XXS",
              24: "MOSTLY_IQ1_S", 25: "MOSTLY_IQ4_NL", 26: "MOSTLY_IQ3_S", 27: "MOSTLY_IQ3_M", 28: "MOSTLY_IQ2_S",
              29: "MOSTLY_IQ2_M", 30: "MOSTLY_IQ4_XS", 31: "MOSTLY_IQ1_M", 32: "MOSTLY_BF16", 36: "MOSTLY_TQ1_0",
              37: "MOSTLY_TQ2_0", 38: "MOSTLY_MXFP4_MOE", 39: "MOSTLY_NVFP4", 40: "MOSTLY_Q1_0"}


class _Truncated(Exception):
    """The header itself runs past the end of the file."""


@dataclass
class TensorInfo:
    """One tensor's header entry: name, dims (innermost first, as ggml), ggml type id, data offset."""

    name: str
    dims: tuple[int, ...]
    ggml_type: int
    offset: int


@dataclass
class GgufHeader:
    """A parsed GGUF header: ``path``, ``version``, ``metadata`` (key -> value; arrays as lists),
    ``tensors`` and ``data_start`` (the byte offset of the data section)."""

    path: Path
    version: int
    metadata: dict[str, Any] = field(default_factory=dict)
    tensors: list[TensorInfo] = field(default_factory=list)
    data_start: int = 0

    @property
    def architecture(self) -> str | None:
        """``general.architecture`` (None when absent)."""
        value = self.metadata.get("general.architecture")
        return value if isinstance(value, str) else None

    @property
    def file_type(self) -> str | None:
        """``general.file_type`` as gguf.LlamaFileType names it without ``MOSTLY_`` (``"Q4_1"``, ``"ALL_F32"``),
        ``"ftype <n>"`` for a value not in :data:`FILE_TYPES`, None when absent."""
        value = self.metadata.get("general.file_type")
        if not isinstance(value, int):
            return None
        return FILE_TYPES.get(value, f"ftype {value}").removeprefix("MOSTLY_")

    @property
    def tokens(self) -> list[str] | None:
        """``tokenizer.ggml.tokens`` (id -> token string), None when absent."""
        value = self.metadata.get("tokenizer.ggml.tokens")
        return value if isinstance(value, list) else None

    def data_end(self) -> tuple[int, str]:
        """(byte offset where the last tensor's data ends, that tensor's name); (data_start, "") for none.

        Raises:
            PinError: a tensor of a ggml type the gguf package does not know (file and tensor named).
        """
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        end, last = self.data_start, ""
        for t in self.tensors:
            try:
                block, size = GGML_QUANT_SIZES[GGMLQuantizationType(t.ggml_type)]
            except (ValueError, KeyError):
                raise PinError(f"{self.path}: tensor {t.name!r} has ggml type {t.ggml_type}, which the gguf "
                               "package does not know") from None
            n = 1
            for d in t.dims:
                n *= d
            stop = self.data_start + t.offset + n // block * size
            if stop > end:
                end, last = stop, t.name
        return end, last

    def check_complete(self) -> None:
        """Raises PinError when the file ends before its last tensor's data does (the truncated
        tensor, its end and the file's size named)."""
        end, last = self.data_end()
        size = self.path.stat().st_size
        if size < end:
            raise PinError(f"{self.path}: truncated: tensor {last!r} ends at byte {end} but the file has {size} bytes")


def _read(fh: BinaryIO, n: int) -> bytes:
    data = fh.read(n)
    if len(data) != n:
        raise _Truncated
    return data


def _string(fh: BinaryIO) -> str:
    (n,) = struct.unpack("<Q", _read(fh, 8))
    return _read(fh, n).decode("utf-8", errors="replace")


def _value(fh: BinaryIO, kind: int) -> Any:
    if kind == 8:
        return _string(fh)
    if kind == 9:
        inner, count = struct.unpack("<IQ", _read(fh, 12))
        if inner in _SCALARS:
            fmt = _SCALARS[inner]
            width = struct.calcsize(fmt)
            return list(struct.unpack(f"<{count}{fmt[1]}", _read(fh, width * count)))
        return [_value(fh, inner) for _ in range(count)]
    if kind not in _SCALARS:
        raise ValueError(f"metadata value type {kind}")
    fmt = _SCALARS[kind]
    return struct.unpack(fmt, _read(fh, struct.calcsize(fmt)))[0]


def read_header(path: Path) -> GgufHeader:
    """Parse ``path``'s GGUF header (module docstring).

    Raises:
        PinError: not a GGUF file (its first bytes named), a version other than 2 or 3, a header that
            runs past the end of the file, or a metadata value of an unknown type (the key named).
    """
    with open(path, "rb") as fh:
        head = fh.read(4)
        if head != MAGIC:
            raise PinError(f"{path}: not a GGUF file: it starts with {head!r}, not {MAGIC!r}")
        key = "header"
        try:
            version, n_tensors, n_kv = struct.unpack("<IQQ", _read(fh, 20))
            if version not in (2, 3):
                raise PinError(f"{path}: field 'version' is {version}; GGUF versions 2 and 3 are read")
            out = GgufHeader(path, version)
            for _ in range(n_kv):
                key = _string(fh)
                (kind,) = struct.unpack("<I", _read(fh, 4))
                out.metadata[key] = _value(fh, kind)
            key = "tensor infos"
            for _ in range(n_tensors):
                name = _string(fh)
                (n_dims,) = struct.unpack("<I", _read(fh, 4))
                dims = struct.unpack(f"<{n_dims}Q", _read(fh, 8 * n_dims))
                ggml_type, offset = struct.unpack("<IQ", _read(fh, 12))
                out.tensors.append(TensorInfo(name, tuple(dims), ggml_type, offset))
        except _Truncated:
            raise PinError(f"{path}: truncated: the GGUF header ends inside {key!r}") from None
        except ValueError as exc:
            raise PinError(f"{path}: field {key!r}: unknown {exc}") from None
        align = out.metadata.get("general.alignment", 32)
        align = align if isinstance(align, int) and align > 0 else 32
        out.data_start = -(-fh.tell() // align) * align
    return out


def pin_vocabulary(tokenizer_json: Path) -> list[str]:
    """The vocabulary of a tokenizer.json, id -> token string (``model.vocab`` and ``added_tokens``).

    Raises:
        PinError: the file is missing or not a tokenizer.json with ``model.vocab`` (file named).
    """
    try:
        doc = json.loads(tokenizer_json.read_text(encoding="utf-8"))
        vocab: dict[str, int] = dict(doc["model"]["vocab"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PinError(f"{tokenizer_json}: field 'model.vocab' cannot be read: {exc}") from None
    for added in doc.get("added_tokens") or []:
        vocab[str(added["content"])] = int(added["id"])
    out = [""] * (max(vocab.values()) + 1 if vocab else 0)
    for token, i in vocab.items():
        out[i] = token
    return out


def vocabulary_disagreement(header: GgufHeader, tokenizer_json: Path) -> str | None:
    """One line naming the GGUF file, its field ``tokenizer.ggml.tokens`` and how it differs from the
    pin's ``tokenizer_json`` (count, first differing id with both strings, how many differ), or None
    when the two vocabularies are the same list."""
    tokens = header.tokens
    field_name = f"{header.path}: field 'tokenizer.ggml.tokens'"
    if tokens is None:
        return f"{field_name} is missing: llama.cpp's tokenizer cannot be held to {tokenizer_json}"
    pinned = pin_vocabulary(tokenizer_json)
    if len(tokens) != len(pinned):
        return f"{field_name} has {len(tokens)} tokens but {tokenizer_json} has {len(pinned)}"
    differ = [i for i, (a, b) in enumerate(zip(tokens, pinned)) if a != b]
    if differ:
        i = differ[0]
        return (f"{field_name} differs from {tokenizer_json}: first at id {i} ({tokens[i]!r} vs {pinned[i]!r}), "
                f"{len(differ)} of {len(tokens)} ids differ")
    return None
