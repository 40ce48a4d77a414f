"""A model with a sliding window, and the window fault.

Neither the default pin (SmolLM2, a Llama) nor the hybrid twin (Qwen3.5) has a sliding window, so
the window fault runs on a *variant* of the default pin: :class:`SlidingWindow` makes the Llama
decoder build its attention mask with transformers' own ``create_sliding_window_causal_mask`` (what
Mistral's decoder calls) from a config whose ``sliding_window`` is :data:`WINDOW`. The KV cache stays
the full ``DynamicCache`` (the mask hides what falls out of the window; a sliding cache layer only
saves memory), so trims, snapshots and the cohort's batched decode work as on the pin itself. That
variant is the reference of the window rows; :class:`WindowOffByOne` is the port that reads the
window as ``W + 1`` (an inclusive/exclusive slip: ``kv > q - W`` written ``kv >= q - W``).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from typing import TYPE_CHECKING, Any, Iterator

from oracles.faults.kinds import Fault, attention_layers, decoder

if TYPE_CHECKING:
    from oracles.faults.kinds import Faultable

#: The variant's window. The panel's records pass it: "ping" 31 ids, "arith" 45, the d1 rows 62..80,
#: the cohort's longest lane 24 + 8 steps; 24 keys leave the first 24 positions of every record
#: unwindowed, so the fault shows only where a window is due.
WINDOW = 24


class SlidingWindow(Fault):
    """Not a fault: the windowed variant of a Llama-style decoder (the window rows' reference)."""

    name = f"window{WINDOW}"

    def __init__(self, window: int = WINDOW) -> None:
        self.window = window
        self.title = (f"sliding window of {window} (transformers' create_sliding_window_causal_mask, as "
                      "Mistral's decoder builds it)")

    def _module(self, engine: Faultable) -> Any:
        return sys.modules[type(decoder(engine)).__module__]

    def why_not(self, engine: Faultable) -> str | None:
        if getattr(engine.model.config, "sliding_window", None) is not None:
            return "the model has a sliding window of its own"
        if not hasattr(self._module(engine), "create_causal_mask"):
            return f"{type(decoder(engine)).__name__} does not build its mask with create_causal_mask"
        return None

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        from transformers.masking_utils import create_sliding_window_causal_mask

        config = copy.copy(engine.model.config)
        config.sliding_window = self.window

        def windowed_mask(**kwargs: Any) -> Any:
            return create_sliding_window_causal_mask(**{**kwargs, "config": config})

        module = self._module(engine)
        old = module.create_causal_mask
        module.create_causal_mask = windowed_mask
        try:
            yield
        finally:
            module.create_causal_mask = old


def _window_of(engine: Faultable) -> SlidingWindow | None:
    """The sliding-window variant ``engine`` is a fault port of, or None."""
    fault = getattr(engine, "fault", None)
    return fault if isinstance(fault, SlidingWindow) else None


class WindowOffByOne(Fault):
    """On the windowed variant: the port attends ``W + 1`` keys, one older position than the window."""

    name = "window_off_by_one"
    title = "sliding window off by one (W + 1 keys attended)"

    def why_not(self, engine: Faultable) -> str | None:
        if _window_of(engine) is None:
            return "the model has no sliding window (the fault runs on the windowed variant of the pin)"
        return None

    def stage(self, engine: Faultable) -> str | None:
        return f"layer {attention_layers(engine)[0]}"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        window = _window_of(engine)  # the variant this port wraps; its window is read when its own call starts
        if window is None:
            raise ValueError(f"{self.name}: {self.why_not(engine)}")
        old = window.window
        window.window = old + 1
        try:
            yield
        finally:
            window.window = old
