"""What an ``.onnx`` offers, read from its graph and held against the pin, without ONNX Runtime.

The graph is read with the ``onnx`` package (``onnx.load(..., load_external_data=False)``: the
protobuf alone, the weights left in their external-data files), so a truncated file, an external-data
file that is missing or shorter than its tensors need, and inputs this engine cannot feed are each
refused in one line naming the file and the field, before a runtime is started. :func:`read_layout`
takes the inputs and outputs as plain :class:`Io` values (the ``onnx`` package's or an
``InferenceSession``'s), so its checks are tested without either.

The layout this engine serves is the decoder-with-past export (:mod:`oracles.pins.onnx_export` makes
it; optimum and transformers.js exports name their tensors the same way)::

    inputs:  input_ids int64 [batch, seq]
             past_key_values.<i>.key / .value float32 [batch, H_kv, past, Dh]   for every layer i
             (optional) attention_mask int64 [batch, past + seq], position_ids int64 [batch, seq]
    outputs: logits float32 [batch, seq, V], hidden float32 [batch, seq, D],
             present.<i>.key / .value float32 [batch, H_kv, past + seq, Dh]

``hidden`` (the final norm's output the head reads) is required: the engine contract's ``Step.hidden``
is that tensor, and a graph that outputs logits alone is refused saying how to export one that does.

Pure at import: ``onnx`` is imported inside :func:`read_graph`.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from oracles.errors import PinError

PAST = re.compile(r"past_key_values\.(\d+)\.(key|value)")
PRESENT = re.compile(r"present\.(\d+)\.(key|value)")
#: Inputs a decoder-with-past export may add, which this engine fills (ones; the positions after the cache).
OPTIONAL_INPUTS = ("attention_mask", "position_ids")
#: ONNX tensor element types by name (``onnx.TensorProto.DataType``) -> numpy dtype names.
ONNX_DTYPES = {"FLOAT": "float32", "FLOAT16": "float16", "BFLOAT16": "bfloat16", "DOUBLE": "float64",
               "INT64": "int64", "INT32": "int32", "INT8": "int8", "UINT8": "uint8", "BOOL": "bool"}
#: The operators ``onnxruntime.quantization.quantize_dynamic`` writes: int8 weights, and activations
#: quantized to uint8 per tensor with a scale computed at run time.
DYNAMIC_QUANT_OPS = ("DynamicQuantizeLinear", "MatMulInteger", "DynamicQuantizeMatMul")


@dataclass(frozen=True)
class Io:
    """One graph input or output: ``name``, numpy ``dtype`` name, ``shape`` (an int per fixed axis, the
    axis' symbol or None per dynamic one)."""

    name: str
    dtype: str
    shape: tuple[int | str | None, ...]


@dataclass(frozen=True)
class OnnxLayout:
    """The tensors of a decoder-with-past ``.onnx``.

    past / present: per layer, the (key, value) input and output names; kv_heads ``H_kv`` and head_dim
    ``Dh`` of the cache; vocab ``V`` (the logits' width); hidden_size ``D``; ids_dtype: ``input_ids``'
    integer dtype; attention_mask / position_ids: True where the graph takes that optional input.
    """

    past: tuple[tuple[str, str], ...]
    present: tuple[tuple[str, str], ...]
    kv_heads: int
    head_dim: int
    vocab: int
    hidden_size: int
    ids_dtype: str = "int64"
    attention_mask: bool = False
    position_ids: bool = False

    @property
    def num_layers(self) -> int:
        return len(self.past)


@dataclass(frozen=True)
class Graph:
    """What :func:`read_graph` reads from an ``.onnx`` (no weights loaded).

    inputs / outputs: the graph's; opset: the default domain's opset; producer: ``"name version"``;
    ops: operator counts; initializers: element counts by numpy dtype; external: external-data file
    (relative to the ``.onnx``) -> the bytes its tensors need (largest offset + length).
    """

    inputs: tuple[Io, ...]
    outputs: tuple[Io, ...]
    opset: int
    producer: str
    ops: dict[str, int] = field(default_factory=dict)
    initializers: dict[str, int] = field(default_factory=dict)
    external: dict[str, int] = field(default_factory=dict)


def read_graph(path: Path) -> Graph:
    """The graph of ``path`` read by the ``onnx`` package, its external data left on disk.

    Raises:
        PinError: ``path`` is missing, or is not a parseable ONNX model (a truncated file, say; its size
            and the parser's message named).
    """
    import onnx

    if not path.is_file():
        raise PinError(f"{path}: field 'files' names an .onnx that does not exist")
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError on a cut file, or what onnx raises on another
        raise PinError(f"{path}: not a loadable .onnx ({path.stat().st_size} bytes; truncated?): "
                       f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
    graph = model.graph
    external: dict[str, int] = {}
    initializers: Counter[str] = Counter()
    for tensor in graph.initializer:
        count = 1
        for d in tensor.dims:
            count *= int(d)
        initializers[_dtype(onnx.TensorProto.DataType.Name(tensor.data_type))] += count
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            entry = {e.key: e.value for e in tensor.external_data}
            end = int(entry.get("offset", 0)) + int(entry.get("length", 0))
            where = entry.get("location", "")
            external[where] = max(external.get(where, 0), end)
    opset = next((int(o.version) for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
    return Graph(inputs=tuple(_io(v) for v in graph.input), outputs=tuple(_io(v) for v in graph.output), opset=opset,
                 producer=f"{model.producer_name} {model.producer_version}".strip(),
                 ops=dict(Counter(n.op_type for n in graph.node)), initializers=dict(initializers), external=external)


def _io(value: Any) -> Io:
    """An ``onnx.ValueInfoProto`` as :class:`Io`."""
    import onnx

    kind = value.type.tensor_type
    shape = tuple(int(d.dim_value) if d.HasField("dim_value") else (d.dim_param or None) for d in kind.shape.dim)
    return Io(value.name, _dtype(onnx.TensorProto.DataType.Name(kind.elem_type)), shape)


def _dtype(onnx_name: str) -> str:
    return ONNX_DTYPES.get(onnx_name, onnx_name.lower())


def check_external(path: Path, graph: Graph) -> dict[str, int]:
    """Each external-data file the graph names, beside ``path``, and its size (what the pin records).

    The location is held inside the ``.onnx``'s folder by its name alone (relative, no ``..`` out of it),
    not by where it resolves: a pin's snapshot holds a user's ``.onnx`` and its data file as symbolic links
    to their folder (:mod:`oracles.pins.onnx_artifact`), which ONNX Runtime loads as it loads the files.

    Raises:
        PinError: a file missing, outside the ``.onnx``'s folder, or shorter than its tensors need
            (the ``.onnx``, the file and both sizes named).
    """
    sizes = {}
    for name, need in sorted(graph.external.items()):
        rel = Path(os.path.normpath(name)) if name else Path("..")
        if not rel.parts or rel.is_absolute() or rel.parts[0] == "..":
            raise PinError(f"{path}: field 'initializer.external_data.location' is {name!r}, not a file beside the .onnx")
        where = path.parent / rel
        if not where.is_file():
            raise PinError(f"{path}: external-data file {name} is missing (its tensors need {need} bytes); keep it "
                           "beside the .onnx, as the exporter wrote it")
        size = where.stat().st_size
        if size < need:
            raise PinError(f"{path}: external-data file {name} holds {size} bytes but its tensors need {need} (truncated)")
        sizes[name] = size
    return sizes


def precision_of(graph: Graph) -> dict[str, str]:
    """``{"weights", "compute"}`` of the graph: ``int8`` / ``dynamic_uint8`` where it carries
    ``quantize_dynamic``'s operators (:data:`DYNAMIC_QUANT_OPS`), the floating dtype holding the most
    initializer elements otherwise (``float32`` for a float32 export)."""
    if any(graph.ops.get(op) for op in DYNAMIC_QUANT_OPS):
        return {"weights": "int8", "compute": "dynamic_uint8"}
    floats = {k: v for k, v in graph.initializers.items() if k in ("float32", "float16", "bfloat16")}
    dtype = max(sorted(floats), key=lambda k: floats[k]) if floats else "float32"
    return {"weights": dtype, "compute": dtype}


def read_layout(path: Path, inputs: Sequence[Io], outputs: Sequence[Io]) -> OnnxLayout:
    """The decoder-with-past layout of ``path`` from its inputs and outputs (module docstring).

    Raises:
        PinError: an input this engine cannot feed (neither ``input_ids``, a ``past_key_values.<i>.<key|value>``
            nor an optional one), no ``input_ids``, layers whose past or present is incomplete, or no
            ``logits`` / ``hidden`` output; one line naming the file and the tensor.
    """
    ins, outs = {io.name: io for io in inputs}, {io.name: io for io in outputs}
    for io in inputs:
        if io.name != "input_ids" and io.name not in OPTIONAL_INPUTS and not PAST.fullmatch(io.name):
            raise PinError(f"{path}: input {io.name!r} is not one this engine feeds (input_ids, past_key_values.<i>.key"
                           f"/.value, {', '.join(OPTIONAL_INPUTS)}): a decoder-with-past export is what it runs")
    if "input_ids" not in ins:
        raise PinError(f"{path}: inputs {sorted(ins)} have no 'input_ids': not a decoder-with-past export")
    past, present = _pairs(path, "input", PAST, ins), _pairs(path, "output", PRESENT, outs)
    if len(past) != len(present):
        raise PinError(f"{path}: {len(past)} layers of past_key_values inputs but {len(present)} of present outputs")
    for name in ("logits", "hidden"):
        if name not in outs:
            why = (" (the final norm's output the head reads, which the engine contract returns: export with "
                   "oracles.pins.onnx_export)") if name == "hidden" else ""
            raise PinError(f"{path}: output {name!r} is missing{why}; outputs: {sorted(outs)}")
    kv = ins[past[0][0]].shape
    fixed = [d for d in (*kv[1:2], *kv[3:4], *outs["logits"].shape[-1:], *outs["hidden"].shape[-1:]) if isinstance(d, int)]
    if len(kv) != 4 or len(fixed) != 4:
        raise PinError(f"{path}: input {past[0][0]} shape {list(kv)} / logits {list(outs['logits'].shape)} / hidden "
                       f"{list(outs['hidden'].shape)}: the heads, head size, vocabulary and hidden size must be fixed axes")
    heads, head_dim, vocab, width = fixed
    return OnnxLayout(past=past, present=present, kv_heads=heads, head_dim=head_dim, vocab=vocab,
                      hidden_size=width, ids_dtype=ins["input_ids"].dtype, attention_mask="attention_mask" in ins,
                      position_ids="position_ids" in ins)


def _pairs(path: Path, side: str, pattern: re.Pattern[str], tensors: dict[str, Io]) -> tuple[tuple[str, str], ...]:
    """Per layer ``0..L-1``, its (key, value) tensor names among ``tensors``.

    Raises:
        PinError: no layer at all, or a layer missing its key or value (the name it needs).
    """
    found = {(int(m.group(1)), m.group(2)): name for name in tensors if (m := pattern.fullmatch(name))}
    layers = 1 + max((i for i, _ in found), default=-1)
    prefix = "past_key_values" if side == "input" else "present"
    if not layers:
        raise PinError(f"{path}: no {prefix}.<i>.key/.value {side}s: the cache is not exported (a decoder-with-past "
                       "export takes past_key_values inputs and returns present outputs)")
    for i in range(layers):
        for kv in ("key", "value"):
            if (i, kv) not in found:
                raise PinError(f"{path}: {side} '{prefix}.{i}.{kv}' is missing (layers 0..{layers - 1} seen)")
    return tuple((found[i, "key"], found[i, "value"]) for i in range(layers))


def check_model(path: Path, layout: OnnxLayout, config: dict[str, Any], tokenizer_len: int) -> None:
    """Hold the layout against the pin's ``config.json`` and its tokenizer.

    Raises:
        PinError: layers, KV heads, head size or hidden size differ from the config, or the vocabulary
            is narrower than the tokenizer (both values named).
    """
    heads = int(config.get("num_attention_heads", 0) or 0)
    want = {"num_hidden_layers": layout.num_layers, "num_key_value_heads": layout.kv_heads,
            "head_dim": layout.head_dim, "hidden_size": layout.hidden_size, "vocab_size": layout.vocab}
    given = {**config, "head_dim": config.get("head_dim") or (int(config["hidden_size"]) // heads if heads else None)}
    for key, got in want.items():
        if given.get(key) is not None and int(given[key]) != got:
            raise PinError(f"{path}: the graph has {key} {got} but config.json field {key!r} is {given[key]}")
    if tokenizer_len > layout.vocab:
        raise PinError(f"{path}: logits width {layout.vocab} is narrower than the tokenizer's {tokenizer_len} ids")


def onnx_facts(path: Path) -> dict[str, Any]:
    """What ``oracles pin --from FILE.onnx`` records of ``path``, read without ONNX Runtime.

    Returns ``{"inputs": {name: {"dtype", "shape"}}, "outputs": {...}, "opset", "producer",
    "vocab_size": V | None, "num_layers": L | None, "precision": {"weights", "compute"},
    "external_data": {file: bytes}, "layout_error": None | the line :func:`read_layout` refuses it with}``
    (the shape's dynamic axes as their symbols).

    Raises:
        PinError: the file is missing or not a parseable ONNX model, or an external-data file is missing
            or truncated (:func:`read_graph`, :func:`check_external`).
    """
    graph = read_graph(path)
    sizes = check_external(path, graph)
    try:
        layout: OnnxLayout | None = read_layout(path, graph.inputs, graph.outputs)
        error = None
    except PinError as exc:
        layout, error = None, str(exc)
    logits = next((io for io in graph.outputs if io.name == "logits"), None)
    vocab = logits.shape[-1] if logits is not None and logits.shape and isinstance(logits.shape[-1], int) else None
    return {"inputs": {io.name: {"dtype": io.dtype, "shape": list(io.shape)} for io in graph.inputs},
            "outputs": {io.name: {"dtype": io.dtype, "shape": list(io.shape)} for io in graph.outputs},
            "opset": graph.opset, "producer": graph.producer, "vocab_size": vocab,
            "num_layers": layout.num_layers if layout else None, "precision": precision_of(graph),
            "external_data": sizes, "layout_error": error}
