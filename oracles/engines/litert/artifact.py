"""What a ``.tflite`` offers, read from its signatures and held against the pin, without the runtime.

:func:`read_layout` takes the signature details as plain data (``{signature: {"inputs" | "outputs":
{tensor: (shape, dtype name)}}}``, what :func:`signature_details` reads from an interpreter), so the
checks of a bad artifact are tested without ai-edge-litert. This adapter serves two layouts, both made
by :mod:`oracles.pins.litert_script`:

* litert-torch's *generative* export (:class:`Layout`): a ``prefill_<T>`` signature and a ``decode``
  signature, each with inputs ``tokens`` int32 ``[1, T]`` (``[1, 1]``), ``input_pos`` int32 ``[T]``
  (``[1]``) and one ``kv_cache_k_<i>`` / ``kv_cache_v_<i>`` float32 ``[1, R, H, Dh]`` per layer (``R``
  KV rows), and outputs ``logits`` float32 ``[1, T, V]``, ``hidden`` float32 ``[1, T, D]`` and the
  updated caches;
* a *plain* graph (:class:`PlainLayout`), what ``litert_torch.convert`` makes of a model called on one
  fixed-length batch of ids: one signature, one input int32 ``[1, T]`` (the token ids), outputs
  ``logits`` float32 ``[1, T, V]`` and ``hidden`` float32 ``[1, T, D]``; no cache.

Either way the ``hidden`` output is required: the engine contract's ``Step.hidden`` is the final norm's
output the head reads, and a graph that does not output it cannot be held to it (a graph exported with
logits only is refused in one line saying how to convert one that does).

:func:`read_file` reads the same details from the file itself, without the interpreter: the flatbuffer
through ai-edge-litert's generated schema module (``schema_py_generated``, pure Python over
``flatbuffers``), with the element count of its constant tensors per type, so ``oracles pin --from
FILE.tflite`` can refuse a file and read its precision before anything loads it.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracles.errors import PinError

#: Signature -> {"inputs": {tensor: (shape, dtype)}, "outputs": {...}}.
Details = dict[str, dict[str, dict[str, tuple[tuple[int, ...], str]]]]
#: The flatbuffer's file identifier (bytes 4..8 of a ``.tflite``, tflite's schema.fbs ``file_identifier``).
IDENTIFIER = b"TFL3"
PREFILL = re.compile(r"prefill_(\d+)")
DECODE = "decode"


@dataclass(frozen=True)
class Layout:
    """The signatures of a generative ``.tflite``.

    prefill: the prefill signature's name; prefill_len: its ``T``; decode: the decode signature's name,
    or None when the artifact has none; kv_names: the cache tensors in layer order (``k_0, v_0, k_1,
    ...``); kv_shape: ``[1, R, H, Dh]``; vocab: ``V`` (the logits' width); hidden: ``D``, or None when
    the artifact does not output the hidden state.
    """

    prefill: str
    prefill_len: int
    decode: str | None
    kv_names: tuple[str, ...]
    kv_shape: tuple[int, ...]
    vocab: int
    hidden: int | None

    @property
    def kv_rows(self) -> int:
        """``R``, the positions the cache holds."""
        return self.kv_shape[1]

    @property
    def num_layers(self) -> int:
        return len(self.kv_names) // 2


@dataclass(frozen=True)
class PlainLayout:
    """The one signature of a plain ``.tflite``.

    signature: its name (``serving_default`` as litert-torch writes it); input: its one input tensor's
    name (``input_ids`` in the built-in conversions); seq_len: ``T``, the fixed number of positions a call
    runs; vocab: ``V``; hidden: ``D``. ``decode`` is None: a plain graph has no cache to continue.
    """

    signature: str
    input: str
    seq_len: int
    vocab: int
    hidden: int
    decode: None = None


def signature_details(interpreter: Any) -> Details:
    """The signature details of an ``ai_edge_litert.interpreter.Interpreter`` as plain data."""
    out: Details = {}
    for name in interpreter.get_signature_list():
        runner = interpreter.get_signature_runner(name)
        out[name] = {side: {t: (tuple(int(n) for n in d["shape"]), getattr(d["dtype"], "__name__", str(d["dtype"])))
                            for t, d in getter().items()}
                     for side, getter in (("inputs", runner.get_input_details), ("outputs", runner.get_output_details))}
    return out


@dataclass(frozen=True)
class FileContents:
    """What :func:`read_file` reads from a ``.tflite``: its signature ``details`` (as
    :func:`signature_details`), and ``constants``: elements of its constant tensors (each buffer once) by
    dtype name, ``"int8 quantized"`` etc. for an integer tensor with quantization scales."""

    details: Details
    constants: dict[str, int]


def read_file(path: Path) -> FileContents:
    """The signatures and constant tensors of the ``.tflite`` at ``path``, read without the interpreter
    (module docstring); the file is memory-mapped, its tensor data not copied.

    Raises:
        PinError: ai-edge-litert is not installed, the file is not a ``.tflite`` (its identifier named), or
            it is truncated (a table or a buffer past its end); one line naming the file.
    """
    import mmap

    try:
        from ai_edge_litert import schema_py_generated as schema
    except ImportError as exc:
        raise PinError(f"{path}: reading a .tflite needs ai-edge-litert's schema ({exc}; pip install "
                       "'pytest-oracles[litert]')") from None
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8 or head[4:8] != IDENTIFIER:
            raise PinError(f"{path}: not a .tflite: bytes 4..8 are {head[4:8]!r}, not the identifier {IDENTIFIER!r}")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            try:
                return _contents(schema, schema.Model.GetRootAs(data, 0), size)
            except (struct.error, IndexError, ValueError, TypeError, UnicodeDecodeError) as exc:
                raise PinError(f"{path}: truncated or damaged: its flatbuffer cannot be read in its {size} bytes "
                               f"({type(exc).__name__}: {exc})") from None


def _contents(schema: Any, model: Any, size: int) -> FileContents:
    """:class:`FileContents` of a parsed ``Model`` table (``size``: the file's bytes, for external buffers)."""
    names = {v: k.lower() for k, v in vars(schema.TensorType).items() if not k.startswith("_")}
    details: Details = {}
    for i in range(model.SignatureDefsLength()):
        sig = model.SignatureDefs(i)
        graph = model.Subgraphs(sig.SubgraphIndex())

        def tensors(n: int, get: Any, graph: Any = graph) -> dict[str, tuple[tuple[int, ...], str]]:
            out = {}
            for j in range(n):
                entry = get(j)
                t = graph.Tensors(entry.TensorIndex())
                shape = tuple(int(d) for d in t.ShapeAsNumpy()) if t.ShapeLength() else ()
                out[entry.Name().decode()] = (shape, names.get(t.Type(), f"type {t.Type()}"))
            return out

        details[sig.SignatureKey().decode()] = {"inputs": tensors(sig.InputsLength(), sig.Inputs),
                                                "outputs": tensors(sig.OutputsLength(), sig.Outputs)}
    constants: dict[str, int] = {}
    seen: set[int] = set()
    for g in range(model.SubgraphsLength()):
        graph = model.Subgraphs(g)
        for k in range(graph.TensorsLength()):
            t = graph.Tensors(k)
            b = t.Buffer()
            if b == 0 or b in seen or not _holds_data(model.Buffers(b), size):
                continue
            seen.add(b)
            quant = t.Quantization()
            name = names.get(t.Type(), f"type {t.Type()}")
            if quant is not None and quant.ScaleLength() and not name.startswith(("float", "bfloat")):
                name += " quantized"
            elements = 1
            for d in (t.ShapeAsNumpy() if t.ShapeLength() else ()):
                elements *= int(d)
            constants[name] = constants.get(name, 0) + elements
    return FileContents(details, constants)


def _holds_data(buffer: Any, size: int) -> bool:
    """Whether a ``Buffer`` table holds data: inline (its ``data`` vector, read through so a vector past the
    file's end raises) or after the flatbuffer (``offset`` / ``size`` within the file's ``size`` bytes).

    Raises:
        ValueError: the buffer's data runs past the end of the file.
    """
    if buffer.Offset() > 1:
        if buffer.Offset() + buffer.Size() > size:
            raise ValueError(f"a buffer's data ends at byte {buffer.Offset() + buffer.Size()}")
        return bool(buffer.Size())
    n = buffer.DataLength()
    if n:
        view = buffer.DataAsNumpy()
        if len(view) != n:
            raise ValueError(f"a buffer of {n} bytes holds {len(view)}")
    return bool(n)


def read_layout(path: Path, details: Details) -> Layout | PlainLayout:
    """The layout of the ``.tflite`` at ``path`` from its signature ``details``: the generative export's
    (:class:`Layout`) where a ``prefill_<T>`` signature is present, else a plain graph's (:func:`read_plain`).

    Raises:
        PinError: neither layout: a generative signature without ``tokens`` / ``input_pos`` / ``logits``
            / the cache tensors, shapes that disagree between signatures, or (no ``prefill_<T>``) what
            :func:`read_plain` refuses; one line naming the file and the field
            (``signatures.<name>.<inputs|outputs>.<tensor>``).
    """
    prefills = sorted(n for n in details if PREFILL.fullmatch(n))
    if not prefills:
        return read_plain(path, details)
    prefill = prefills[0]
    kv_names = _kv_names(path, prefill, details[prefill]["inputs"])
    kv_shape = details[prefill]["inputs"][kv_names[0]][0]
    if len(kv_shape) != 4 or kv_shape[0] != 1:
        raise PinError(f"{path}: field 'signatures.{prefill}.inputs.{kv_names[0]}' has shape {list(kv_shape)}; "
                       "expected [1, R, H, Dh]")
    t = int(PREFILL.fullmatch(prefill).group(1))  # type: ignore[union-attr]
    vocab, hidden = _check(path, prefill, details[prefill], t, kv_names, kv_shape)
    decode = DECODE if DECODE in details else None
    if decode is not None:
        _check(path, decode, details[decode], 1, kv_names, kv_shape, vocab, hidden)
    return Layout(prefill, t, decode, kv_names, kv_shape, vocab, hidden)


def read_plain(path: Path, details: Details) -> PlainLayout:
    """The :class:`PlainLayout` of a ``.tflite`` with one signature and no cache.

    Raises:
        PinError: more or fewer than one signature, more than one input or one that is not int32
            ``[1, T]``, or ``logits`` / ``hidden`` missing or shaped other than ``[1, T, V]`` /
            ``[1, T, D]`` float32; one line naming the file and the field.
    """
    if len(details) != 1:
        raise PinError(f"{path}: field 'signatures' has no prefill_<T> signature and {len(details)} signatures "
                       f"(found {sorted(details)}); this engine serves litert-torch's generative export (prefill_<T> "
                       "and decode over a KV cache) or a plain graph (one signature: ids in, logits and hidden out)")
    (name, sig), = details.items()
    inputs = sig["inputs"]
    if len(inputs) != 1:
        raise PinError(f"{path}: field 'signatures.{name}.inputs' is {sorted(inputs)}; a plain graph takes one int32 "
                       "[1, T] tensor of token ids (a generative export names its prefill signature prefill_<T>)")
    (tensor, (shape, dtype)), = inputs.items()
    if len(shape) != 2 or shape[0] != 1 or dtype != "int32":
        raise PinError(f"{path}: field 'signatures.{name}.inputs.{tensor}' is {dtype} {list(shape)}; expected int32 [1, T]")
    t = int(shape[1])
    logits = sig["outputs"].get("logits")
    if logits is None or len(logits[0]) != 3:
        raise PinError(f"{path}: field 'signatures.{name}.outputs.logits' is {logits!r}; expected float32 [1, {t}, V] "
                       f"(found outputs {sorted(sig['outputs'])})")
    _expect(path, f"signatures.{name}.outputs.logits", logits, (1, t, logits[0][2]), "float32")
    hidden = sig["outputs"].get("hidden")
    if hidden is None or len(hidden[0]) != 3:
        raise PinError(f"{path}: field 'signatures.{name}.outputs.hidden' is {hidden!r}; the engine contract returns the "
                       f"final norm's hidden state float32 [1, {t}, D] (convert with a litert-convert pin, "
                       "recipe.arguments.export 'plain', which outputs it)")
    _expect(path, f"signatures.{name}.outputs.hidden", hidden, (1, t, hidden[0][2]), "float32")
    return PlainLayout(name, tensor, t, int(logits[0][2]), int(hidden[0][2]))


def _kv_names(path: Path, signature: str, inputs: dict[str, tuple[tuple[int, ...], str]]) -> tuple[str, ...]:
    layers = sorted(int(m.group(1)) for n in inputs if (m := re.fullmatch(r"kv_cache_k_(\d+)", n)))
    if not layers or layers != list(range(len(layers))):
        raise PinError(f"{path}: field 'signatures.{signature}.inputs' has no kv_cache_k_0..kv_cache_k_<L-1> tensors "
                       f"(found {sorted(inputs)})")
    names = tuple(f"kv_cache_{kv}_{i}" for i in layers for kv in ("k", "v"))
    if missing := [n for n in names if n not in inputs]:
        raise PinError(f"{path}: field 'signatures.{signature}.inputs.{missing[0]}' is missing")
    return names


def _check(path: Path, name: str, sig: dict[str, dict[str, tuple[tuple[int, ...], str]]], t: int,
           kv_names: tuple[str, ...], kv_shape: tuple[int, ...], vocab: int | None = None,
           hidden: int | None = None) -> tuple[int, int | None]:
    """Check one signature's tensors; its (V, D or None)."""
    want_in = {"tokens": ((1, t), "int32"), "input_pos": ((t,), "int32"),
               **{k: (kv_shape, "float32") for k in kv_names}}
    for tensor, (shape, dtype) in want_in.items():
        _expect(path, f"signatures.{name}.inputs.{tensor}", sig["inputs"].get(tensor), shape, dtype)
    for k in kv_names:
        _expect(path, f"signatures.{name}.outputs.{k}", sig["outputs"].get(k), kv_shape, "float32")
    logits = sig["outputs"].get("logits")
    if logits is None or len(logits[0]) != 3:
        raise PinError(f"{path}: field 'signatures.{name}.outputs.logits' is {logits!r}; expected float32 [1, {t}, V] "
                       "(a prefill exported without output_logits_on_prefill has no logits)")
    v = vocab if vocab is not None else logits[0][2]
    _expect(path, f"signatures.{name}.outputs.logits", logits, (1, t, v), "float32")
    out = sig["outputs"].get("hidden")
    d = hidden if hidden is not None else (out[0][2] if out is not None and len(out[0]) == 3 else None)
    if d is not None or out is not None:
        _expect(path, f"signatures.{name}.outputs.hidden", out, (1, t, d or 0), "float32")
    return v, d


def _expect(path: Path, field: str, got: tuple[tuple[int, ...], str] | None, shape: tuple[int, ...], dtype: str) -> None:
    if got is None:
        raise PinError(f"{path}: field '{field}' is missing; expected {dtype} {list(shape)}")
    if tuple(got[0]) != tuple(shape) or got[1] != dtype:
        raise PinError(f"{path}: field '{field}' is {got[1]} {list(got[0])}; expected {dtype} {list(shape)}")


def check_model(path: Path, layout: Layout | PlainLayout, config: dict[str, Any], tokenizer_size: int) -> None:
    """Hold the artifact's sizes to the pin's ``config.json`` and tokenizer.

    Raises:
        PinError: the logits' width differs from ``vocab_size`` or is narrower than the tokenizer
            (``tokenizer_size`` ids), the hidden width from ``hidden_size``, or (a generative export)
            the cache's layers from ``num_hidden_layers``; one line naming the file, the field and both values.
    """
    config_path = path.with_name("config.json")
    signature = layout.signature if isinstance(layout, PlainLayout) else layout.prefill
    width = f"{path}: field 'signatures.{signature}.outputs.logits' width {layout.vocab}"
    if layout.vocab != int(config.get("vocab_size", -1)):
        raise PinError(f"{width} differs from {config_path} vocab_size {config.get('vocab_size')}")
    if layout.vocab < tokenizer_size:
        raise PinError(f"{width} is narrower than the pin's tokenizer ({tokenizer_size} ids)")
    if layout.hidden is not None and layout.hidden != int(config.get("hidden_size", -1)):
        raise PinError(f"{path}: field 'signatures.{signature}.outputs.hidden' width {layout.hidden} differs from "
                       f"{config_path} hidden_size {config.get('hidden_size')}")
    if isinstance(layout, PlainLayout):
        return
    if layout.num_layers != int(config.get("num_hidden_layers", -1)):
        raise PinError(f"{path}: field 'signatures.{layout.prefill}.inputs' has {layout.num_layers} KV layers but "
                       f"{config_path} num_hidden_layers is {config.get('num_hidden_layers')}")
