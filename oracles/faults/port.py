"""A fault port: a faithful engine with one :class:`oracles.faults.kinds.Fault` in force during each
of its calls. Everything else is the wrapped engine's own (same tokenizer, caches, library code);
the wrapper only enters the fault around the call and, for a cache fault, replaces ``trim``.

Faults nest: the base of a fault port may itself be a fault port (the sliding-window variant is the
base of the window fault), and the outer fault is entered first, so it can change what the inner
one reads.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, Iterator, Sequence

import numpy as np

from oracles.engines.base import Engine, Generation, Prompt, Sampler, Step, Unsupported
from oracles.faults.kinds import Fault

if TYPE_CHECKING:
    from oracles.checks.tolerance import Tolerance
    from oracles.engines.taps import Taps
    from oracles.faults.kinds import Faultable

#: The facts a family reads from an engine, carried over from the wrapped one.
FACTS = ("pin", "pin_file", "root", "threads", "vocab_size", "hidden_size", "num_layers", "eos_token_ids", "max_context",
         "tokenizer", "model", "tied")


def faultable(engine: Engine) -> Faultable:
    """``engine`` as what a fault is injected into: a transformers engine
    (:class:`oracles.engines.torch.reference.TorchReference` or a subclass) or a fault port over one.

    Raises:
        Unsupported: any other engine (named): a fault edits a transformers model in place, so an engine without
            one (a recording, another framework) cannot take it; the test that needs it skips naming both.
    """
    from oracles.engines.torch.reference import TorchReference

    if isinstance(engine, (TorchReference, FaultPort)):
        return engine
    raise Unsupported(engine.id, "take an injected fault", f"a fault edits a transformers model in place, and "
                      f"{type(engine).__name__} holds none")


class FaultPort(Engine):
    """``base`` with ``fault`` in force during every call; ``id`` is ``"<base id>+<fault name>"``.

    Raises:
        oracles.engines.base.Unsupported: at construction, when the fault cannot be injected into
            ``base`` (:meth:`Fault.why_not`, engine and reason named).
    """

    #: The transformers model the faults edit: the wrapped engine's own (one of :data:`FACTS`).
    model: Any

    def __init__(self, base: Engine, fault: Fault) -> None:
        self._adopt(faultable(base), fault)

    def _adopt(self, base: Any, fault: Fault) -> None:
        """Wrap ``base``: its facts carried over, the fault checked injectable (a subclass wrapping another
        kind of engine calls this with its own checked base).

        Raises:
            oracles.engines.base.Unsupported: the fault cannot be injected into ``base``.
        """
        self.base, self.fault = base, fault
        self.id = f"{base.id}+{fault.name}"  # type: ignore[misc]  # an instance id: one per wrapped fault
        for name in FACTS:
            if hasattr(base, name):
                setattr(self, name, getattr(base, name))
        why = fault.why_not(self.base)
        if why:
            raise self._unsupported(f"inject the fault {fault.name}", why)
        self._depth = 0

    @contextlib.contextmanager
    def _on(self) -> Iterator[None]:
        if self._depth:  # a nested call (none today): the fault is in force already
            yield
            return
        self._depth += 1
        recording = getattr(self.base, "recording", None)  # issue 26: a faulted answer is not the engine's own
        try:
            with self.fault.applied(self.base), (recording.paused() if recording is not None else contextlib.nullcontext()):
                yield
        finally:
            self._depth -= 1

    def describe(self) -> dict[str, Any]:
        return {**self.base.describe(), "engine": self.id, "fault": self.fault.name,
                "fault_title": self.fault.describe(self.base)}

    def tolerance(self) -> Tolerance:
        """The wrapped engine's bounds: a fault changes what the port computes, not its precision."""
        return self.base.tolerance()

    def translation_notes(self) -> tuple[str, ...]:
        """The wrapped engine's: the fault is injected into the artifact as its adapter loaded it."""
        return self.base.translation_notes()

    def stage(self) -> str | None:
        """Where bisect must localise the fault (:meth:`Fault.stage`)."""
        return self.fault.stage(self.base)

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        with self._on():
            return self.base.forward(prompt, cache, keep, layers)

    def taps(self, prompt: Prompt | Sequence[int]) -> Taps:
        with self._on():
            return self.base.taps(prompt)

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        with self._on():
            return self.base.lm_head(hidden)

    def final_norm(self, residual: np.ndarray) -> np.ndarray:
        with self._on():
            return self.base.final_norm(residual)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.base.chat_ids(messages, add_generation_prompt)

    def decode(self, ids: Sequence[int]) -> str:
        return self.base.decode(ids)

    def make_cache(self) -> Any:
        with self._on():
            return self.base.make_cache()

    def cache_length(self, cache: Any) -> int:
        return self.base.cache_length(cache)

    def is_trimmable(self, cache: Any) -> bool:
        return self.base.is_trimmable(cache)

    def trim(self, cache: Any, n: int) -> bool:
        with self._on():
            return self.fault.trim(self.base, cache, n)

    def snapshot(self, cache: Any) -> Any:
        return self.base.snapshot(cache)

    def restore(self, snapshot: Any) -> Any:
        return self.base.restore(snapshot)

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        return self.base.snapshot_buffers(snapshot)

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        with self._on():
            return self.base.decode_cohort(tokens, caches)

    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        with self._on():
            return self.base.generate(prompt, sampler, max_new_tokens, max_kv_size)

    def speculative(self, prompt: Prompt | Sequence[int], draft: Engine, num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Generation:
        with self._on():
            return self.base.speculative(prompt, draft, num_draft, max_new_tokens, max_kv_size)
