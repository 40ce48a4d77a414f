"""Layer taps: the residual stream and, inside each decoder layer, the token mixer's (attention) and
the MLP's outputs, for one cold prefill (``Engine.taps``).

A decoder layer of the families here is two residual blocks (transformers' ``LlamaDecoderLayer`` and
``Qwen3_5DecoderLayer``, mlx-lm's ``TransformerBlock``)::

    h   = x + mixer(input_layernorm(x))          # mixer: self-attention or linear attention
    out = h + mlp(post_attention_layernorm(h))

so ``attn[l]`` and ``mlp[l]`` are the two terms each block adds, and ``stream[l + 1] == (stream[l] +
attn[l]) + mlp[l]`` in float32, bit for bit (the test of this capability). The torch side taps them
with forward hooks on the mixer and MLP modules; the MLX side stands a recorder in for each module
for the call (mlx-lm's model call returns only the final norm's output), as
:class:`oracles.engines.mlx_port._LayerTap` does for whole layers.

Module top imports numpy only; torch and mlx are imported inside the functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

if TYPE_CHECKING:
    from oracles.engines.mlx_port import MlxPort
    from oracles.engines.torch_ref import TorchReference

#: Attribute names a decoder layer's token mixer goes by, in the order they are tried: attention
#: (Llama, Qwen3.5's full-attention layers), Gated DeltaNet linear attention (Qwen3.5), and the names
#: other families in transformers and mlx-lm use.
MIXER_NAMES = ("self_attn", "linear_attn", "attention", "mixer", "attn")
#: Attribute names of a layer's MLP.
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe")


@dataclass
class Taps:
    """One cold prefill of ``T`` tokens through ``L`` decoder layers, every array float32.

    stream: ``[L + 1, T, D]``, the residual stream after the embedding (row 0) and after each layer.
    attn: ``[L, T, D]``, what layer ``l``'s token mixer (attention) added to the stream.
    mlp: ``[L, T, D]``, what layer ``l``'s MLP added.
    hidden: ``[T, D]``, the final norm's output (what the head read).
    logits: ``[T, V]``, the head's output.
    mixers: per layer, the attribute name of its token mixer (``self_attn`` / ``linear_attn``).
    down_in_absmax: ``[L]``, max |x| of each layer's MLP down-projection input (the widest activation in
    a gated MLP, what an fp16 port overflows first), where the engine taps it; else None.
    """

    stream: np.ndarray
    attn: np.ndarray
    mlp: np.ndarray
    hidden: np.ndarray
    logits: np.ndarray
    mixers: list[str]
    down_in_absmax: np.ndarray | None = None


def find_child(layer: Any, names: Sequence[str], what: str) -> str:
    """The first of ``names`` that ``layer`` has as a child module.

    Raises:
        LookupError: none of them (names the layer's class and what was looked for).
    """
    for name in names:
        if _child(layer, name) is not None:
            return name
    raise LookupError(f"{type(layer).__name__} has no {what} child named any of {', '.join(names)}")


def _child(layer: Any, name: str) -> Any:
    # mlx modules are dicts of children; torch modules keep them in _modules.
    if isinstance(layer, dict):
        return layer.get(name)
    return getattr(layer, "_modules", {}).get(name)


def torch_taps(engine: TorchReference, ids: Sequence[int]) -> Taps:
    """Taps of a :class:`oracles.engines.torch_ref.TorchReference` (or an engine that wraps its model
    and has the same ``forward(layers=True)``): forward hooks on each layer's mixer and MLP and a pre-hook
    on the MLP's ``down_proj`` (its input's absmax), removed before returning.

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
            mlp = _child(layer, find_child(layer, MLP_NAMES, "MLP"))
            handles.append(_child(layer, mixer).register_forward_hook(keep("attn", i)))
            handles.append(mlp.register_forward_hook(keep("mlp", i)))
            if (proj := _child(mlp, "down_proj")) is not None:  # transformers' gated MLPs name it so
                handles.append(proj.register_forward_pre_hook(peak(i)))
        step = engine.forward(list(ids), layers=True)
    finally:
        for h in handles:
            h.remove()
    taps = _assemble(step, rows, len(layers), mixers, lambda t: t.detach().float().cpu().numpy())
    if all(v is not None for v in down):
        taps.down_in_absmax = np.asarray(down, dtype=np.float32)
    return taps


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


def mlx_taps(engine: MlxPort, ids: Sequence[int]) -> Taps:
    """Taps of an :class:`oracles.engines.mlx_port.MlxPort`: each layer's mixer and MLP are replaced by
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
    return _assemble(step, rows, len(layers), mixers, lambda a: np.array(a.astype(mx.float32)))


def _assemble(step: Any, rows: dict[tuple[str, int], Any], n: int, mixers: list[str], to_numpy: Any) -> Taps:
    missing = [f"{k}[{i}]" for i in range(n) for k in ("attn", "mlp") if (k, i) not in rows]
    if missing:
        raise LookupError(f"layer taps: no output recorded for {', '.join(missing[:4])} (of {len(missing)})")
    attn = np.stack([to_numpy(rows[("attn", i)])[0] for i in range(n)]).astype("<f4")
    mlp = np.stack([to_numpy(rows[("mlp", i)])[0] for i in range(n)]).astype("<f4")
    return Taps(stream=step.layers, attn=attn, mlp=mlp, hidden=step.hidden, logits=step.logits, mixers=mixers)


__all__ = ["MIXER_NAMES", "MLP_NAMES", "Taps", "find_child", "mlx_taps", "torch_taps"]
