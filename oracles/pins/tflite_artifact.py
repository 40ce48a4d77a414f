"""A user's ``.tflite`` as an artifact kind (:mod:`oracles.pins.artifact_kinds`): its facts, read before it is pinned.

The file is read without the interpreter (:func:`oracles.engines.litert.artifact.read_file`): its
signatures must be a layout the ``litert`` engine serves, with the ``hidden`` output the engine contract
returns (:func:`oracles.engines.litert.artifact.read_layout`), else it is refused in one line naming the
file and the signature field. The logits' width, the hidden width and (a generative export) the KV
layers are held to the reference's config; the tokenizer is the reference pin's (a ``.tflite`` carries
none), copied beside it with ``config.json`` and ``generation_config.json``, as the built-in conversions
carry theirs.

The precision, from its constant tensors' types and quantization (each buffer counted once):

- mostly float32: ``float32`` weights, ``float32`` compute;
- mostly float16 (litert's float16 weights, each read through a ``DEQUANTIZE`` to float32): ``float16``
  weights, ``float32`` compute;
- mostly integers with quantization scales (dynamic-range quantization: int8 or int4 weights, the
  activations quantized to int8 per row when a product runs, XNNPACK's ``qd8`` kernels): ``int8`` /
  ``int4`` weights, ``dynamic_int8`` compute.

Neither reduced form has a reference here that holds its weights, so pairing it with a float32 pin is
refused when it is used (:func:`oracles.pins.pairing.judgment_of`).
"""

from __future__ import annotations

from pathlib import Path

from oracles.errors import PinError
from oracles.pins.artifact_kinds import ArtifactFacts
from oracles.pins.precision import Precision

#: The engine that loads a ``.tflite``.
ENGINE = "litert"
#: The reference's files a ``.tflite`` pin's snapshot carries (what the LiteRT engine reads beside it).
COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "special_tokens_map.json")
#: A constant tensor type (as :func:`oracles.engines.litert.artifact.read_file` names it) -> (weights, compute).
WEIGHT_TYPES = {"float32": ("float32", "float32"), "float16": ("float16", "float32"), "bfloat16": ("bfloat16", "float32"),
                "int8 quantized": ("int8", "dynamic_int8"), "int4 quantized": ("int4", "dynamic_int8")}


def tflite_precision(path: Path, constants: dict[str, int]) -> Precision:
    """The precision of the ``.tflite`` at ``path`` from its constants' element counts by type (module docstring).

    Raises:
        PinError: the type holding the most weight elements is none of :data:`WEIGHT_TYPES` (file and types named).
    """
    weights = {k: v for k, v in constants.items() if k.startswith(("float", "bfloat")) or k.endswith(" quantized")}
    if not weights:
        raise PinError(f"{path}: field 'buffers' holds no float or quantized constant tensor (found "
                       f"{', '.join(sorted(constants)) or 'none'}): no weights to read a precision from")
    dominant = max(sorted(weights), key=lambda k: weights[k])
    if dominant not in WEIGHT_TYPES:
        raise PinError(f"{path}: field 'buffers': its weights are mostly {dominant} ({weights[dominant]} elements), a "
                       f"type oracles pin does not know the compute of ({', '.join(WEIGHT_TYPES)})")
    return Precision(*WEIGHT_TYPES[dominant])


def read_facts(path: Path) -> ArtifactFacts:
    """The facts of the ``.tflite`` at ``path`` (module docstring).

    Raises:
        PinError: not a ``.tflite``, truncated, signatures no family can use, no ``hidden`` output, or a
            precision not known here; one line naming the file and the field.
    """
    from oracles.engines.litert.artifact import PlainLayout, read_file, read_layout

    contents = read_file(path)
    layout = read_layout(path, contents.details)
    signature = layout.signature if isinstance(layout, PlainLayout) else layout.prefill
    if layout.hidden is None:
        raise PinError(f"{path}: field 'signatures.{signature}.outputs.hidden' is missing; the engine contract returns "
                       "the final norm's hidden state (convert with a litert-convert pin, which outputs it)")
    layers = None if isinstance(layout, PlainLayout) else layout.num_layers
    return ArtifactFacts(
        path=path, kind="tflite", architecture=None, vocab_size=layout.vocab, hidden_size=layout.hidden,
        num_layers=layers, precision=tflite_precision(path, contents.constants), extra=layout,
        fields={"vocab_size": f"signatures.{signature}.outputs.logits", "hidden_size": f"signatures.{signature}.outputs.hidden",
                "num_layers": f"signatures.{signature}.inputs"})


def read_precision(path: Path) -> Precision:
    """The precision of the ``.tflite`` at ``path`` (module docstring), read without the interpreter.

    Raises:
        PinError: not a readable ``.tflite``, or weights of a type not known here.
    """
    from oracles.engines.litert.artifact import read_file

    return tflite_precision(path, read_file(path).constants)


def check_reference(facts: ArtifactFacts, reference_root: Path) -> None:
    """The logits must be at least as wide as the reference's tokenizer (its sizes against config.json are
    :func:`oracles.pins.artifacts.check_sizes`'s).

    Raises:
        PinError: the reference's tokenizer.json has more ids than the logits have columns (file, field, both).
    """
    from oracles.pins.gguf_file import pin_vocabulary

    tokens = len(pin_vocabulary(reference_root / "tokenizer.json"))
    if facts.vocab_size is not None and facts.vocab_size < tokens:
        raise PinError(f"{facts.path}: field '{facts.fields['vocab_size']}' width {facts.vocab_size} is narrower than the "
                       f"reference's tokenizer ({tokens} ids in {reference_root / 'tokenizer.json'})")
