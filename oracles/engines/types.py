"""What crosses the engine boundary: prompts, steps, samplers, generations, and the refusals
(:class:`Unsupported`); numpy only. :mod:`oracles.engines.base` re-exports every name here."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

import numpy as np

from oracles.errors import OracleError


class Unsupported(NotImplementedError):
    """An engine lacks a capability a check needs; the plugin reports the test as skipped with
    ``"engine E cannot CAPABILITY: why"`` (a check that cannot run is never a pass)."""

    def __init__(self, engine: str, capability: str, why: str = "") -> None:
        self.engine, self.capability, self.why = engine, capability, why
        super().__init__(f"engine {engine!r} cannot {capability}" + (f": {why}" if why else ""))


class ContextTooShort(Unsupported, ValueError):
    """A record does not fit the pin's context (``max_position_embeddings``): the model cannot run it,
    so its tests skip naming record, length and context; still a ValueError to a caller that asked."""


class EngineContractError(OracleError):
    """An engine broke the contract of :class:`oracles.engines.base.Engine`: a required member missing
    at load, or a method returning the wrong type, shape or dtype (engine, method, field, what was
    expected and what came back, in one line)."""


class Tokenizer(Protocol):
    """What the suite asks of ``Engine.tokenizer``: Hugging Face's tokenizer API, as far as it is used.

    A transformers tokenizer and mlx-lm's ``TokenizerWrapper`` are one; an engine of one's own may set
    any object with these members (each checked at engine load: :data:`TOKENIZER_MEMBERS`).
    """

    #: The snapshot's chat template (None or empty: the pin has none, and the families that render
    #: a chat skip). Read by :meth:`oracles.engines.base.Engine.chat_ids`.
    chat_template: Any

    def apply_chat_template(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool,
                            tokenize: bool, return_dict: bool) -> Any:
        """Token ids (a sequence of ints) of ``conversation`` rendered by :attr:`chat_template`; called
        with ``tokenize=True, return_dict=False`` by :meth:`oracles.engines.base.Engine.chat_ids`, which
        the chat, clef and d1 families read their prompts from."""
        ...

    def encode(self, text: str, *, add_special_tokens: bool) -> Any:
        """Token ids (a sequence of ints) of ``text``; called with ``add_special_tokens=False`` once at
        engine load, on the canary text (:func:`oracles.pins.tokenizer.canary_disagreement`): its ids must be
        the pin's dry tokenizer's, which wrote every recorded token id the families feed the engine."""
        ...

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool) -> Any:
        """The text (a str) of ``token_ids``; called with ``skip_special_tokens=False`` by
        :meth:`oracles.engines.base.Engine.decode` (generated text in receipts, chat turns)."""
        ...

    def convert_ids_to_tokens(self, ids: list[int]) -> Any:
        """The vocabulary strings (a list of str) of ``ids``: the clef family (vision pins only) names the vision
        placeholder tokens by it when it writes a row's picture placeholders into the chat text."""
        ...


#: The members of :class:`Tokenizer` the engine load checks on every pin (kept equal to the Protocol's
#: by a dry test), and the one it checks on a vision pin only (the clef family's).
TOKENIZER_MEMBERS = ("apply_chat_template", "encode", "decode", "chat_template")
VISION_TOKENIZER_MEMBERS = ("convert_ids_to_tokens",)


@dataclass(frozen=True)
class Prompt:
    """What a forward reads: token ids and, for a vision-language model, the pictures its
    placeholders stand for, in the order the placeholders appear.

    images: PIL images or ``uint8`` arrays ``[H, W, 3]``; videos: each a sequence of such frames.
    """

    ids: tuple[int, ...]
    images: tuple[Any, ...] = ()
    videos: tuple[tuple[Any, ...], ...] = ()

    @property
    def has_media(self) -> bool:
        return bool(self.images or self.videos)


def as_prompt(prompt: Prompt | Sequence[int]) -> Prompt:
    """A :class:`Prompt` from a Prompt or a plain sequence of token ids (ints)."""
    if isinstance(prompt, Prompt):
        return prompt
    return Prompt(tuple(int(i) for i in prompt))


@dataclass
class Step:
    """One forward over ``T`` new tokens (the last ``keep`` when ``keep > 0``).

    logits: ``[T, V]`` float32, the LM head's output for each position.
    hidden: ``[T, D]`` float32, the final-norm hidden states the head read.
    layers: ``[L + 1, T, D]`` float32 or None: the residual stream after the embedding (row 0) and
        after each of the ``L`` decoder layers, before the final norm (``forward(layers=True)``).
    positions: ``[3, T]`` int64 or None: the rotary position planes (temporal, height, width) the
        text model received, where the engine uses M-RoPE.
    """

    logits: np.ndarray
    hidden: np.ndarray
    layers: np.ndarray | None = None
    positions: np.ndarray | None = None


@dataclass(frozen=True)
class Sampler:
    """Sampling settings; ``temperature == 0`` means greedy (argmax, lowest id on ties)."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def to_json(self) -> dict[str, Any]:
        return {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


@dataclass
class Generation:
    """A generation from a prompt.

    tokens: generated ids, the stop token included when ``finish_reason == "stop"``.
    step_logits: ``[N, V]`` float32, the logits each generated token was chosen from (raw, before
        temperature), one row per generated token.
    prefill_seconds / decode_seconds: wall seconds of the prompt forward and of the rest.
    """

    tokens: list[int]
    text: str
    finish_reason: str  # "stop" | "length"
    step_logits: np.ndarray
    prefill_seconds: float
    decode_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def decode_tokens_per_second(self) -> float:
        n = max(len(self.tokens) - 1, 0)
        return n / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class MtpGeneration:
    """A library's own greedy generation with and without its MTP drafter, from one prompt
    (:meth:`oracles.engines.base.Engine.mtp_generate`). Every field is JSON-able.

    tokens: the MTP run's new ids; greedy: the plain greedy run's; forwards: the trunk forwards the MTP
    run made (prefill included); accepted / drafted: the drafts the library accepted and made, by its own
    counts, or derived from ``forwards`` where it keeps none (None: not known); extra: what else the
    library reports (per-round counts), JSON-able.
    """

    tokens: list[int]
    greedy: list[int]
    forwards: int
    accepted: int | None = None
    drafted: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def hub_offline() -> None:
    """Forbid hub downloads before a framework library is imported: ``HF_HUB_OFFLINE=1`` and
    ``TRANSFORMERS_OFFLINE=1`` (huggingface_hub reads them once, at import). Called by each engine's
    loader and by the snapshot builders, never at plugin import: a project that did not ask for
    pytest-oracles keeps its environment."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def digest_buffers(buffers: dict[str, np.ndarray]) -> str:
    """sha256 over ``buffers`` in their order: each name, its shape as JSON, its ``<f4`` bytes."""
    h = hashlib.sha256()
    for name, a in buffers.items():
        arr = np.ascontiguousarray(a, dtype="<f4")
        h.update(name.encode() + b"\0" + json.dumps(list(arr.shape)).encode())
        h.update(arr.tobytes())
    return h.hexdigest()
