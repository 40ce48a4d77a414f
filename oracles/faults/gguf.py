"""Faulty GGUF files: a faithful GGUF copied and one thing in it made wrong, as real conversions have
shipped it, so llama.cpp loads the copy exactly as it loads the original and only the fault differs.
The ``gguf`` package's ``GGUFReader`` finds where each value and tensor lies in the source file (once
per file: :func:`layout`), and the copy's bytes are rewritten there in place: a metadata value in its
own dtype, as ``gguf_set_metadata.py`` sets one, a tensor's rows permuted.

The kinds (:data:`GGUF_FAULTS`), each with the stage ``oracles bisect --port llamacpp`` must name:

* ``k_rows_unpermuted``: one layer's ``attn_k.weight`` rows left in transformers' order, i.e. without
  the permute ``convert_hf_to_gguf.py``'s ``LlamaModel.modify_tensors`` applies to q and k (each head's
  rotary halves interleaved into pairs for llama.cpp's NORM rope): that layer's attention.
* ``rope_base_10000``: ``{arch}.rope.freq_base`` set to 10,000 (the library default a converter falls
  back to when it reads the base from the wrong config key): the first layer's attention.
* ``rms_eps_tenth``: ``{arch}.attention.layer_norm_rms_epsilon`` times 0.1: the first norm the graph
  runs, layer 0's attention norm.

:func:`write_fault_pin` writes a faulty copy of a GGUF pin's snapshot and a pin file for it (source
``local:DIR``, every digest recomputed, the fault recorded), the way a user pins a GGUF they made; then
``oracles --pins-dir DIR bisect --pin REFERENCE --port llamacpp --port-pin NAME`` localises it. numpy at
import; ``gguf`` inside the functions.
"""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

#: The rotary base the ``rope_base_10000`` fault writes (llama.cpp's and transformers' Llama default).
DEFAULT_ROPE_BASE = 10_000.0
#: The factor the ``rms_eps_tenth`` fault multiplies the RMSNorm epsilon by.
EPS_FACTOR = 0.1


@dataclass(frozen=True)
class GgufFault:
    """One fault kind: ``title`` (what the conversion got wrong), the ``block`` inside the named layer
    where bisect must find it (``"attention"``, ``"attention norm"``), and ``layered``: the fault sits
    in one chosen layer (else every layer reads it and layer 0 is the first)."""

    name: str
    title: str
    block: str
    layered: bool
    inject: Callable[[_Copy, int], dict[str, Any]]

    def stage(self, layer: int) -> str:
        """The stage bisect names for the fault injected at ``layer`` (its layer, or layer 0)."""
        return f"layer {layer if self.layered else 0}"


class _Missing(Exception):
    """What a kind needs is not in the file (the caller names the file)."""


@dataclass(frozen=True)
class Layout:
    """Where a fault can write in one GGUF file, found by the ``gguf`` package's ``GGUFReader``:
    ``arch`` (``general.architecture``), each scalar field's (byte offset, numpy dtype, value), each
    tensor's (byte offset of its data, numpy shape, dtype; rows outermost as ``GGUFReader`` gives them)."""

    arch: str
    fields: dict[str, tuple[int, np.dtype[Any], Any]]
    tensors: dict[str, tuple[int, tuple[int, ...], np.dtype[Any]]]

    def value(self, key: str) -> Any:
        if key not in self.fields:
            raise _Missing(f"no scalar field {key!r}")
        return self.fields[key][2]


@functools.lru_cache(maxsize=4)
def _layout(path: Path, _stamp: tuple[int, int]) -> Layout:
    """The :class:`Layout` of ``path`` (``_stamp``: its size and mtime, so a changed file is read again).
    ``GGUFReader`` reads every metadata array item by item (SmolLM2's 49,152-token vocabulary: ~4 s of CPU
    here), so a file is read once and its copies are patched at the offsets found."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    base = reader.data.ctypes.data
    arch = reader.get_field("general.architecture")
    fields = {}
    for key, f in reader.fields.items():
        if len(f.types) == 1 and f.types[0] not in (GGUFValueType.STRING, GGUFValueType.ARRAY):
            part = f.parts[f.data[0]]
            fields[key] = (int(part.ctypes.data - base), part.dtype, part[0].item())
    tensors = {t.name: (int(t.data_offset), tuple(int(n) for n in t.data.shape), t.data.dtype) for t in reader.tensors}
    return Layout("" if arch is None else str(arch.contents()), fields, tensors)


def layout(path: Path) -> Layout:
    """The :class:`Layout` of the GGUF ``path``, read once per file version."""
    st = path.stat()
    return _layout(path.resolve(), (st.st_size, st.st_mtime_ns))


class _Copy:
    """The faulty copy's bytes (a writable memmap) seen through the source's :class:`Layout`."""

    def __init__(self, where: Layout, path: Path) -> None:
        self.layout, self.bytes = where, np.memmap(path, dtype=np.uint8, mode="r+")

    def scalar(self, key: str) -> np.ndarray:
        """A one-element view of field ``key``'s value."""
        self.layout.value(key)
        offset, dtype, _ = self.layout.fields[key]
        return self.bytes[offset:offset + dtype.itemsize].view(dtype)

    def tensor(self, name: str) -> np.ndarray:
        """A view of tensor ``name``'s data (float32 only: a quantized tensor's rows are blocks)."""
        if name not in self.layout.tensors:
            raise _Missing(f"no tensor {name!r}")
        offset, shape, dtype = self.layout.tensors[name]
        if dtype != np.float32:
            raise _Missing(f"tensor {name!r} is stored as {dtype}, not F32: its rows are quantized blocks")
        return self.bytes[offset:offset + 4 * int(np.prod(shape))].view(np.float32).reshape(shape)


def _set_scalar(copy: _Copy, key: str, value: Callable[[float], float]) -> dict[str, Any]:
    """``key``'s scalar set in place to ``value(old)`` (the value's own dtype, as ``gguf_set_metadata.py``
    sets one)."""
    view = copy.scalar(key)
    before = float(view[0])
    view[0] = value(before)
    return {"field": key, "before": before, "after": float(view[0])}


def _rope_base(copy: _Copy, layer: int) -> dict[str, Any]:
    key = f"{copy.layout.arch}.rope.freq_base"
    if float(copy.layout.value(key)) == DEFAULT_ROPE_BASE:
        raise _Missing(f"field {key!r} is {DEFAULT_ROPE_BASE:g} already; the fault would change nothing")
    return _set_scalar(copy, key, lambda _old: DEFAULT_ROPE_BASE)


def _rms_eps(copy: _Copy, layer: int) -> dict[str, Any]:
    return _set_scalar(copy, f"{copy.layout.arch}.attention.layer_norm_rms_epsilon", lambda old: old * EPS_FACTOR)


def unpermute(rows: np.ndarray, n_head: int) -> np.ndarray:
    """The inverse of ``convert_hf_to_gguf.py``'s ``LlamaModel.permute`` (``[n_out, n_in]`` rows of q or
    k, ``n_head`` heads: each head's ``[2, head_dim / 2]`` halves interleaved into pairs): the rows back
    in transformers' half-split order."""
    out, cols = rows.shape[0], rows.shape[1:]
    return rows.reshape(n_head, out // n_head // 2, 2, *cols).swapaxes(1, 2).reshape(rows.shape)


def _k_rows(copy: _Copy, layer: int) -> dict[str, Any]:
    name = f"blk.{layer}.attn_k.weight"
    heads = int(copy.layout.value(f"{copy.layout.arch}.attention.head_count_kv"))
    data = copy.tensor(name)
    before = np.array(data)
    data[...] = unpermute(before, heads)
    return {"tensor": name, "heads": heads, "rows_moved": int(np.any(data != before, axis=1).sum())}


#: Every GGUF fault kind, name -> kind (module docstring).
GGUF_FAULTS: dict[str, GgufFault] = {f.name: f for f in (
    GgufFault("k_rows_unpermuted", "one layer's attn_k rows left in transformers' order (no q/k permute)",
              "attention", True, _k_rows),
    GgufFault("rope_base_10000", f"rope.freq_base {DEFAULT_ROPE_BASE:,.0f}", "attention", False, _rope_base),
    GgufFault("rms_eps_tenth", f"RMSNorm epsilon x{EPS_FACTOR:g}", "attention norm", False, _rms_eps),
)}


def fault_of(name: str) -> GgufFault:
    """The kind ``name``.

    Raises:
        OracleError: an unknown name (the known ones listed).
    """
    if name not in GGUF_FAULTS:
        raise OracleError(f"unknown GGUF fault {name!r}; known: {', '.join(GGUF_FAULTS)}")
    return GGUF_FAULTS[name]


def write_faulty_gguf(src: Path, dest: Path, name: str, layer: int | None = None) -> dict[str, Any]:
    """Copy the GGUF ``src`` to ``dest`` with fault ``name`` injected (at ``layer``: default the middle
    layer, ``n_layer // 2``, for a layered kind); returns the record of it (kind, title, what changed,
    the stage and block bisect must name, the layer count). ``dest`` appears complete or not at all.

    Raises:
        OracleError: ``dest`` exists, an unknown kind, a layer out of range, or a GGUF without the
            field or tensor the kind changes (file and field named).
    """
    fault = fault_of(name)
    if dest.exists():
        raise OracleError(f"{dest}: exists; a faulty GGUF is never written over a file")
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with open(fd, "wb") as out, open(src, "rb") as inp:
            shutil.copyfileobj(inp, out, 1 << 24)
        try:
            where = layout(src)
            n_layer = int(where.value(f"{where.arch}.block_count"))
            at = n_layer // 2 if layer is None else layer
            if not 0 <= at < n_layer:
                raise _Missing(f"layer {at} is not one of its {n_layer} layers ({where.arch}.block_count)")
            copy = _Copy(where, tmp)
            changed = fault.inject(copy, at)
            copy.bytes.flush()
            del copy
        except _Missing as exc:
            raise OracleError(f"{src}: {exc}") from None
        tmp.rename(dest)
    finally:
        tmp.unlink(missing_ok=True)
    return {"kind": name, "title": fault.title, "changed": changed, "stage": fault.stage(at), "block": fault.block,
            "layer": at if fault.layered else None, "n_layer": n_layer, "from": src.name}


def write_fault_pin(artifact: Pin, root: Path, name: str, pins_dir: Path, snapshots: Path, *,
                    layer: int | None = None, pin_name: str | None = None) -> Path:
    """A faulty copy of GGUF pin ``artifact``'s snapshot (``root``, verified by the caller) under
    ``snapshots/<pin name>/`` (the GGUF with fault ``name``: :func:`write_faulty_gguf`; the other files
    copied) and its pin file ``pins_dir/<pin name>.json``: the artifact's pin file with source
    ``local:<folder>``, every digest recomputed, no conversion recipe, and ``fault`` the fault's record.
    The pin name defaults to ``<artifact>-<fault>``. Returns the pin file's path.

    Raises:
        OracleError: the snapshot folder or pin file exists, the pin pins no single ``.gguf``, or as
            :func:`write_faulty_gguf`.
    """
    from oracles.pins.digests import file_digests

    ggufs = [f for f in artifact.files if f.endswith(".gguf")]
    if len(ggufs) != 1:
        raise OracleError(f"{artifact.path}: field 'files' pins {len(ggufs)} .gguf files; a GGUF fault needs one")
    pin_name = pin_name or f"{artifact.name}-{name}"
    folder, pin_file = snapshots / pin_name, pins_dir / f"{pin_name}.json"
    if folder.exists() or pin_file.exists():
        raise OracleError(f"{folder if folder.exists() else pin_file}: exists; a fault pin is never written over one")
    folder.mkdir(parents=True)
    for rel in artifact.files:
        if rel not in ggufs:
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(root / rel, folder / rel)
    record = write_faulty_gguf(root / ggufs[0], folder / ggufs[0], name, layer)
    doc = json.loads(artifact.path.read_text())
    for key in ("recipe", "source_sha256"):  # the conversion made the faithful file, not this one
        doc.pop(key, None)
    digests = file_digests(folder, sorted(artifact.files))
    doc.update(name=pin_name, source=f"local:{folder.resolve()}", fault=record,
               files={k: {"bytes": d.bytes, "sha256": d.sha256} for k, d in digests.items()})
    pins_dir.mkdir(parents=True, exist_ok=True)
    with open(pin_file, "x") as out:
        out.write(json.dumps(doc, indent=2) + "\n")
    return pin_file


__all__ = ["GGUF_FAULTS", "GgufFault", "fault_of", "unpermute", "write_fault_pin", "write_faulty_gguf"]
