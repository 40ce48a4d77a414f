"""A user's ``.onnx`` as an artifact kind (:mod:`oracles.pins.artifact_kinds`): its facts, read before it is pinned.

The graph is read with the ``onnx`` package, its weights left on disk and no runtime started
(:func:`oracles.engines.onnx.artifact.onnx_facts`): a truncated file, an external-data file that is
missing or shorter than its tensors need, and inputs other than ``input_ids`` + ``past_key_values.*``
(or a graph without the ``hidden`` output the engine contract returns) are each refused in one line
naming the file and the field. The logits' width, the hidden width and the layers are held to the
reference's config, and the cache's heads and head size and the tokenizer's width as the ``onnxruntime``
engine holds them when it loads (:func:`oracles.engines.onnx.artifact.check_model`).

An export's weights are usually in an external-data file beside the graph (``model.onnx.data``, named
by the graph's initializers): :func:`side_files` names it, so the pin's snapshot links it beside the
``.onnx`` (ONNX Runtime reads it relative to the ``.onnx`` it loads) and every session verifies its
digest. The tokenizer is the reference pin's (an ``.onnx`` carries none), copied beside it with
``config.json`` and ``generation_config.json``.

The precision is :func:`oracles.engines.onnx.artifact.precision_of`'s: ``int8`` weights and
``dynamic_uint8`` compute where the graph holds ``quantize_dynamic``'s operators, else the floating dtype
holding the most initializer elements. A quantized graph has no reference here that holds its weights,
so pairing it with a float32 pin is refused when it is used (:func:`oracles.pins.pairing.judgment_of`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from oracles.errors import PinError
from oracles.pins.artifact_kinds import ArtifactFacts
from oracles.pins.precision import Precision

#: The engine that loads an ``.onnx``.
ENGINE = "onnxruntime"
#: The reference's files an ``.onnx`` pin's snapshot carries (what the ONNX Runtime engine reads beside it).
COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "special_tokens_map.json")


def read_facts(path: Path) -> ArtifactFacts:
    """The facts of the ``.onnx`` at ``path`` (module docstring); ``extra`` holds ``(onnx_facts, layout)``.

    Raises:
        PinError: missing, truncated or not an ONNX model, an external-data file missing, outside the
            ``.onnx``'s folder or short, inputs this engine cannot feed, or no ``logits`` / ``hidden`` /
            ``present`` outputs of fixed widths; one line naming the file and the field.
    """
    from oracles.engines.onnx.artifact import Io, onnx_facts, read_layout

    facts = onnx_facts(path)
    if facts["layout_error"]:
        raise PinError(facts["layout_error"])

    def ios(side: str) -> list[Io]:
        return [Io(name, io["dtype"], tuple(io["shape"])) for name, io in facts[side].items()]

    layout = read_layout(path, ios("inputs"), ios("outputs"))
    return ArtifactFacts(path=path, kind="onnx", architecture=None, vocab_size=layout.vocab,
                         hidden_size=layout.hidden_size, num_layers=layout.num_layers,
                         precision=Precision(facts["precision"]["weights"], facts["precision"]["compute"]),
                         extra=(facts, layout),
                         fields={"vocab_size": "outputs.logits.shape[-1]", "hidden_size": "outputs.hidden.shape[-1]",
                                 "num_layers": "inputs.past_key_values.<i>"})


def side_files(path: Path) -> list[str]:
    """The external-data files the graph at ``path`` names (relative to its folder), in order.

    Raises:
        PinError: as :func:`oracles.engines.onnx.artifact.onnx_facts` (the file unreadable, a data file
            missing or short).
    """
    from oracles.engines.onnx.artifact import onnx_facts

    return sorted(onnx_facts(path)["external_data"])


def read_precision(path: Path) -> Precision:
    """The precision of the ``.onnx`` at ``path`` (module docstring), read from its graph alone.

    Raises:
        PinError: the file is missing or not a parseable ONNX model.
    """
    from oracles.engines.onnx.artifact import precision_of, read_graph

    found = precision_of(read_graph(path))
    return Precision(found["weights"], found["compute"])


def check_reference(facts: ArtifactFacts, reference_root: Path) -> None:
    """The cache's KV heads and head size against the reference's ``config.json`` and the logits at least
    as wide as its tokenizer (its vocabulary, hidden width and layers are
    :func:`oracles.pins.artifacts.check_sizes`'s).

    Raises:
        PinError: a size other than config.json's, or logits narrower than the reference's tokenizer.json
            (the file, the size and both values named).
    """
    from oracles.engines.onnx.artifact import check_model
    from oracles.pins.gguf_file import pin_vocabulary

    config: Any = json.loads((reference_root / "config.json").read_text(encoding="utf-8"))
    config = config.get("text_config", config) if isinstance(config, dict) else {}
    _, layout = facts.extra
    check_model(facts.path, layout, config, len(pin_vocabulary(reference_root / "tokenizer.json")))
