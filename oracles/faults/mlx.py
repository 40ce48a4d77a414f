"""Fault kinds for the MLX port: each edits a loaded :class:`oracles.engines.mlx.lm.MlxPort`'s mlx-lm
model in place for the length of a call and undoes it after, as :mod:`oracles.faults.kinds` does for
a transformers model, so one loaded (quantized) port serves the faithful run and every fault.

An mlx ``nn.Module`` keeps its parameters and children in its own dict: assigning an array or a
module to an attribute replaces that entry, assigning a plain object moves the name out of the dict
for as long as it is there, and assigning the original back restores it. A quantized layer
(``QuantizedLinear``) is swapped as a module, its packed weights, scales and biases untouched.

:class:`MlxFaultPort` is the port with one of them in force (:class:`oracles.faults.port.FaultPort`'s
calls, over an MLX engine). mlx is imported inside the methods.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any, ClassVar, Iterator

from oracles.faults.kinds import LIBRARY_ROPE_BASE, Fault, swapped
from oracles.faults.port import FaultPort

if TYPE_CHECKING:
    from oracles.engines.mlx.lm import MlxPort


def inner(engine: MlxPort) -> Any:
    """The mlx-lm decoder (``model.model``: embed_tokens, layers, norm)."""
    return engine.model.model


class NormScaled(Fault):
    """One layer's input RMSNorm weight multiplied by :attr:`factor` (a norm weight loaded with a
    scale, or ``1 + w`` for ``w``), in the middle layer. The panel's smallest faults: 1.01 and 1.05."""

    name: ClassVar[str] = "norm_scaled"

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.name = f"norm_scaled_{factor:g}"  # type: ignore[misc]  # one kind per factor
        self.title = f"one layer's input RMSNorm weight scaled by {factor:g}"

    def layer(self, engine: MlxPort) -> int:
        return int(engine.num_layers) // 2

    def why_not(self, engine: Any) -> str | None:
        norm = getattr(inner(engine).layers[self.layer(engine)], "input_layernorm", None)
        return None if norm is not None and "weight" in norm else "no input_layernorm with a weight"

    def stage(self, engine: Any) -> str | None:
        return f"layer {self.layer(engine)}"

    @contextlib.contextmanager
    def applied(self, engine: Any) -> Iterator[None]:
        norm = inner(engine).layers[self.layer(engine)].input_layernorm
        with swapped(norm, "weight", norm.weight * self.factor):
            yield


class MlxGateUpSwapped(Fault):
    """The MLP's gate and up projections swapped (one tensor-name mapping wrong) in the middle layer:
    the two (quantized) modules trade places."""

    name = "gate_up_swapped"
    title = "MLP gate and up projections swapped"

    def layer(self, engine: MlxPort) -> int:
        return int(engine.num_layers) // 2

    def why_not(self, engine: Any) -> str | None:
        mlp = getattr(inner(engine).layers[self.layer(engine)], "mlp", None)
        return None if mlp is not None and "gate_proj" in mlp and "up_proj" in mlp else "no gate_proj/up_proj MLP"

    def stage(self, engine: Any) -> str | None:
        return f"layer {self.layer(engine)}"

    @contextlib.contextmanager
    def applied(self, engine: Any) -> Iterator[None]:
        mlp = inner(engine).layers[self.layer(engine)].mlp
        gate, up = mlp.gate_proj, mlp.up_proj
        with swapped(mlp, "gate_proj", up), swapped(mlp, "up_proj", gate):
            yield


class _Identity:
    """Stands in for the final norm: returns its input."""

    def __call__(self, x: Any, *args: Any, **kwargs: Any) -> Any:
        return x


class MlxFinalNormSkipped(Fault):
    name = "final_norm_skipped"
    title = "the final norm skipped: the head reads the raw residual stream"

    def stage(self, engine: Any) -> str | None:
        return "final norm"

    @contextlib.contextmanager
    def applied(self, engine: Any) -> Iterator[None]:
        with swapped(inner(engine), "norm", _Identity()):
            yield


class MlxRopeBaseDefault(Fault):
    """Every attention layer's rotary embedding at the library default base: what ``mlx_lm.load(path)``
    runs on a transformers-5 config (``oracles/suite/test_as_shipped.py``)."""

    name = "rope_base_default"
    title = f"rotary base read from the wrong config key: the library default {LIBRARY_ROPE_BASE:,.0f}"

    def _ropes(self, engine: Any) -> list[tuple[int, Any]]:
        """(layer index, its attention's ``nn.RoPE``) of each layer whose attention has one."""
        import mlx.nn as nn

        out = []
        for i, layer in enumerate(inner(engine).layers):
            rope = getattr(getattr(layer, "self_attn", None), "rope", None)
            if isinstance(rope, nn.RoPE):
                out.append((i, rope))
        return out

    def why_not(self, engine: Any) -> str | None:
        ropes = self._ropes(engine)
        if not ropes:
            return "no attention layer with an nn.RoPE (a scaled rotary class, or none)"
        if all(float(r.base) == LIBRARY_ROPE_BASE for _, r in ropes):
            return f"its rotary base is the library default {LIBRARY_ROPE_BASE:g} already"
        return None

    def stage(self, engine: Any) -> str | None:
        return f"layer {self._ropes(engine)[0][0]}"

    @contextlib.contextmanager
    def applied(self, engine: Any) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for _, rope in self._ropes(engine):
                stack.enter_context(swapped(rope, "base", LIBRARY_ROPE_BASE))
            yield


#: The MLX fault kinds, name -> a factory of the fault (the norm faults at their factors).
MLX_FAULTS: dict[str, Any] = {f.name: f for f in (
    NormScaled(1.01), NormScaled(1.05), MlxGateUpSwapped(), MlxFinalNormSkipped(), MlxRopeBaseDefault())}


class MlxFaultPort(FaultPort):
    """An :class:`oracles.engines.mlx.lm.MlxPort` with ``fault`` (one of :data:`MLX_FAULTS`) in force
    during every call; every call is :class:`oracles.faults.port.FaultPort`'s.

    Raises:
        TypeError: ``base`` is not an MlxPort.
        oracles.engines.base.Unsupported: the fault cannot be injected into ``base`` (named).
    """

    def __init__(self, base: Any, fault: Fault) -> None:
        from oracles.engines.mlx.lm import MlxPort

        if not isinstance(base, MlxPort):
            raise TypeError(f"engine {base.id!r} ({type(base).__name__}): an MLX fault is injected into an MlxPort")
        self._adopt(base, fault)  # FaultPort.__init__ checks for a transformers engine; the set-up is the same


def mlx_fault_port(name: str, base: Any) -> MlxFaultPort:
    """The MLX port ``base`` with fault ``name`` of :data:`MLX_FAULTS` in force.

    Raises:
        KeyError: an unknown name (the known ones listed).
        TypeError, oracles.engines.base.Unsupported: see :class:`MlxFaultPort`.
    """
    if name not in MLX_FAULTS:
        raise KeyError(f"unknown MLX fault {name!r}; known: {', '.join(MLX_FAULTS)}")
    return MlxFaultPort(base, MLX_FAULTS[name])


__all__ = ["MLX_FAULTS", "MlxFaultPort", "MlxFinalNormSkipped", "MlxGateUpSwapped", "MlxRopeBaseDefault", "NormScaled",
           "mlx_fault_port"]
