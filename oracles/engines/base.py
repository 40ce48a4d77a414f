"""The engine base class: what the reference and every port implement, numpy at the boundary.

All arrays crossing the boundary are float32 numpy arrays (``<f4``); token ids are Python ints.
A *cache* is the engine's own cache object (KV rows, and recurrent/conv state on hybrid models;
opaque to the checks); a *snapshot* is an independent copy of one that :meth:`Engine.restore` turns
back into a live cache.

The core members every engine implements are abstract: :meth:`Engine.forward`,
:meth:`Engine.make_cache` and :meth:`Engine.cache_length` (an engine without them is refused at load,
never a run of skips). Every other capability is a method with a default, in the manner of mlx-lm's
cache classes (``is_trimmable()`` returns False there): a default that cannot serve raises
:class:`Unsupported`, which the plugin turns into a skip naming engine and capability, never a pass.
Families ask capabilities, never engine ids: a port that is the reference's own class registered under
another id must pass everything the reference passes.

This module imports numpy (and the pure :mod:`oracles.checks.tolerance`) only; an adapter imports its
framework inside its own module, lazily, so the registry can ask :meth:`Engine.unavailable_reason`
without loading torch or mlx.
"""

from __future__ import annotations

import abc
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from oracles.checks.tolerance import FLOAT32, Tolerance
from oracles.engines.guards import check_cohort, check_fits, check_forward_length, pinned_config  # noqa: F401
from oracles.engines.systems import MtpDrafting, SystemOneDecisions
from oracles.engines.types import (  # noqa: F401
    ContextTooShort,
    EngineContractError,
    Generation,
    MtpGeneration,
    Prompt,
    Sampler,
    Step,
    Tokenizer,
    Unsupported,
    as_prompt,
    digest_buffers,
    hub_offline,
)

if TYPE_CHECKING:
    from oracles.engines.taps import Taps
    from oracles.pins.pin import Pin

#: What every engine has once built (:class:`Engine`'s docstring says what each is).
REQUIRED_MEMBERS = ("id", "pin", "root", "pin_file", "vocab_size", "hidden_size", "num_layers", "eos_token_ids",
                    "max_context", "tokenizer")
#: What every engine inherits with a default (a class sets its own where it differs); with
#: :data:`REQUIRED_MEMBERS`, every member :class:`Engine` declares, each in one of the two.
DEFAULTED_MEMBERS = ("devices", "reads_snapshot")
#: The methods every engine implements (abstract here: a class without one cannot be built).
CORE_METHODS = ("forward", "make_cache", "cache_length")


class Engine(MtpDrafting, SystemOneDecisions, abc.ABC):
    """One framework's adapter. Subclasses set :attr:`id` and the model facts in ``__init__``, and
    implement :data:`CORE_METHODS` (:meth:`forward`, :meth:`make_cache`, :meth:`cache_length`).
    The capabilities of a model's own system (MTP drafting: ``mtp_*``; System One decisions:
    ``decision_*``) are inherited from :mod:`oracles.engines.systems`, refusing by default.

    Built as ``Engine(root, pin, threads)``: ``root`` the verified snapshot folder, ``pin`` its loaded
    :class:`oracles.pins.pin.Pin` (``oracles.pins.pin.load_pin(name)``), ``threads`` the intra-op
    thread count (0: the library's own). A minimal port, registered under the entry-point group
    ``oracles.engines`` as ``my-port = "my_package.port:MyPort"``::

        class MyPort(Engine):
            id = "my-port"

            def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
                super().__init__(root, pin, threads)
                ...  # load the snapshot at root; set the model facts and the tokenizer

            def forward(self, prompt, cache=None, keep=0, layers=False) -> Step: ...
            def make_cache(self) -> Any: ...
            def cache_length(self, cache: Any) -> int: ...

    Members every engine has (:data:`REQUIRED_MEMBERS`, checked once when the plugin builds it: a
    missing one fails the (engine, pin) pair in one line naming them all): the class attribute ``id``
    (its registry name), and, set in ``__init__``: ``pin`` (the pin's name, recorded with every figure
    and in every run key), ``pin_file`` (the :class:`oracles.pins.pin.Pin` itself) and ``root`` (these three by
    this class's ``__init__``), ``vocab_size`` (``V``, the logits' width), ``hidden_size`` (``D``), ``num_layers`` (decoder layers
    ``L``), ``eos_token_ids``, ``max_context`` (0: no limit), and ``tokenizer``, a
    :class:`oracles.engines.types.Tokenizer`: ``apply_chat_template``, ``encode``, ``decode`` and
    ``chat_template`` (a transformers tokenizer and mlx-lm's ``TokenizerWrapper`` are one).

    What :meth:`forward`, :meth:`decode_cohort`, :meth:`lm_head`, :meth:`final_norm`,
    :meth:`generate`, :meth:`speculative`, the buffer and digest methods and the system capabilities
    return is checked on every call of an engine the plugin built
    (:func:`oracles.engines.contract.install_checks`): a wrong type, shape or dtype raises
    :class:`oracles.engines.types.EngineContractError` naming engine, method and field.
    """

    id: ClassVar[str] = ""
    #: Devices ``--reference-device`` may name for this engine (float32 on each).
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: Whether the engine reads its pin's snapshot folder (then every byte is verified before it is built). An
    #: engine that answers from elsewhere (a recording, made on the pin's digest and checked against it) does not:
    #: a port machine need not hold a reference it cannot fit.
    reads_snapshot: ClassVar[bool] = True

    pin: str
    pin_file: "Pin"
    root: Path
    vocab_size: int
    hidden_size: int
    num_layers: int
    eos_token_ids: frozenset[int]
    max_context: int
    tokenizer: Tokenizer

    def __init__(self, root: Path, pin: "Pin", threads: int = 0) -> None:
        """Keep the snapshot folder, the pin (``pin_file``, and its name as ``pin``) and the thread count.

        Raises:
            TypeError: ``pin`` is not a :class:`oracles.pins.pin.Pin` (a pin name, say), class named.
        """
        from oracles.pins.pin import Pin

        if not isinstance(pin, Pin):
            cls = type(self)
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}(root, pin, threads): pin is a {type(pin).__name__} "
                            f"{pin!r}; an engine is built with the loaded oracles.pins.pin.Pin "
                            "(oracles.pins.pin.load_pin(name))")
        self.root, self.pin, self.pin_file, self.threads = Path(root), pin.name, pin, threads

    def tolerance(self) -> Tolerance:
        """The bounds every check of this engine applies (:class:`oracles.checks.tolerance.Tolerance`): a
        port test holds the port to the port's. Default :data:`oracles.checks.tolerance.FLOAT32`, the
        bounds of a port that computes the reference's float32 graph in another order; an adapter of
        another precision answers with its own (judged from its artifact, :attr:`pin_file`)."""
        return FLOAT32

    def translation_notes(self) -> tuple[str, ...]:
        """What the adapter changed to load the artifact, one line each (``"rope_theta 100000.0 from
        rope_parameters (mlx-lm reads 10000.0)"``): every verdict of a port test names them. Default
        none: an engine that loads the artifact as its library does."""
        return ()

    # -- where it can run ------------------------------------------------------------------
    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why this engine cannot run on this machine (a missing library, another platform), or
        None. Must not import the framework: the registry asks it at collection."""
        return None

    @classmethod
    def device_unavailable(cls, device: str) -> str | None:
        """Why ``device`` (one of :attr:`devices`) cannot run this engine here (what was probed), or None."""
        return None

    @classmethod
    def unsupported_pin(cls, pin: "Pin") -> str | None:
        """Why this engine cannot load ``pin`` (judged from the pin file alone: its model class and
        modality), or None when it can. The (engine, pin) pair is then left out of the parametrization,
        with this reason in the report header and the receipt."""
        return None

    def describe(self) -> dict[str, Any]:
        """What the receipt records about this engine: id, class, dtype, device, versions, threads,
        and ``config_overrides`` (every translation the adapter applied to the snapshot's config)."""
        return {"engine": self.id, "class": f"{type(self).__module__}.{type(self).__qualname__}"}

    def _unsupported(self, capability: str, why: str = "") -> Unsupported:
        return Unsupported(self.id, capability, why)

    # -- tokenizer (shared: transformers and mlx-lm tokenizers speak the same API) -------------
    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered by the snapshot's chat template.

        Raises:
            Unsupported: the snapshot's tokenizer has no chat template.
        """
        if not getattr(self.tokenizer, "chat_template", None):
            raise self._unsupported("render a chat", f"pin {self.pin} has no chat template")
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                 tokenize=True, return_dict=False)
        return [int(i) for i in ids]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids``, special tokens kept."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    # -- forward and head ------------------------------------------------------------------
    @abc.abstractmethod
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """Run ``prompt`` after what ``cache`` holds (appending to it); ``cache=None`` is a cold prefill.

        ``keep > 0`` returns the last ``keep`` positions only (a long prefill's ``[T, V]`` logits can
        be gigabytes); ``keep == 0`` every position. ``layers=True`` fills :attr:`Step.layers`.

        Raises:
            ValueError: an empty prompt, or one that passes :attr:`max_context`
                (:func:`check_forward_length`).
            Unsupported: images for a text-only engine; ``layers=True`` where the engine cannot tap them.
        """
        raise NotImplementedError(f"{type(self).__qualname__}.forward")

    def taps(self, prompt: Prompt | Sequence[int]) -> "Taps":
        """A cold prefill of ``prompt`` with the residual stream and, inside every decoder layer, the
        attention's and the MLP's outputs (:class:`oracles.engines.taps.Taps`), for ``oracles bisect``.

        Raises:
            Unsupported: the engine cannot tap inside its layers (bisect then localises by the
                stream of ``forward(layers=True)`` alone, or names the engine it cannot localise).
        """
        raise self._unsupported("tap the attention and MLP outputs inside its layers")

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        """``[T, D]`` final-norm hidden states -> ``[T, V]`` logits through the engine's own head."""
        raise self._unsupported("re-run its LM head")

    def final_norm(self, residual: np.ndarray) -> np.ndarray:
        """``[T, D]`` residual stream after the last layer -> ``[T, D]`` through the model's final norm."""
        raise self._unsupported("re-run its final norm")

    def text_ids(self, prompt: Prompt | Sequence[int]) -> list[int]:
        """The token ids of a text-only prompt.

        Raises:
            Unsupported: the prompt carries images or video (a text-only engine cannot read them).
        """
        p = as_prompt(prompt)
        if p.has_media:
            raise self._unsupported("read images or video", "a text-only engine")
        return list(p.ids)

    # -- cache -----------------------------------------------------------------------------
    @abc.abstractmethod
    def make_cache(self) -> Any:
        """An empty cache for :meth:`forward`."""
        raise NotImplementedError(f"{type(self).__qualname__}.make_cache")

    @abc.abstractmethod
    def cache_length(self, cache: Any) -> int:
        """Positions ``cache`` holds (0 for None)."""
        raise NotImplementedError(f"{type(self).__qualname__}.cache_length")

    def is_trimmable(self, cache: Any) -> bool:
        """Whether :meth:`trim` can cut ``cache`` (False where it holds recurrent state that folds
        every position in: the families then roll back by :meth:`snapshot` / :meth:`restore`)."""
        return False

    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` positions in place; True when done, False when this cache cannot be cut
        (nothing changed)."""
        return n == 0

    def snapshot(self, cache: Any) -> Any:
        """An independent copy of ``cache``: later forwards on ``cache`` do not change it."""
        raise self._unsupported("snapshot a cache")

    def restore(self, snapshot: Any) -> Any:
        """A fresh live cache holding what ``snapshot`` holds; the snapshot stays unchanged."""
        raise self._unsupported("restore a cache")

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        """Every buffer of a snapshot as float32 arrays, valid rows only, named
        ``layers.<i>.<keys|values|conv_state|recurrent_state>`` in layer order; a DeepSeek-V4 cache's
        compressed buffers as ``layers.<i>.window_kv`` and ``layers.<i>.<compressor|indexer>.<compressed_kv|
        buffer_kv|buffer_gate|overlap_kv|overlap_gate>`` (:mod:`oracles.engines.torch.cohort_dsv4`)."""
        raise self._unsupported("list a snapshot's buffers")

    def snapshot_digest(self, snapshot: Any) -> str:
        """sha256 over every buffer of a snapshot (:func:`digest_buffers` of :meth:`snapshot_buffers`)."""
        return digest_buffers(self.snapshot_buffers(snapshot))

    def buffer_digests(self, snapshot: Any) -> dict[str, str]:
        """Per buffer of a snapshot, its own sha256 (so a mismatch names the buffer)."""
        return {name: digest_buffers({name: a}) for name, a in self.snapshot_buffers(snapshot).items()}

    def cache_buffers(self, cache: Any) -> dict[str, np.ndarray]:
        """A live cache's buffers, as :meth:`snapshot_buffers` names them (a copy)."""
        return self.snapshot_buffers(self.snapshot(cache))

    def cache_views(self, cache: Any) -> dict[str, np.ndarray]:
        """:meth:`cache_buffers` for a comparison made at once: read-only views without a copy where the
        framework allows, valid until the next forward or cohort step on ``cache``. Default: a copy."""
        return self.cache_buffers(cache)

    def cache_capacity(self, cache: Any) -> int:
        """Positions ``cache``'s buffers hold before an update reallocates them (its length where every
        update does)."""
        raise self._unsupported("measure a cache's capacity")

    def grow(self, cache: Any, capacity: int) -> Any:
        """A new live cache holding what ``cache`` holds, whose buffers hold at least ``capacity``
        positions before reallocating (each adapter says what a capacity is); ``cache`` is untouched.
        Raises ValueError for a ``capacity`` below the cache's length."""
        raise self._unsupported("grow a cache to a larger capacity")

    def resident_bytes(self, obj: Any) -> int:
        """Bytes a live cache or a snapshot holds allocated, spare capacity included."""
        raise self._unsupported("count a cache's resident bytes")

    def weight_bytes(self) -> int:
        """Bytes of the loaded parameters (a tied tensor once)."""
        raise self._unsupported("count its weights' bytes")

    def counters(self) -> dict[str, float]:
        """The framework's own running counters (calls, evaluations, memory); ``{}`` where it keeps none."""
        return {}

    def batch_variance(self) -> str | None:
        """None when :meth:`decode_cohort` gives each lane the bits a serial one-token :meth:`forward`
        gives; otherwise why not, with measured figures (the cohort family's bit-exact serial-vs-cohort
        tests are then strict xfails with this reason; row isolation must still hold bit for bit)."""
        return None

    # -- batched decode --------------------------------------------------------------------
    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """Advance ``B`` lanes by one token each in one batched forward of the framework.

        Lane ``b`` is ``tokens[b]`` appended after what ``caches[b]`` holds; the caches are live caches
        of this engine and may hold different lengths. Each lane is placed at its own positions, so
        the result is, up to the float32 reordering of a ``B``-row matmul, what
        ``forward([tokens[b]], caches[b], keep=1)`` would give lane by lane.

        Returns:
            Step with logits ``[B, V]`` and hidden ``[B, D]`` float32; row ``b`` is lane ``b``.

        Side effects: each ``caches[b]`` gains lane ``b``'s token and stays usable by :meth:`forward`
        and :meth:`decode_cohort`; snapshots are untouched.

        Raises:
            ValueError: see :func:`check_cohort`.
            Unsupported: the engine has no batched decode.
        """
        raise self._unsupported("decode a cohort of lanes in one batch")

    # -- generation ------------------------------------------------------------------------
    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """The framework's own generation from a cold prompt. ``max_kv_size`` bounds the cache (a
        rotating window) where the framework has one.

        Raises:
            Unsupported: no generation, or no bounded cache when ``max_kv_size`` is given.
        """
        raise self._unsupported("generate with its own library code")

    def speculative(self, prompt: Prompt | Sequence[int], draft: "Engine", num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Generation:
        """The framework's own greedy speculative (assisted) generation with ``draft``, ``num_draft``
        drafts a cycle; ``extra["from_draft"]`` per token where the library reports it.

        Raises:
            Unsupported: the library has no speculative generation for this model or cache.
        """
        raise self._unsupported("run its library's speculative generation")

    def speculative_refusal(self) -> str | None:
        """The library's own refusal of :meth:`speculative` on this model (its error message, quoted
        with the library's name and version), or None where the library runs it. Asked before the run,
        so a test can expect the refusal (a strict xfail) instead of deciding by engine id; computed
        with the library's own check, before any forward."""
        return None

    def known_gap(self, oracle: str, any_pin: bool = False) -> str | None:
        """A measured failure of this engine's library on ``oracle`` on this engine's pin: the figure and
        the cause, which the test expects as a strict xfail, so a fixed library fails it and the note is
        removed; None where none is known. ``oracle`` is a name a test gives (``"speculative past a KV
        window"``), or, asked by the plugin's ``engine`` and ``port`` fixtures for every test, the test's
        name with its parameters (``test_decode_vs_reference[arith-PIN-ENGINE]``): an engine keys its
        measured failures by either. With ``any_pin``, the note measured on any pin (a failure on a pin
        never measured quotes it as a likely cause, without expecting it)."""
        return None


__all__ = ["CORE_METHODS", "DEFAULTED_MEMBERS", "REQUIRED_MEMBERS", "ContextTooShort", "Engine", "EngineContractError",
           "Generation", "MtpGeneration", "Prompt", "Sampler", "Step", "Tokenizer", "Unsupported", "as_prompt", "check_cohort",
           "check_fits", "check_forward_length", "digest_buffers", "hub_offline", "pinned_config"]
