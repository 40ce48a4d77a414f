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
:class:`oracles.engines.mlx.lm._LayerTap` does for whole layers.

The framework-neutral part: the :class:`Taps` record, what a tap function reads of an engine (:class:`Tapped`)
and the child lookup. The tap functions live
beside their engines (:mod:`oracles.engines.torch.taps`, :mod:`oracles.engines.mlx.taps`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from oracles.engines.types import Prompt, Step

#: Attribute names a decoder layer's token mixer goes by, in the order they are tried: attention
#: (Llama, Qwen3.5's full-attention layers), Gated DeltaNet linear attention (Qwen3.5), and the names
#: other families in transformers and mlx-lm use.
MIXER_NAMES = ("self_attn", "linear_attn", "attention", "mixer", "attn")
#: Attribute names of a layer's MLP.
MLP_NAMES = ("mlp", "feed_forward", "block_sparse_moe")
#: Attribute names of the norm before a layer's token mixer (transformers' Llama and Qwen3.5 name it
#: ``input_layernorm``), and of the norm before its MLP.
ATTN_NORM_NAMES = ("input_layernorm", "attention_norm")
MLP_NORM_NAMES = ("post_attention_layernorm", "ffn_norm")


class Tapped(Protocol):
    """What a tap function reads of its engine (the torch reference and the MLX port have it, and so does an
    engine that wraps either's model): the framework's loaded ``model``, whose layers it taps, and a
    ``forward(..., layers=True)`` of it."""

    @property
    def model(self) -> Any: ...
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step: ...


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
    attn_norm, mlp_norm: ``[L, T, D]``, the output of the norm before layer ``l``'s token mixer and of
    the norm before its MLP (the normalised stream times the norm's weight: what each block read),
    where the engine taps them; else None. With them bisect tells a norm from the block after it.
    """

    stream: np.ndarray
    attn: np.ndarray
    mlp: np.ndarray
    hidden: np.ndarray
    logits: np.ndarray
    mixers: list[str]
    down_in_absmax: np.ndarray | None = None
    attn_norm: np.ndarray | None = None
    mlp_norm: np.ndarray | None = None


def find_child(layer: Any, names: Sequence[str], what: str) -> str:
    """The first of ``names`` that ``layer`` has as a child module.

    Raises:
        LookupError: none of them (names the layer's class and what was looked for).
    """
    for name in names:
        if child(layer, name) is not None:
            return name
    raise LookupError(f"{type(layer).__name__} has no {what} child named any of {', '.join(names)}")


def child(layer: Any, name: str) -> Any:
    # mlx modules are dicts of children; torch modules keep them in _modules.
    if isinstance(layer, dict):
        return layer.get(name)
    return getattr(layer, "_modules", {}).get(name)


def assemble(step: Any, rows: dict[tuple[str, int], Any], n: int, mixers: list[str],
             to_numpy: Callable[[Any], np.ndarray]) -> Taps:
    """The :class:`Taps` of one ``forward(layers=True)`` step and the per-layer outputs ``rows``
    (keyed ``("attn" | "mlp" | "attn_norm" | "mlp_norm", layer)``, each ``[1, T, D]``), converted by
    ``to_numpy``; a norm kept only where every layer's was recorded.

    Raises:
        LookupError: a layer whose mixer or MLP output was not recorded (the first four named).
    """
    missing = [f"{k}[{i}]" for i in range(n) for k in ("attn", "mlp") if (k, i) not in rows]
    if missing:
        raise LookupError(f"layer taps: no output recorded for {', '.join(missing[:4])} (of {len(missing)})")

    def stacked(kind: str) -> np.ndarray | None:
        if any((kind, i) not in rows for i in range(n)):
            return None
        return np.stack([to_numpy(rows[(kind, i)])[0] for i in range(n)]).astype("<f4")

    attn, mlp = stacked("attn"), stacked("mlp")
    assert attn is not None and mlp is not None  # checked above
    return Taps(stream=step.layers, attn=attn, mlp=mlp, hidden=step.hidden, logits=step.logits, mixers=mixers,
                attn_norm=stacked("attn_norm"), mlp_norm=stacked("mlp_norm"))


__all__ = ["ATTN_NORM_NAMES", "MIXER_NAMES", "MLP_NAMES", "MLP_NORM_NAMES", "Taps", "assemble", "child", "find_child"]
