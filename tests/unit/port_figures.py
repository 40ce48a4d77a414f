"""What the one-file ports' tests (ExecuTorch, LiteRT, ONNX Runtime) hold a port's logits to: seeded prompts and
the float32 bounds of :data:`oracles.checks.tolerance.FLOAT32` with every argmax equal."""

from __future__ import annotations

from typing import Any

import numpy as np

from oracles.checks.tolerance import FLOAT32


def prompt(n: int, seed: int = 0) -> list[int]:
    """``n`` seeded token ids in ``3 .. 49,151`` (SmolLM2's vocabulary past its special ids)."""
    return [int(i) for i in np.random.default_rng(seed).integers(3, 49152, n)]


def held(port: np.ndarray, ref: np.ndarray) -> dict[str, Any]:
    """Port ``[T, V]`` logits against the reference's, within the float32 bounds, every argmax equal; the figures
    (max |Δ|, NMSE, the share of equal argmaxes)."""
    __tracebackhide__ = True
    d = port.astype(np.float64) - ref
    figures = {"max_abs": float(np.abs(d).max()), "nmse": float((d ** 2).sum() / (ref.astype(np.float64) ** 2).sum()),
               "argmax": float((port.argmax(-1) == ref.argmax(-1)).mean())}
    assert figures["max_abs"] <= FLOAT32.max_abs_logit and figures["nmse"] <= FLOAT32.max_nmse, figures
    assert figures["argmax"] == 1.0, figures
    return figures


def prefill_held(port: Any, ref: Any, n: int) -> None:
    """A cold prefill of ``prompt(n)`` on ``port`` (an Engine) held to ``ref``'s: the logits (:func:`held`), the
    final norm's hidden within the float32 logit bound, and ``keep=3`` the last three rows bit for bit."""
    __tracebackhide__ = True
    ids = prompt(n)
    a, b = port.forward(ids), ref.forward(ids)
    held(a.logits, b.logits)
    assert np.abs(a.hidden - b.hidden).max() <= FLOAT32.max_abs_logit
    assert port.forward(ids, keep=3).logits.tobytes() == a.logits[-3:].tobytes()
