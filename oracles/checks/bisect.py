"""Bisect: where along the forward a port first leaves the reference (pure numpy).

Stages, in the order the forward runs them (``depth`` in brackets): the embedding [0], decoder layer
``l`` [l + 1] (the residual stream after it), the final norm [L + 1], the head [L + 2]. The named
stage is the **first one whose error exceeds its budget while its input was within budget** (the
rule of coremltools' ``MLModelValidator.find_failing_ops``: an op is to blame when its output fails
and its inputs pass, so an error carried in from upstream is not blamed on every later op). Inside
the named layer, the attention (token mixer) and the MLP are told apart the same way: the attention
reads the stream before the layer; the MLP reads the stream plus the attention's output; where both
engines tap the norms before them, each norm is a block of its own, read before its block.

Error of a stage: the NMSE of each position's row, ``|port - ref|^2 / |ref|^2`` over the hidden
axis, and its maximum over positions. Per row, because SmolLM2's residual stream carries a massive
activation on the first token (row RMS ~1,046 from layer 12 on, ~8 elsewhere): an NMSE over the
whole ``[T, D]`` array is that one row's, and a fault elsewhere in the sequence would hide under it.

Budgets are calibrated on the float32 noise floor between two faithful engines: transformers
(torch, MKL) and mlx-lm (MLX CPU, netlib BLAS) on the same pin (SmolLM2-135M-Instruct, fp32), prompt
"ping" (31 ids), measured with ``Engine.taps``; max over positions of the per-row NMSE:

    depth (stream row)     1        5        10       15       20       25       30
    torch vs MLX           2.5e-12  3.5e-12  1.5e-11  5.7e-12  1.0e-11  1.4e-11  2.8e-11
    final norm 2.5e-11; head (logits) 2.0e-10; attention / MLP outputs at most 1.4e-10 / 6.9e-11

llama.cpp (b11739, CPU) on the F32 GGUF its converter makes of the same pin, against torch, measured
the same way: the stream at most 2.2 times the floor below (depth 10), the final norm 0.29 and the head
1.27 times; the norms before the attention and the MLP at most 1.9e-11, attention / MLP outputs
4.9e-11 / 3.6e-11 (the norms share the attention's and MLP's budget).

The floor grows about linearly with depth (accumulated reordering): ``bisect_floor_at_0`` +
``bisect_floor_per_layer`` x depth (fields of :class:`oracles.checks.tolerance.Tolerance`) bounds every
measured depth of the stream (largest ratio 0.98, at depth 10, where the first token's massive
activation forms; 0.25..0.53 elsewhere). A stage's budget is ``bisect_margin`` times that floor: with
:data:`~oracles.checks.tolerance.FLOAT32`, 6e-9 after layer 1, 3.5e-8 after layer 30, 3.7e-8 for the head.
The yardstick: llama.cpp's ``test-backend-ops`` holds one op of a backend to NMSE <= 1e-7 by default
(``test_case::max_nmse_err``) and a matrix product to 5e-4 (``test_mul_mat``, inputs that may be f16
or quantised); a whole float32 layer stack sits below its strictest band. The smallest fault of the
panel (RMSNorm epsilon 1e-5 -> 1e-6) moves the stream by 1.4e-6 after layer 0, 230x its budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from oracles.checks.tolerance import FLOAT32, Tolerance


def noise_floor(depth: int, *, tolerance: Tolerance = FLOAT32) -> float:
    """The noise floor of the per-row NMSE at ``depth`` (0 embedding, ``l + 1`` after layer ``l``):
    ``bisect_floor_at_0 + bisect_floor_per_layer * depth``."""
    return tolerance.bisect_floor_at_0 + tolerance.bisect_floor_per_layer * depth


def budget(depth: int, *, tolerance: Tolerance = FLOAT32) -> float:
    """The NMSE budget of the stage at ``depth``: ``bisect_margin`` times :func:`noise_floor`."""
    return tolerance.bisect_margin * noise_floor(depth, tolerance=tolerance)


def sublayer_budget(*, tolerance: Tolerance = FLOAT32) -> float:
    """The NMSE budget of one layer's attention or MLP output: ``bisect_margin * bisect_sublayer_floor``."""
    return tolerance.bisect_margin * tolerance.bisect_sublayer_floor


@dataclass(frozen=True)
class Stage:
    """One stage's figures, reference vs port.

    nmse: max over positions of the row NMSE (``inf`` where the reference row is zero and the port's
    is not); nmse_position: that position; max_abs: max ``|port - ref|`` and max_abs_at its
    ``[position, index]``; cosine: the smallest row cosine similarity (float64; 1 for two zero rows).
    """

    name: str
    depth: int
    nmse: float
    nmse_position: int
    max_abs: float
    max_abs_at: tuple[int, int]
    cosine: float
    budget: float

    @property
    def over(self) -> bool:
        return not self.nmse <= self.budget  # NaN counts as over

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "max_abs_at": list(self.max_abs_at), "over": self.over}


def row_nmse(ref: Any, port: Any) -> np.ndarray:
    """Per row (position) of two ``[T, D]`` arrays, ``sum((port - ref)^2) / sum(ref^2)`` in float64:
    ``[T]``; 0 for two zero rows, ``inf`` for a zero reference row the port leaves.

    Raises:
        ValueError: shapes differ.
    """
    r, p = np.asarray(ref, np.float64), np.asarray(port, np.float64)
    if r.shape != p.shape:
        raise ValueError(f"shapes differ: reference {list(r.shape)} vs port {list(p.shape)}")
    num, den = ((p - r) ** 2).sum(-1), (r * r).sum(-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.where(num > 0, np.inf, 0.0))


def stage(name: str, depth: int, ref: Any, port: Any, limit: float) -> Stage:
    """Figures of one stage from its ``[T, D]`` (or ``[T, V]``) reference and port arrays."""
    r, p = np.asarray(ref, np.float64), np.asarray(port, np.float64)
    per_row = row_nmse(r, p)
    absd = np.abs(p - r)
    # NaN ranks above everything: a position the port made non-finite is the worst one, not skipped
    at = np.unravel_index(int(np.argmax(np.nan_to_num(absd, nan=np.inf))), absd.shape)
    worst = int(np.argmax(np.nan_to_num(per_row, nan=np.inf)))
    norms = np.linalg.norm(r, axis=-1) * np.linalg.norm(p, axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = np.where(norms > 0, (r * p).sum(-1) / np.where(norms > 0, norms, 1.0), np.where(np.isnan(norms), np.nan, 1.0))
    return Stage(name=name, depth=depth, nmse=float(per_row[worst]), nmse_position=worst, max_abs=float(absd[at]),
                 max_abs_at=(int(at[0]), int(at[1])), cosine=float(np.min(cos)), budget=limit)  # np.min keeps a NaN


def stages(ref: dict[str, Any], port: dict[str, Any], *, tolerance: Tolerance = FLOAT32) -> list[Stage]:
    """Every stage of one forward: ``ref`` and ``port`` hold ``stream`` ``[L + 1, T, D]``, ``hidden``
    ``[T, D]`` and ``logits`` ``[T, V]`` (float32); each stage's budget from ``tolerance`` (:func:`budget`).

    Raises:
        ValueError: the two sides differ in layers, positions or widths (both shapes named).
    """
    if np.shape(ref["stream"]) != np.shape(port["stream"]):
        raise ValueError(f"layer streams differ in shape: reference {list(np.shape(ref['stream']))} vs port "
                         f"{list(np.shape(port['stream']))} ([L + 1, T, D])")
    n = len(ref["stream"]) - 1
    out = [stage("embedding" if d == 0 else f"layer {d - 1}", d, ref["stream"][d], port["stream"][d],
                 budget(d, tolerance=tolerance)) for d in range(n + 1)]
    out.append(stage("final norm", n + 1, ref["hidden"], port["hidden"], budget(n + 1, tolerance=tolerance)))
    out.append(stage("head", n + 2, ref["logits"], port["logits"], budget(n + 2, tolerance=tolerance)))
    return out


def first_divergent(found: list[Stage]) -> int | None:
    """Index of the first stage over its budget whose input stage (the one before) is within its
    own; None when every stage is within budget (or every over-budget stage inherits its error)."""
    for i, s in enumerate(found):
        if s.over and (i == 0 or not found[i - 1].over):
            return i
    return None


#: The blocks inside a decoder layer in the order they run: (verdict name, JSON key, array key). The
#: norms count only where both engines tap them (``attn_norm`` / ``mlp_norm`` of
#: :class:`oracles.engines.taps.Taps`).
BLOCKS = (("attention norm", "attention_norm", "attn_norm"), ("attention", "attention", "attn"),
          ("MLP norm", "mlp_norm", "mlp_norm"), ("MLP", "mlp", "mlp"))


def inside_layer(layer: int, ref: dict[str, Any], port: dict[str, Any], *,
                 tolerance: Tolerance = FLOAT32) -> dict[str, Any]:
    """The blocks inside decoder layer ``layer``: ``ref``/``port`` hold ``attn`` and ``mlp`` ``[L, T, D]``,
    and where both hold them ``attn_norm`` and ``mlp_norm`` ``[L, T, D]`` (the norms' outputs). The
    verdict is the first block over its budget in the order they run (:data:`BLOCKS`: ``"attention
    norm"``, ``"attention"``, ``"MLP norm"``, ``"MLP"``): each block reads the one before it, so the
    first over budget is where the error enters the layer. ``"neither"`` when every block is within (the
    layer's output differs from the sum of its parts: a step after the blocks, such as a rounding of the
    output). Every block's budget is ``tolerance``'s (:func:`sublayer_budget`).
    """
    limit = sublayer_budget(tolerance=tolerance)
    out: dict[str, Any] = {}
    verdict = "neither"
    for name, key, array in BLOCKS:
        if ref.get(array) is None or port.get(array) is None:
            continue
        found = stage(f"layer {layer} {name}", layer + 1, ref[array][layer], port[array][layer], limit)
        out[key] = found.to_json()
        if found.over and verdict == "neither":
            verdict = name
    return {**out, "verdict": verdict}


__all__ = ["BLOCKS", "Stage", "budget", "first_divergent", "inside_layer", "noise_floor", "row_nmse", "stage", "stages",
           "sublayer_budget"]
