"""The reference's multi-token-prediction capability (:class:`oracles.engines.systems.MtpDrafting`):
transformers' own ``MtpModel`` and ``MtpCache`` on the trunk
:class:`~oracles.engines.torch.reference.TorchReference` loaded, float32, numpy at the boundary.

``MtpModel.from_pretrained(trunk)`` reads the MTP layers from the snapshot the trunk came from (the
tensors matched by the trunk class's ``_keys_to_ignore_on_load_unexpected``, ``model.mtp.*`` for
Inkling) and shares the trunk's embedding and head. One MTP step at depth ``j`` is
``MtpModel.forward_layer(min(j, L-1), hidden, position_ids, mtp_cache, input_ids=tokens)``: the layer
pairs each trunk (or previous-depth) state at position ``i`` with the embedding of the token at
``i + 1`` and predicts the token at ``i + 2``; its logits are ``MtpModel._project_to_logits`` (the
shared head after the trunk's muP division). The trunk state it reads is the trunk's
``hidden_states[-1]``, the final norm's output (the reference's ``Step.hidden``). Both caches are
recorded (``activate_past_recording``), as transformers' own MTP generator keeps them, so the
trunk's and the MTP layer's short-convolution states are cropped back after a rejected draft
(the reference's ``trim``).

The library's own MTP generation is ``generate(..., use_mtp=True)`` (transformers'
``MTPCandidateGenerator``: one draft per MTP layer a round). torch and transformers are imported
when the MTP model is first asked for.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from oracles.engines.base import Engine, MtpGeneration, Step
from oracles.engines.systems import MTP
from oracles.engines.torch.device import to_f4


class TorchMtp(Engine):
    """Mixin of :class:`oracles.engines.torch.reference.TorchReference`: the MTP capabilities of a loaded
    transformers model whose text config has ``num_mtp_layers`` (module docstring). Reads the reference's
    ``model`` and ``device``; the MTP model is built on first use and kept."""

    model: Any
    device: str
    _mtp_state: tuple[Any, list[int]] | None = None  # (MtpModel, [trunk forwards counted])

    def _mtp(self) -> Any:
        """transformers' ``MtpModel`` of this model, built once.

        Raises:
            Unsupported: the model's config has no ``num_mtp_layers`` (no MTP weights).
        """
        if self._mtp_state is None:
            from transformers.modeling_layers import MtpModel

            cfg = self.model.config.get_text_config()
            if getattr(cfg, "num_mtp_layers", None) is None:
                raise self._unsupported(MTP, f"pin {self.pin} ({type(self.model).__name__}) has no num_mtp_layers "
                                             "in its config (no MTP layer)")
            calls = [0]
            self.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
            self._mtp_state = (MtpModel.from_pretrained(self.model).float().eval(), calls)
        return self._mtp_state[0]

    @property
    def mtp_layers(self) -> int:
        """The MTP layers of this model's config (``num_mtp_layers``)."""
        self._mtp()
        return int(self.model.config.get_text_config().num_mtp_layers)

    def mtp_trunk_cache(self) -> Any:
        """A recorded ``DynamicCache`` (croppable through the short convolutions' states)."""
        from transformers import DynamicCache

        self._mtp()
        cache = DynamicCache(config=self.model.config)
        cache.activate_past_recording()
        return cache

    def mtp_history_cache(self) -> Any:
        """A recorded ``MtpCache`` of the MTP config (the MTP history)."""
        from transformers.cache_utils import MtpCache

        self._mtp()
        cache = MtpCache(config=self.model.config.get_mtp_config())
        cache.activate_past_recording()
        return cache

    def mtp_trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        """The trunk's forward (:meth:`forward`): logits ``[T, V]`` and the final norm's output ``[T, D]``,
        which is transformers' ``hidden_states[-1]``, the state its MTP layer reads."""
        self._mtp()
        step: Step = self.forward(list(ids), cache)
        return step.logits, step.hidden

    def mtp_draft(self, tokens: Sequence[int], state: np.ndarray, start: int, history: Any,
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """``MtpModel.forward_layer`` of layer ``min(depth, L-1)`` at positions ``start ..``
        (:meth:`oracles.engines.systems.MtpDrafting.mtp_draft`).

        Raises:
            ValueError: ``start`` is not where ``history`` stands.
        """
        import torch

        mtp = self._mtp()
        if self.cache_length(history) + 1 != start:
            raise ValueError(f"{self.id}: MTP step at position {start}, but the history holds "
                             f"{self.cache_length(history)} pairs")
        pos = torch.arange(start, start + len(tokens), device=self.device)[None]
        with torch.inference_mode():
            h = mtp.forward_layer(min(depth, self.mtp_layers - 1), self._state(state), pos, history,
                                  input_ids=self._ids_tensor([list(tokens)]))
            logits = mtp._project_to_logits(h)
        return to_f4(logits[0]), to_f4(h[0])

    def mtp_head(self, state: np.ndarray) -> np.ndarray:
        """``MtpModel._project_to_logits`` of MTP states ``[n, D]``: the shared head after the muP division."""
        import torch

        mtp = self._mtp()
        with torch.inference_mode():
            return to_f4(mtp._project_to_logits(self._state(state)[0]))

    def _ids_tensor(self, rows: Sequence[Sequence[int]]) -> Any:
        raise NotImplementedError  # the reference's

    def _state(self, state: np.ndarray) -> Any:
        import torch

        return torch.from_numpy(np.ascontiguousarray(state, dtype=np.float32)).to(self.device)[None]

    def mtp_generate(self, ids: Sequence[int], max_new_tokens: int) -> MtpGeneration:
        """transformers' greedy ``generate`` and ``generate(use_mtp=True)`` from the same prompt; the counts
        are derived from the trunk forwards (transformers keeps none)."""
        import torch

        self._mtp()
        assert self._mtp_state is not None
        calls = self._mtp_state[1]
        x = self._ids_tensor([list(ids)])
        with torch.inference_mode():
            greedy = self.model.generate(x, max_new_tokens=max_new_tokens, do_sample=False)[0, len(ids):].tolist()
            calls[0] = 0
            out = self.model.generate(x, max_new_tokens=max_new_tokens, do_sample=False, use_mtp=True)
        tokens = [int(t) for t in out[0, len(ids):].tolist()]
        # the prefill makes the first token and each later trunk forward (a round, one draft per MTP layer)
        # commits its accepted drafts plus one token; a round capped by the token limit may count a draft
        # it did not use
        forwards = calls[0]
        rounds = forwards - 1
        return MtpGeneration(tokens=tokens, greedy=[int(t) for t in greedy], forwards=forwards,
                             accepted=len(tokens) - 1 - rounds, drafted=rounds * self.mtp_layers,
                             extra={"counts": "derived from trunk forwards", "mtp_class": type(self._mtp()).__name__,
                                    "mtp_layers": self.mtp_layers})
