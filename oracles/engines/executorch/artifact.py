"""A ``.pte`` program's facts read from its bytes, without the runtime: methods, the forward's inputs and
output, the constant methods' values, back ends, operators, named mutable buffers, truncation.

The layout is ExecuTorch's (``executorch/schema/program.fbs`` and ``extended_header.h``, as executorch
1.5.1 writes them): a flatbuffer whose file identifier is ``ET12``, followed at byte 8 by the extended
header ``eh00`` (header length u32, program size u64, segment base offset u64, segment data size u64,
little-endian), the segments (delegate blobs, constant data) after the flatbuffer. The flatbuffer is read
with the ``flatbuffers`` package's table reader, field by field at the schema's slots; nothing of
ExecuTorch is imported, so ``oracles pin`` and the engine's load checks cost milliseconds.

A program made by ``optimum-cli export executorch --task text-generation`` has a ``forward(input_ids
[1, S] int64, cache_position [S] int64)`` and constant methods (``get_vocab_size``, ``get_max_seq_len``,
``get_n_layers``, ...): the metadata optimum-executorch records. Its forward returns logits ``[1, S, V]``;
the built-in conversion (:mod:`oracles.pins.executorch_script`) returns ``[1, S, V + D]``, the final
norm's output in the last ``D`` columns.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from oracles.errors import PinError

if TYPE_CHECKING:
    from oracles.pins.precision import Precision

#: The flatbuffer file identifier of an ExecuTorch program (bytes 4-8).
FILE_ID = b"ET12"
#: The extended header's magic (bytes 8-12).
HEADER_MAGIC = b"eh00"
#: ExecuTorch's ScalarType codes (``executorch/schema/scalar_type.fbs``) of the dtypes read here.
SCALAR_TYPES = {0: "uint8", 1: "int8", 2: "int16", 3: "int32", 4: "int64", 5: "float16", 6: "float32",
                7: "float64", 11: "bool", 15: "bfloat16"}
#: The union ``KernelTypes``' member codes of an EValue (``program.fbs``, in order from 1).
_NULL, _INT, _BOOL, _DOUBLE, _TENSOR, _STRING = 1, 2, 3, 4, 5, 6
#: XNNPACK's value datatypes (``backends/xnnpack/serialization/runtime_schema.fbs``, ``XNNDatatype``): what a
#: delegated graph's tensors hold (``qdint8``: activations quantized per token at run time; ``qbint4``:
#: 4-bit weights with blockwise scales; ``qcint8`` / ``qcint4``: per-channel scales).
XNN_DATATYPES = {1: "fp32", 2: "fp16", 3: "qint8", 4: "quint8", 5: "qint32", 6: "qcint8", 7: "qcint32", 8: "qcint4",
                 9: "qdint8", 10: "qbint4", 11: "qpint8", 12: "int32", 13: "pfp32", 14: "bf16"}


@dataclass(frozen=True)
class TensorFacts:
    """One tensor EValue: ``dtype`` (a :data:`SCALAR_TYPES` name, or ``"code N"``), ``sizes`` (the upper
    bounds of a dynamic shape), ``name`` (a named mutable buffer's fully qualified name, else None)."""

    dtype: str
    sizes: tuple[int, ...]
    name: str | None = None


@dataclass(frozen=True)
class PteFacts:
    """What a ``.pte`` says of itself (module docstring). ``constants``: each constant method's one output
    (int, float or bool); ``inputs`` / ``outputs``: the forward's tensors; ``backends``: the delegates'
    ids; ``operators``: ``name.overload`` of the kernels run outside any delegate; ``buffers``: the forward's
    named mutable buffers (empty unless exported with ``emit_mutable_buffer_names``)."""

    path: Path
    file_bytes: int
    program_bytes: int
    segments_end: int
    methods: tuple[str, ...]
    constants: dict[str, Any] = field(default_factory=dict)
    inputs: tuple[TensorFacts, ...] = ()
    outputs: tuple[TensorFacts, ...] = ()
    backends: tuple[str, ...] = ()
    operators: tuple[str, ...] = ()
    buffers: tuple[TensorFacts, ...] = ()
    xnnpack_datatypes: dict[str, int] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        """The facts a pin or a receipt records (JSON-safe)."""
        def tensors(ts: tuple[TensorFacts, ...]) -> list[dict[str, Any]]:
            return [{"dtype": t.dtype, "sizes": list(t.sizes), **({"name": t.name} if t.name else {})} for t in ts]

        return {"file": self.path.name, "bytes": self.file_bytes, "methods": list(self.methods),
                "constants": dict(self.constants), "forward_inputs": tensors(self.inputs),
                "forward_outputs": tensors(self.outputs), "backends": list(self.backends),
                "operators": list(self.operators), "named_buffers": [t.name for t in self.buffers],
                "xnnpack_datatypes": dict(self.xnnpack_datatypes)}


def read_pte(path: Path) -> PteFacts:
    """The facts of the ``.pte`` at ``path``.

    Raises:
        PinError: one line naming the file and the field: not an ExecuTorch program (file identifier), an
            extended header missing or malformed, the file shorter than its flatbuffer or its segments
            (truncated: both sizes named), or a flatbuffer whose offsets leave the file.
    """
    if not path.is_file():
        raise PinError(f"{path}: field 'files' names a .pte that does not exist")
    data = path.read_bytes()
    if len(data) < 40 or data[4:8] != FILE_ID:
        raise PinError(f"{path}: not an ExecuTorch program: bytes 4-8 are {data[4:8]!r}, not the file identifier "
                       f"{FILE_ID!r} ({len(data)} bytes)")
    if data[8:12] != HEADER_MAGIC:
        raise PinError(f"{path}: field 'extended_header' missing: bytes 8-12 are {data[8:12]!r}, not {HEADER_MAGIC!r}")
    length, program, base = struct.unpack_from("<IQQ", data, 12)
    segment_bytes = struct.unpack_from("<Q", data, 32)[0] if length >= 32 else 0
    end = base + segment_bytes if base else program
    if len(data) < max(program, end):
        what = "flatbuffer" if len(data) < program else "segments"
        raise PinError(f"{path}: truncated: its {what} end at byte {max(program, end) if what == 'segments' else program}"
                       f" but the file has {len(data)} bytes")
    try:
        return _facts(path, data, program, base, end)
    except (struct.error, IndexError, UnicodeDecodeError) as exc:
        raise PinError(f"{path}: field 'program' is not a readable ExecuTorch flatbuffer ({exc})") from None


class _Table:
    """A flatbuffer table at ``pos`` of ``buf`` (the schema's field ``slot`` at vtable entry ``4 + 2 slot``)."""

    def __init__(self, buf: bytearray, pos: int) -> None:
        from flatbuffers.table import Table  # type: ignore[import-untyped]  # ships no types

        self.buf, self.t = buf, Table(buf, pos)

    def _off(self, slot: int) -> int:
        return int(self.t.Offset(4 + 2 * slot))

    def scalar(self, slot: int, fmt: str, default: Any = 0) -> Any:
        o = self._off(slot)
        return struct.unpack_from("<" + fmt, self.buf, self.t.Pos + o)[0] if o else default

    def string(self, slot: int) -> str | None:
        o = self._off(slot)
        return bytes(self.t.String(self.t.Pos + o)).decode("utf-8") if o else None

    def table(self, slot: int) -> "_Table | None":
        o = self._off(slot)
        return _Table(self.buf, self.t.Indirect(self.t.Pos + o)) if o else None

    def tables(self, slot: int) -> list["_Table"]:
        o = self._off(slot)
        if not o:
            return []
        start, n = self.t.Vector(o), self.t.VectorLen(o)
        return [_Table(self.buf, self.t.Indirect(start + 4 * i)) for i in range(n)]

    def scalars(self, slot: int, fmt: str) -> list[Any]:
        o = self._off(slot)
        n = self.t.VectorLen(o) if o else 0
        return list(struct.unpack_from(f"<{n}{fmt}", self.buf, self.t.Vector(o))) if n else []


def _facts(path: Path, data: bytes, program_bytes: int, base: int, segments_end: int) -> PteFacts:
    """Walk Program -> ExecutionPlan -> EValue (``program.fbs`` slots: Program.execution_plan 1;
    ExecutionPlan name 0, values 2, inputs 3, outputs 4, operators 6, delegates 7; EValue val_type 0, val 1)."""
    buf = bytearray(data[:program_bytes])
    root = _Table(buf, struct.unpack_from("<I", buf, 0)[0])
    plans = {str(p.string(0)): p for p in root.tables(1)}
    constants: dict[str, Any] = {}
    for name, plan in plans.items():
        if name != "forward" and not plan.scalars(3, "i"):
            outs = plan.scalars(4, "i")
            if len(outs) == 1:
                constants[name] = _value(plan.tables(2)[outs[0]])
    facts = PteFacts(path=path, file_bytes=len(data), program_bytes=program_bytes, segments_end=segments_end,
                     methods=tuple(sorted(plans)), constants=constants)
    forward = plans.get("forward")
    if forward is None:
        return facts
    values = forward.tables(2)
    tensors = [_tensor(v) for v in values]
    inputs = tuple(t for i in forward.scalars(3, "i") if (t := tensors[i]) is not None)
    outputs = tuple(t for i in forward.scalars(4, "i") if (t := tensors[i]) is not None)
    operators = tuple(sorted({f"{op.string(0)}.{op.string(1) or 'default'}" for op in forward.tables(6)}))
    backends = tuple(sorted({str(d.string(0)) for d in forward.tables(7)}))
    buffers = tuple(t for t in tensors if t is not None and t.name)
    segments = [(s.scalar(0, "Q"), s.scalar(1, "Q")) for s in root.tables(4)]
    datatypes: dict[str, int] = {}
    for delegate in forward.tables(7):
        ref = delegate.table(1)
        if delegate.string(0) == "XnnpackBackend" and ref is not None and ref.scalar(0, "b") == 1:  # SEGMENT
            offset, size = segments[ref.scalar(1, "I")]
            for name, n in _xnn_datatypes(data[base + offset: base + offset + size]).items():
                datatypes[name] = datatypes.get(name, 0) + n
    return PteFacts(path=path, file_bytes=len(data), program_bytes=program_bytes, segments_end=segments_end,
                    methods=facts.methods, constants=constants, inputs=inputs, outputs=outputs, backends=backends,
                    operators=operators, buffers=buffers, xnnpack_datatypes=dict(sorted(datatypes.items())))


def _xnn_datatypes(blob: bytes) -> dict[str, int]:
    """How many values of each XNNPACK datatype one delegate's graph holds: its header ``XH00`` (bytes 4-8;
    the flatbuffer's offset u32 at 10, size u32 at 14), then ``XNNGraph.xvalues`` (slot 2), each an XValue
    union (slot 0 type, slot 1 value: 1 XNNTensorValue, datatype slot 0 int16; 2 XNNQuantizedTensorValue,
    its XNNTensorValue at slot 0). A blob without the header is counted as nothing."""
    if blob[4:8] != b"XH00":
        return {}
    offset, size = struct.unpack_from("<II", blob, 10)
    graph = _Table(bytearray(blob[offset: offset + size]), struct.unpack_from("<I", blob, offset)[0])
    counts: dict[str, int] = {}
    for value in graph.tables(2):
        kind, inner = value.scalar(0, "B"), value.table(1)
        tensor = inner.table(0) if kind == 2 and inner is not None else inner if kind == 1 else None
        if tensor is not None:
            code = tensor.scalar(0, "h")
            name = XNN_DATATYPES.get(code, f"code {code}")
            counts[name] = counts.get(name, 0) + 1
    return counts


def _value(evalue: _Table) -> Any:
    """An EValue's Int, Bool, Double or String value (None for another kind)."""
    kind, val = evalue.scalar(0, "B"), evalue.table(1)
    if val is None:
        return None
    return {_INT: lambda: val.scalar(0, "q"), _BOOL: lambda: bool(val.scalar(0, "B")),
            _DOUBLE: lambda: val.scalar(0, "d", 0.0), _STRING: lambda: val.string(0)}.get(kind, lambda: None)()


def _tensor(evalue: _Table) -> TensorFacts | None:
    """An EValue's Tensor (Tensor slots: scalar_type 0, sizes 2, extra_tensor_info 9; ExtraTensorInfo
    fully_qualified_name 1), else None."""
    if evalue.scalar(0, "B") != _TENSOR or (t := evalue.table(1)) is None:
        return None
    code = t.scalar(0, "b")
    extra = t.table(9)
    return TensorFacts(SCALAR_TYPES.get(code, f"code {code}"), tuple(t.scalars(2, "i")), extra.string(1) if extra else None)


def check_pte(facts: PteFacts, config: dict[str, Any], tokenizer_size: int) -> tuple[int, int]:
    """Hold a program's facts to what the engine runs and to the snapshot's config.json; returns ``(V, D)``:
    the vocabulary and, where the forward's output is ``[1, S, V + D]``, the hidden width (0 for a
    logits-only ``[1, S, V]``).

    Raises:
        PinError: one line naming the file and the field: no ``forward`` method (the methods named);
            a forward whose inputs are not ``input_ids [1, S]`` and ``cache_position [S]`` int64, or whose
            one output is not float32 ``[1, S, W]``; no ``get_vocab_size`` / ``get_max_seq_len``; a
            vocabulary other than config.json's ``vocab_size`` or narrower than the tokenizer; an output
            width other than ``V`` or ``V + hidden_size``; a layer count other than config.json's.
    """
    where = facts.path
    if "forward" not in facts.methods:
        raise PinError(f"{where}: field 'execution_plan' has no method 'forward' (methods: {', '.join(facts.methods)})")
    shapes = [(t.dtype, len(t.sizes)) for t in facts.inputs]
    if shapes != [("int64", 2), ("int64", 1)]:
        raise PinError(f"{where}: field 'forward.inputs' is {[(t.dtype, list(t.sizes)) for t in facts.inputs]}, not "
                       "input_ids int64 [1, S] and cache_position int64 [S] (optimum-executorch's text-generation export)")
    if len(facts.outputs) != 1 or facts.outputs[0].dtype != "float32" or len(facts.outputs[0].sizes) != 3:
        raise PinError(f"{where}: field 'forward.outputs' is {[(t.dtype, list(t.sizes)) for t in facts.outputs]}, "
                       "not one float32 [1, S, W]")
    for name in ("get_vocab_size", "get_max_seq_len"):
        if not isinstance(facts.constants.get(name), int):
            raise PinError(f"{where}: field 'execution_plan.{name}' is missing: the constant methods say the "
                           "program's vocabulary and cache rows")
    vocab, width = int(facts.constants["get_vocab_size"]), int(facts.outputs[0].sizes[-1])
    if vocab != int(config.get("vocab_size", vocab)) or vocab < tokenizer_size:
        raise PinError(f"{where}: field 'get_vocab_size' is {vocab} but config.json's vocab_size is "
                       f"{config.get('vocab_size')} and the tokenizer has {tokenizer_size} tokens")
    hidden = width - vocab
    if hidden < 0 or ("hidden_size" in config and hidden not in (0, int(config["hidden_size"]))):
        raise PinError(f"{where}: field 'forward.outputs[0].sizes' is {list(facts.outputs[0].sizes)}: width {width} is "
                       f"neither get_vocab_size {vocab} nor it plus config.json's hidden_size {config.get('hidden_size')}")
    layers = facts.constants.get("get_n_layers")
    if isinstance(layers, int) and layers != int(config.get("num_hidden_layers", layers)):
        raise PinError(f"{where}: field 'get_n_layers' is {layers} but config.json's num_hidden_layers is "
                       f"{config.get('num_hidden_layers')}")
    return vocab, hidden


def pte_pin_facts(path: Path) -> dict[str, Any]:
    """What ``oracles pin --from FILE.pte`` records of a user's program, read without the runtime:
    methods, vocabulary, cache rows, layers, dtype, back ends, the forward's shapes, whether its output
    carries the hidden state, and ``quantization``: what the XNNPACK delegates' values are
    (:func:`quantization_of`). Bit widths and group sizes are not read (they are in each value's quant
    params); a pin's ``precision`` needs them declared.

    Raises:
        PinError: as :func:`read_pte` (not a program, truncated).
    """
    facts = read_pte(path)
    c = facts.constants
    width = facts.outputs[0].sizes[-1] if facts.outputs and facts.outputs[0].sizes else None
    vocab = c.get("get_vocab_size")
    dtype = SCALAR_TYPES.get(c["get_dtype"], f"code {c['get_dtype']}") if isinstance(c.get("get_dtype"), int) else None
    return {**facts.as_json(), "vocab_size": vocab, "max_seq_len": c.get("get_max_seq_len"),
            "num_layers": c.get("get_n_layers"), "dtype": dtype,
            "hidden_output": (width - vocab) if isinstance(width, int) and isinstance(vocab, int) and width > vocab else None,
            "quantization": quantization_of(facts)}


def precision_of(facts: PteFacts) -> "Precision":
    """A program's precision from its XNNPACK delegates' values (:data:`XNN_DATATYPES`): weights ``int4``
    (``qbint4`` / ``qcint4`` values) or ``int8`` (``qcint8`` / ``qint8``), else the program's dtype
    (``get_dtype``, float32 when absent); compute ``dynamic_int8`` where activations are quantized per token
    at run time (``qdint8``: XNNPACK's qd8 kernels), else that dtype."""
    from oracles.pins.precision import Precision

    code = facts.constants.get("get_dtype")
    dtype = SCALAR_TYPES.get(code, "float32") if isinstance(code, int) else "float32"
    kinds = facts.xnnpack_datatypes
    weights = "int4" if {"qbint4", "qcint4"} & set(kinds) else "int8" if {"qcint8", "qint8"} & set(kinds) else dtype
    return Precision(weights, "dynamic_int8" if "qdint8" in kinds else dtype)


def quantization_of(facts: PteFacts) -> dict[str, Any]:
    """``{"weights", "activations"}`` as the XNNPACK delegates' datatypes say: weights ``"int4 blockwise"``
    (``qbint4``), ``"int4 per-channel"`` (``qcint4``), ``"int8 per-channel"`` (``qcint8``), ``"int8"``
    (``qint8``), else ``"float"``; activations ``"int8 dynamic"`` where a ``qdint8`` value exists, else
    ``"float"``. None for a program with no XNNPACK delegate read."""
    kinds = facts.xnnpack_datatypes
    if not kinds:
        return {"weights": None, "activations": None}
    names = (("qbint4", "int4 blockwise"), ("qcint4", "int4 per-channel"), ("qcint8", "int8 per-channel"), ("qint8", "int8"))
    weights = [label for key, label in names if key in kinds] or ["float"]
    return {"weights": ", ".join(weights), "activations": "int8 dynamic" if "qdint8" in kinds else "float"}
