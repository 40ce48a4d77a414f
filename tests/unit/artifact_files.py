"""Tiny artifact files for the tests of ``oracles pin --from FILE``: a GGUF llama.cpp loads the vocabulary of,
a ``.tflite`` with a plain graph's signature, an ``.onnx`` decoder with past, and the reference snapshot
they are held against.

The GGUF is written with the ``gguf`` package (architecture, hyperparameters, a six-token BPE vocabulary,
one matrix); the ``.tflite`` with ai-edge-litert's generated flatbuffer schema (its object API), one
subgraph whose signature takes ``input_ids`` int32 ``[1, 4]`` and gives ``logits`` / ``hidden``, and one
constant tensor whose type sets the file's precision. The ``.onnx`` is written with the ``onnx`` package's
helpers: the tensors of a decoder-with-past export (``input_ids``, ``past_key_values.<i>.key/.value`` in;
``logits``, ``hidden``, ``present.<i>.*`` out) and one ``[VOCAB, hidden]`` initializer, kept in an
external-data file beside it. None has an operator: they are read, never run.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np

#: The vocabulary of the tiny reference and of the GGUF that matches it (byte-level BPE strings).
TOKENS = ["<|endoftext|>", "a", "b", "Ċ", "Ġ", "Ġa"]
VOCAB, HIDDEN, LAYERS, SEQ = len(TOKENS), 8, 1, 4


def reference_snapshot(root: Path, hidden: int = HIDDEN) -> Path:
    """A model snapshot folder: config.json (vocab, hidden, layers), one float32 safetensors tensor, a BPE
    tokenizer.json of :data:`TOKENS`, tokenizer_config.json and generation_config.json."""
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "vocab_size": VOCAB,
                                                  "hidden_size": hidden, "num_hidden_layers": LAYERS}))
    header = json.dumps({"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(header)) + header + struct.pack("<2f", 1.0, 2.0))
    (root / "tokenizer.json").write_text(json.dumps({"model": {"type": "BPE", "vocab": {t: i for i, t in enumerate(TOKENS)},
                                                               "merges": ["Ġ a"]}, "added_tokens": []}))
    (root / "tokenizer_config.json").write_text(json.dumps({"eos_token": TOKENS[0]}))
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": 0}))
    return root


def tiny_gguf(path: Path, tokens: list[str] | None = None, arch: str = "llama", hidden: int = HIDDEN,
              quantize: str | None = None) -> Path:
    """A GGUF llama.cpp reads the vocabulary of: ``arch``, one block, ``hidden`` wide, :data:`TOKENS` (or
    ``tokens``) with one merge, one ``[VOCAB, hidden]`` ``token_embd`` matrix (float32, or the ggml type
    ``quantize`` names, quantized by the gguf package: ``hidden`` a multiple of 32) and the matching
    ``general.file_type``."""
    import gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    kind = gguf.GGMLQuantizationType[quantize] if quantize else gguf.GGMLQuantizationType.F32
    file_type = gguf.LlamaFileType[f"MOSTLY_{quantize}"] if quantize else gguf.LlamaFileType.ALL_F32
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_file_type(int(file_type))
    writer.add_block_count(LAYERS)
    writer.add_embedding_length(hidden)
    writer.add_context_length(64)
    writer.add_feed_forward_length(2 * hidden)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(tokens or TOKENS)
    writer.add_token_merges(["Ġ a"])
    matrix = np.linspace(-1, 1, VOCAB * hidden, dtype=np.float32).reshape(VOCAB, hidden)
    if quantize:  # rows of whole blocks: hidden a multiple of 32
        writer.add_tensor("token_embd.weight", gguf.quants.quantize(matrix, kind), raw_dtype=kind)
    else:
        writer.add_tensor("token_embd.weight", matrix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_tflite(path: Path, outputs: tuple[str, ...] = ("logits", "hidden"), weights: str = "FLOAT32",
                hidden: int = HIDDEN, signatures: bool = True) -> Path:
    """A ``.tflite`` with one plain-graph signature (module docstring): ``outputs`` among logits / hidden,
    one ``[VOCAB, hidden]`` constant of tflite type ``weights`` (``INT8`` with a quantization scale), and
    no signature at all when ``signatures`` is False."""
    import flatbuffers  # type: ignore[import-untyped]  # ships no types
    from ai_edge_litert import schema_py_generated as schema

    types = schema.TensorType
    kind = getattr(types, weights)

    def tensor(name: str, shape: tuple[int, ...], ttype: int, buffer: int = 0, scale: float | None = None) -> Any:
        t = schema.TensorT()
        t.name, t.shape, t.type, t.buffer = name, list(shape), ttype, buffer
        if scale is not None:
            t.quantization = schema.QuantizationParametersT()
            t.quantization.scale, t.quantization.zeroPoint = [scale], [0]
        return t

    def named(name: str, index: int) -> Any:
        m = schema.TensorMapT()
        m.name, m.tensorIndex = name, index
        return m

    graph = schema.SubGraphT()
    graph.tensors = [tensor("ids", (1, SEQ), types.INT32), tensor("logits", (1, SEQ, VOCAB), types.FLOAT32),
                     tensor("hidden", (1, SEQ, hidden), types.FLOAT32),
                     tensor("w", (VOCAB, hidden), kind, 1, 0.05 if weights == "INT8" else None)]
    graph.inputs, graph.outputs, graph.operators = [0], [1, 2], []
    data = schema.BufferT()
    data.data = np.arange(VOCAB * hidden * {"FLOAT32": 4, "FLOAT16": 2, "INT8": 1}[weights], dtype=np.uint8)
    model = schema.ModelT()
    model.version, model.subgraphs, model.buffers = 3, [graph], [schema.BufferT(), data]
    if signatures:
        sig = schema.SignatureDefT()
        sig.signatureKey, sig.subgraphIndex = "serving_default", 0
        sig.inputs = [named("input_ids", 0)]
        sig.outputs = [named(n, {"logits": 1, "hidden": 2}[n]) for n in outputs]
        model.signatureDefs = [sig]
    builder = flatbuffers.Builder(1024)
    builder.Finish(model.Pack(builder), file_identifier=b"TFL3")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(builder.Output()))
    return path


def tiny_onnx(path: Path, inputs: tuple[str, ...] = ("input_ids",), hidden: int = HIDDEN, outputs: bool = True,
              external: str | None = "model.onnx.data") -> Path:
    """An ``.onnx`` laid out as a decoder-with-past export of :data:`LAYERS` layers (2 KV heads of 4, vocab
    :data:`VOCAB`, ``hidden`` wide; module docstring): ``inputs`` before the cache's (``input_ids``; another
    name makes a graph the engine cannot feed), the ``hidden`` output only when ``outputs``, and its float32
    initializer in the external-data file ``external`` beside it (None: inside the ``.onnx``)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    kv = [f"{i}.{part}" for i in range(LAYERS) for part in ("key", "value")]
    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, [1, "seq"]) for n in inputs]
    ins += [helper.make_tensor_value_info(f"past_key_values.{n}", TensorProto.FLOAT, [1, 2, "past", 4]) for n in kv]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, "seq", VOCAB])]
    outs += [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, "seq", hidden])] if outputs else []
    outs += [helper.make_tensor_value_info(f"present.{n}", TensorProto.FLOAT, [1, 2, "total", 4]) for n in kv]
    weight = numpy_helper.from_array(np.linspace(-1, 1, VOCAB * hidden, dtype=np.float32).reshape(VOCAB, hidden), "w")
    model = helper.make_model(helper.make_graph([], "decoder", ins, outs, [weight]),
                              opset_imports=[helper.make_opsetid("", 18)])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(model, str(path), save_as_external_data=external is not None, location=external or "",
                    size_threshold=0)
    return path
