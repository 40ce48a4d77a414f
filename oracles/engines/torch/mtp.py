"""The reference's multi-token-prediction capability: transformers' own ``MtpModel`` and ``MtpCache`` on
the trunk :class:`~oracles.engines.torch.reference.TorchReference` loaded, float32, numpy at the boundary.

``MtpModel.from_pretrained(trunk)`` reads the MTP layers from the snapshot the trunk came from (the
tensors matched by the trunk class's ``_keys_to_ignore_on_load_unexpected``, ``model.mtp.*`` for
Inkling) and shares the trunk's embedding and head. One MTP step at depth ``j`` is
``MtpModel.forward_layer(min(j, L-1), hidden, position_ids, mtp_cache, input_ids=tokens)``: the layer
pairs each trunk (or previous-depth) hidden state at position ``i`` with the embedding of the token at
``i + 1`` and predicts the token at ``i + 2``; its logits are ``MtpModel._project_to_logits`` (the
shared head after the trunk's muP division). Caches are recorded (``activate_past_recording``) so the
trunk's and the MTP layer's short-convolution states can be cropped back after a rejected draft.

The library's own MTP generation is ``generate(..., use_mtp=True)`` (transformers'
``MTPCandidateGenerator``: one draft per MTP layer a round). torch and transformers are imported
when a head is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np


def _f4(t: Any) -> np.ndarray:
    return np.ascontiguousarray(t.detach().to("cpu").float().numpy(), dtype=np.float32)


@dataclass
class LibraryMtpRun:
    """A library's own greedy generation with and without its MTP drafter.

    tokens: the MTP run's new tokens; greedy: the plain greedy run's; forwards: the trunk forwards the
    MTP run made (prefill included); accepted / drafted: the library's own counts (mlx-vlm's drafter),
    or derived from ``forwards`` where it keeps none (transformers; a round capped by the token limit
    may count a draft it did not use).
    """

    tokens: list[int]
    greedy: list[int]
    forwards: int
    accepted: int | None = None
    drafted: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def load_reference(root: Any, model_class: str, threads: int = 0) -> TorchMtp:
    """The pin's transformers class (``model_class``, e.g. ``InklingForConditionalGeneration``) from the
    verified snapshot ``root``, float32 on the CPU (``torch.set_num_threads(threads)`` when > 0), with
    its MTP head. (``TorchReference`` cannot load this twin: its vision path reads Qwen-VL's
    ``spatial_merge_size``, which Inkling's vision config has not; a pin it loads gets the same head
    from ``TorchReference.mtp``.)

    Raises:
        AttributeError: transformers has no class of that name (the pin names another library's).
    """
    import torch
    import transformers

    from oracles.engines.base import hub_offline

    hub_offline()
    if threads > 0:
        torch.set_num_threads(threads)
    model = getattr(transformers, model_class).from_pretrained(root, dtype="float32").eval()
    return TorchMtp(model)


class TorchMtp:
    """The MTP head of a loaded transformers model (shares its embedding, head and device).

    Args:
        model: a transformers model whose text config has ``num_mtp_layers`` (the trunk).

    Raises:
        ValueError: the model has no MTP layers (transformers' own message).
        RuntimeError: MTP weights missing from the snapshot (transformers' own message).
    """

    library = "transformers"

    def __init__(self, model: Any) -> None:
        import torch
        from transformers.modeling_layers import MtpModel

        self._torch = torch
        self.model = model
        cfg = model.config.get_text_config()
        if getattr(cfg, "num_mtp_layers", None) is None:
            raise ValueError(f"{type(model).__name__}: config has no num_mtp_layers (no MTP weights)")
        self.num_layers = int(cfg.num_mtp_layers)
        self.mtp = MtpModel.from_pretrained(model).float().eval()
        self._calls = 0
        model.register_forward_hook(self._count)

    def _count(self, *_: Any) -> None:
        self._calls += 1

    def describe(self) -> dict[str, Any]:
        return {"mtp_class": type(self.mtp).__name__, "mtp_layers": self.num_layers,
                "mtp_parameters": int(sum(p.numel() for n, p in self.mtp.named_parameters()
                                          if n.startswith("layers.")))}

    # -- caches ----------------------------------------------------------------------------------
    def trunk_cache(self) -> Any:
        """A recorded ``DynamicCache`` (croppable through the short convolutions' states)."""
        from transformers import DynamicCache

        cache = DynamicCache(config=self.model.config)
        cache.activate_past_recording()
        return cache

    def mtp_cache(self) -> Any:
        """A recorded ``MtpCache`` of the MTP config (the MTP history)."""
        from transformers.cache_utils import MtpCache

        cache = MtpCache(config=self.model.config.get_mtp_config())
        cache.activate_past_recording()
        return cache

    @staticmethod
    def length(cache: Any) -> int:
        return int(cache.get_seq_length())

    @staticmethod
    def trim(cache: Any, n: int) -> bool:
        """Drop the last ``n`` entries (``crop(-n)``; recorded caches always can): True."""
        if n:
            cache.crop(-n)
        return True

    @staticmethod
    def snapshot(cache: Any) -> Any:
        """Nothing to keep: a recorded cache is trimmed, never restored."""
        return None

    @staticmethod
    def restore(cache: Any, saved: Any) -> None:
        raise RuntimeError("a recorded transformers cache is trimmed, never restored")

    # -- forwards --------------------------------------------------------------------------------
    def trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        """The trunk on ``ids`` after what ``cache`` holds: (logits [T, V], last hidden state [T, D]),
        float32; the hidden state is ``hidden_states[-1]``, what transformers' MTP generator reads."""
        torch = self._torch
        with torch.inference_mode():
            out = self.model(input_ids=torch.tensor([list(ids)]), cache=cache, use_cache=True,
                             output_hidden_states=True)
        return _f4(out.logits[0]), _f4(out.hidden_states[-1][0])

    def draft(self, tokens: Sequence[int], hidden: np.ndarray, start: int, cache: Any,
              depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One MTP layer over ``n`` pairs: ``hidden`` [n, D] float32 (the states at positions
        ``start - 1 ..``), ``tokens`` the n tokens at positions ``start ..``. Returns (draft logits
        [n, V], the layer's hidden state [n, D]); row ``r`` predicts the token at ``start + r + 1``."""
        torch = self._torch
        pos = torch.arange(start, start + len(tokens))[None]
        with torch.inference_mode():
            h = self.mtp.forward_layer(min(depth, self.num_layers - 1), torch.from_numpy(np.ascontiguousarray(hidden))[None],
                                       pos, cache, input_ids=torch.tensor([list(tokens)]))
            logits = self.mtp._project_to_logits(h)
        return _f4(logits[0]), _f4(h[0])

    def logits_after_final_norm(self, hidden: np.ndarray) -> np.ndarray:
        """``[n, V]``: the MTP head's logits with the trunk's final norm applied first (what mlx-vlm's
        Inkling drafter does, ``_block_logits``); transformers' own head applies none here."""
        torch = self._torch
        with torch.inference_mode():
            h = self.model.get_decoder().norm(torch.from_numpy(np.ascontiguousarray(hidden)))
            return _f4(self.mtp._project_to_logits(h))

    @staticmethod
    def normed(hidden: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
        """RMSNorm of ``hidden`` [n, D] (float32 in, float64 inside): ``w * x / sqrt(mean(x^2) + eps)``."""
        x = hidden.astype(np.float64)
        return (weight * x / np.sqrt((x * x).mean(-1, keepdims=True) + eps)).astype(np.float32)

    def final_norm_weight(self) -> tuple[np.ndarray, float]:
        """The trunk's final RMSNorm (weight [D] float32, eps)."""
        norm = self.model.get_decoder().norm
        return _f4(norm.weight), float(norm.variance_epsilon)

    # -- the library's own -----------------------------------------------------------------------
    def generate(self, ids: Sequence[int], max_new_tokens: int) -> LibraryMtpRun:
        """transformers' greedy ``generate`` and ``generate(use_mtp=True)`` from the same prompt."""
        torch = self._torch
        x = torch.tensor([list(ids)])
        with torch.inference_mode():
            greedy = self.model.generate(x, max_new_tokens=max_new_tokens, do_sample=False)[0, len(ids):].tolist()
            self._calls = 0
            mtp = self.model.generate(x, max_new_tokens=max_new_tokens, do_sample=False, use_mtp=True)
        tokens = mtp[0, len(ids):].tolist()
        # transformers keeps no acceptance count: the prefill makes the first token and each later trunk
        # forward (a round, one draft per MTP layer) commits its accepted drafts plus one token.
        rounds = self._calls - 1
        return LibraryMtpRun(tokens=tokens, greedy=greedy, forwards=self._calls, accepted=len(tokens) - 1 - rounds,
                             drafted=rounds * self.num_layers, extra={"counts": "derived from trunk forwards"})
