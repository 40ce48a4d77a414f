"""Layer taps of the torch reference: forward hooks on each decoder layer's token mixer and MLP
(what :class:`oracles.engines.taps.Taps` holds and why the taps add up to the residual stream)."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oracles.engines.taps import (
    ATTN_NORM_NAMES,
    MIXER_NAMES,
    MLP_NAMES,
    MLP_NORM_NAMES,
    Tapped,
    Taps,
    assemble,
    child,
    find_child,
)


def torch_taps(engine: Tapped, ids: Sequence[int]) -> Taps:
    """Taps of a :class:`oracles.engines.torch.reference.TorchReference` (or an engine that wraps its model
    and has the same ``forward(layers=True)``): forward hooks on each layer's mixer and MLP, on the norms
    before them where the layer names them (:data:`~oracles.engines.taps.ATTN_NORM_NAMES`,
    :data:`~oracles.engines.taps.MLP_NORM_NAMES`), and a pre-hook on the MLP's ``down_proj`` (its input's
    absmax), removed before returning.

    Raises:
        LookupError: a layer without a recognised mixer or MLP child.
    """
    layers = list(engine.model.get_decoder().layers)
    mixers = [find_child(layer, MIXER_NAMES, "token mixer") for layer in layers]
    rows: dict[tuple[str, int], Any] = {}

    def keep(kind: str, index: int) -> Any:
        def hook(_module: Any, _inputs: Any, output: Any) -> None:
            rows[(kind, index)] = output[0] if isinstance(output, tuple) else output
        return hook

    down: list[float | None] = [None] * len(layers)

    def peak(index: int) -> Any:
        def hook(_module: Any, args: Any) -> None:
            down[index] = max(down[index] or 0.0, float(args[0].detach().abs().max()))
        return hook

    handles = []
    try:
        for i, (layer, mixer) in enumerate(zip(layers, mixers)):
            mlp = child(layer, find_child(layer, MLP_NAMES, "MLP"))
            handles.append(child(layer, mixer).register_forward_hook(keep("attn", i)))
            handles.append(mlp.register_forward_hook(keep("mlp", i)))
            for kind, names in (("attn_norm", ATTN_NORM_NAMES), ("mlp_norm", MLP_NORM_NAMES)):
                norms = [child(layer, name) for name in names if child(layer, name) is not None]
                if norms:
                    handles.append(norms[0].register_forward_hook(keep(kind, i)))
            if (proj := child(mlp, "down_proj")) is not None:  # transformers' gated MLPs name it so
                handles.append(proj.register_forward_pre_hook(peak(i)))
        step = engine.forward(list(ids), layers=True)
    finally:
        for h in handles:
            h.remove()
    taps = assemble(step, rows, len(layers), mixers, lambda t: t.detach().float().cpu().numpy())
    if all(v is not None for v in down):
        taps.down_in_absmax = np.asarray(down, dtype=np.float32)
    return taps
