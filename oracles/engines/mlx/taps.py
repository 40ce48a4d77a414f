"""Layer taps of the MLX port: a recorder stands in for each decoder layer's token mixer and MLP for
one call (what :class:`oracles.engines.taps.Taps` holds and why the taps add up to the residual stream)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oracles.engines.taps import MIXER_NAMES, MLP_NAMES, Tapped, Taps, assemble, find_child


class _Recorder:
    """Stands in for one mlx module during the call: calls it and keeps its output."""

    def __init__(self, module: Any, rows: dict[tuple[str, int], Any], key: tuple[str, int]) -> None:
        self._module, self._rows, self._key = module, rows, key

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._module(*args, **kwargs)
        self._rows[self._key] = out
        return out

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._module, attr)


def mlx_taps(engine: Tapped, ids: Sequence[int]) -> Taps:
    """Taps of an :class:`oracles.engines.mlx.lm.MlxPort`: each layer's mixer and MLP are replaced by
    a :class:`_Recorder` for one ``forward(layers=True)`` and put back after (an mlx ``Module`` keeps
    children in its dict; assigning a plain object moves the name out of it, assigning the module back
    moves it in again).

    Raises:
        LookupError: a layer without a recognised mixer or MLP child.
    """
    import mlx.core as mx

    layers = list(engine.model.model.layers)
    mixers = [find_child(layer, MIXER_NAMES, "token mixer") for layer in layers]
    mlps = [find_child(layer, MLP_NAMES, "MLP") for layer in layers]
    rows: dict[tuple[str, int], Any] = {}
    saved = []
    try:
        for i, layer in enumerate(layers):
            for kind, name in (("attn", mixers[i]), ("mlp", mlps[i])):
                module = layer[name]
                saved.append((layer, name, module))
                setattr(layer, name, _Recorder(module, rows, (kind, i)))
        step = engine.forward(list(ids), layers=True)
        mx.eval(*rows.values())
    finally:
        for layer, name, module in saved:
            setattr(layer, name, module)
    return assemble(step, rows, len(layers), mixers, lambda a: np.array(a.astype(mx.float32)))
