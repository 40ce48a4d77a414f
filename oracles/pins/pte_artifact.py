"""A user's ``.pte`` as an artifact kind (:mod:`oracles.pins.artifact_kinds`): its facts, read before it is pinned.

The program is read without ExecuTorch's runtime (:func:`oracles.engines.executorch.artifact.read_pte`):
it must have the ``forward(input_ids, cache_position)`` of optimum-executorch's text-generation export and
an output that carries the final norm's hidden state after the logits (``[1, S, V + D]``, what an
``executorch-convert`` pin writes), else it is refused in one line naming the file and the field. Its
vocabulary (``get_vocab_size``), hidden width (the output's width less it) and layers (``get_n_layers``)
are held to the reference's config; the tokenizer is the reference pin's (a ``.pte`` carries none), copied
beside it with ``config.json`` and ``generation_config.json``.

The precision is what the XNNPACK delegates' values are
(:func:`oracles.engines.executorch.artifact.precision_of`): ``int4`` or ``int8`` weights where the graphs
hold quantized weight values, ``dynamic_int8`` compute where activations are quantized per token at run
time (``qdint8``), else the program's dtype. A quantized program has no reference here that holds its
weights, so pairing it with a float32 pin is refused when it is used (:func:`oracles.pins.pairing.judgment_of`).
"""

from __future__ import annotations

from pathlib import Path

from oracles.errors import PinError
from oracles.pins.artifact_kinds import ArtifactFacts
from oracles.pins.precision import Precision

#: The engine that loads a ``.pte``.
ENGINE = "executorch"
#: The reference's files a ``.pte`` pin's snapshot carries (what the ExecuTorch engine reads beside it).
COMPANIONS = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
              "special_tokens_map.json")


def read_facts(path: Path) -> ArtifactFacts:
    """The facts of the ``.pte`` at ``path`` (module docstring).

    Raises:
        PinError: not an ExecuTorch program, truncated, no ``forward`` of the export's form, no
            ``get_vocab_size`` / ``get_max_seq_len``, or a logits-only output; one line naming the file and
            the field.
    """
    from oracles.engines.executorch.artifact import check_pte, precision_of, read_pte

    facts = read_pte(path)
    vocab, hidden = check_pte(facts, {}, 0)
    if not hidden:
        raise PinError(f"{path}: field 'forward.outputs[0]' is logits [1, S, {vocab}] only; the engine contract returns "
                       "the final norm's hidden state too (convert with an executorch-convert pin, which outputs it)")
    layers = facts.constants.get("get_n_layers")
    return ArtifactFacts(path=path, kind="pte", architecture=None, vocab_size=vocab, hidden_size=hidden,
                         num_layers=layers if isinstance(layers, int) else None, precision=precision_of(facts), extra=facts,
                         fields={"vocab_size": "get_vocab_size", "hidden_size": "forward.outputs[0].sizes",
                                 "num_layers": "get_n_layers"})


def read_precision(path: Path) -> Precision:
    """The precision of the ``.pte`` at ``path`` (module docstring), read without the runtime.

    Raises:
        PinError: not a whole ExecuTorch program.
    """
    from oracles.engines.executorch.artifact import precision_of, read_pte

    return precision_of(read_pte(path))


def check_reference(facts: ArtifactFacts, reference_root: Path) -> None:
    """The logits must be at least as wide as the reference's tokenizer (its sizes against config.json are
    :func:`oracles.pins.artifacts.check_sizes`'s).

    Raises:
        PinError: the reference's tokenizer.json has more ids than ``get_vocab_size`` (file, field, both).
    """
    from oracles.pins.gguf_file import pin_vocabulary

    tokens = len(pin_vocabulary(reference_root / "tokenizer.json"))
    if facts.vocab_size is not None and facts.vocab_size < tokens:
        raise PinError(f"{facts.path}: field 'get_vocab_size' {facts.vocab_size} is narrower than the reference's "
                       f"tokenizer ({tokens} ids in {reference_root / 'tokenizer.json'})")
