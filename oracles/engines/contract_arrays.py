"""The checks of a returned array that the core contract (:mod:`oracles.engines.contract`) and the system
capabilities' (:mod:`oracles.engines.contract_systems`) share: what came back, for a message, and a float32
numpy array of an expected shape.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.types import EngineContractError

if TYPE_CHECKING:
    from oracles.engines.base import Engine

F4 = np.dtype("<f4")


def seen(a: Any) -> str:
    """What came back, for a message: ``float64 [12, 49152]``, ``None``, ``a list``, ``a Tensor [3, 4]``."""
    if isinstance(a, np.ndarray):
        return f"{a.dtype} {list(a.shape)}"
    if a is None:
        return "None"
    shape = getattr(a, "shape", None)
    return f"a {type(a).__name__}" + (f" {list(shape)}" if shape is not None else "")


def expect_f4(engine: "Engine", call: str, field: str, a: Any, dims: str, want: Sequence[int | None],
              why: str) -> None:
    """Check one returned array: a float32 numpy array of shape ``want`` (None: any length there).

    ``call`` names the method (``"forward()"``), ``field`` the value (``"Step.logits"``), ``dims`` the
    axes (``"T, V"``), ``why`` where the expected lengths come from.

    Raises:
        EngineContractError: naming engine, method, field, what came back and what was expected.
    """
    if isinstance(a, np.ndarray) and a.dtype == F4 and a.ndim == len(want) and all(
            w is None or s == w for s, w in zip(a.shape, want)):
        return
    shape = ", ".join("*" if w is None else str(w) for w in want)
    raise EngineContractError(f"engine {engine.id} {call}: {field} is {seen(a)}; expected float32 [{dims}] = "
                              f"[{shape}] {why}")
