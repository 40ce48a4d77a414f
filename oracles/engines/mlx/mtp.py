"""The MTP port (``mlx-vlm-mtp``): mlx-vlm's own Inkling model and its ``inkling_mtp`` drafter with
``mlx_vlm/speculative/mtp.py``'s rounds, float32, on MLX's default device, serving the MTP drafting
capability (:class:`oracles.engines.systems.MtpDrafting`).

Loads the verified snapshot with ``mlx_vlm.utils.load`` (the trunk) and
``mlx_vlm.speculative.drafters.load_drafter`` (the MTP layer, split in memory from the same
checkpoint by mlx-vlm's ``InklingMTPSplitter``: ``model.mtp.*`` and the trunk's final norm), then
``bind`` s the drafter to the trunk as mlx-vlm's ``_mtp_rounds`` does (``reset``).

* trunk (``mtp_trunk``, and ``forward`` for the engine contract): ``model.language_model(ids, cache,
  return_hidden=True)``, the call mlx-vlm's speculative prefill and verify make; the state it gives the
  MTP layer is the trunk's *pre-norm* last layer output (``hidden_states=[pre_norm]``), which mlx-vlm's
  drafter reads; ``forward``'s hidden is the final norm of it, what the head reads;
* one MTP step (``mtp_draft``): the drafter's own ``_forward_seq(tokens, hidden, block, dtype)`` on a
  cache list of its ``make_cache`` (``CacheList(KVCache, ArraysCache(4))`` a block) and its
  ``_block_logits`` (trunk final norm, muP division, shared head: ``mtp_head``);
* rollback: the caches hold short-convolution states (``ArraysCache``) that cannot be cut (``trim``
  cuts nothing), so a round is rolled back the way mlx-vlm's own ``rollback_speculative_cache`` /
  ``accept_verified_tokens`` do: ``_snapshot_cache_state`` before, ``_restore_cache_state`` (into a
  fresh cache of the same kind) and a replay of the kept inputs after.

The library's own MTP generation (``mtp_generate``) is ``mlx_vlm.generate.ar.generate_step(...,
draft_model=drafter, draft_kind="mtp")`` against the same call without a drafter; the drafter's
``accept_lens`` / ``draft_lens`` are its own acceptance counts. Its measured gaps against transformers
are :meth:`MlxVlmMtp.known_gap`'s.

Import needs (recorded in :meth:`MlxVlmMtp.describe`): ``mlx_vlm.models.inkling`` imports
``mlx_audio.dsp`` at package import (its audio feature extractor); mlx-audio 0.6.2 is installed
``--no-deps`` (its ``dsp`` module needs numpy and mlx only). mlx and mlx-vlm are imported when the
engine is built, so the registry can import this file.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, MtpGeneration, Prompt, Step, check_forward_length, hub_offline

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

#: The modules mlx-vlm's Inkling path imports that its own requirements do not bring (checked by
#: :meth:`MlxVlmMtp.unavailable_reason`).
NEEDS = ("mlx", "mlx_vlm", "mlx_audio")
MODEL_CLASS = "InklingForConditionalGeneration"
#: The test this port's measured draft gap is expected in (its parameters: record, pin, engine).
DRAFT_TEST = "test_mtp_draft_logits_port_vs_reference"
#: Measured on mtp-twin (mlx-vlm 0.7.10 vs transformers 5.24, first round, depth 0): mlx-vlm's Inkling
#: drafter applies the trunk's final RMSNorm to the MTP layer's output before the head
#: (``InklingMTPDraftModel._block_logits``); transformers' ``MtpModel`` for Inkling
#: (``chain_hidden_post_norm`` False) applies none. The draft token agrees; the logits do not.
DRAFT_NORM_GAP = ("mlx-vlm's Inkling drafter normalises the MTP output with the trunk's final norm before the "
                  "head, transformers' MtpModel does not: first-round depth-0 draft logits max |Δ| 2.5e-3, "
                  "NMSE ~5e-5 over the float32 bound 1e-6 (same argmax), from round 0")
#: The pin the gap was measured on.
PIN = "mtp-twin"


class _History(list[Any]):
    """A drafter cache list: the kind a snapshot of it restores into (a trunk cache is a plain list)."""


class MlxVlmMtp(Engine):
    """mlx-vlm's Inkling trunk and MTP drafter on one snapshot (module docstring).

    Raises:
        ValueError: mlx-vlm finds no MTP splitter for the snapshot's config (its own message).
        TypeError: a loaded parameter is not float32.
    """

    id = "mlx-vlm-mtp"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """The first of :data:`NEEDS` missing here and how to install it, or None."""
        for module in NEEDS:
            if importlib.util.find_spec(module) is None:
                extra = "pip install --no-deps mlx-audio==0.6.2" if module == "mlx_audio" else "make setup"
                return f"{module} is not installed ({extra})"
        return None

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        if pin.model_class != MODEL_CLASS:
            return f"mlx-vlm's MTP drafter here is Inkling's; pin {pin.name} is {pin.model_class}"
        return None

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        hub_offline()
        import mlx.core as mx
        from mlx_vlm.speculative.drafters import load_drafter
        from mlx_vlm.utils import load

        from oracles.engines.mlx.cohort import flat_parameters

        self._mx = mx
        self.model, processor = load(str(self.root))
        dtypes = {str(v.dtype) for _, v in flat_parameters(self.model)}
        if dtypes != {"mlx.core.float32"}:
            raise TypeError(f"mlx-vlm MTP port of {self.pin}: parameters are {sorted(dtypes)}, not float32 only")
        self.drafter: Any
        self.drafter, self.kind = load_drafter(str(self.root))
        self.drafter.reset(self.model)
        self.lm = self.model.language_model
        self.mtp_layers = len(self.drafter.blocks)
        self.tokenizer = processor.tokenizer
        text = json.loads((self.root / "config.json").read_text())["text_config"]
        self.vocab_size, self.hidden_size = int(text["vocab_size"]), int(text["hidden_size"])
        self.num_layers = len(self.lm.model.layers)
        self.max_context = int(text.get("max_position_embeddings", 0) or 0)
        eos = text.get("eos_token_id")
        self.eos_token_ids = frozenset(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {**super().describe(), "model_class": type(self.model).__name__, "drafter": type(self.drafter).__name__,
                "draft_kind": self.kind, "mtp_layers": self.mtp_layers, "mlx": version("mlx"),
                "mlx_vlm": version("mlx-vlm"), "mlx_audio": version("mlx-audio"), "dtype": "float32",
                "device": str(self._mx.default_device()), "threads": self.threads or None, "library_patches": [],
                "import_needs": ["mlx_audio.dsp (mlx-audio 0.6.2, --no-deps)"],
                "import_side_effects": ["mlx_audio/__init__.py sets TRANSFORMERS_NO_ADVISORY_WARNINGS=1"],
                "mtp_state": "pre-norm (mlx-vlm's return_hidden)"}

    def known_gap(self, oracle: str, any_pin: bool = False) -> str | None:
        """:data:`DRAFT_NORM_GAP` on the draft-logits test (any record, under this engine's own id, so an
        adapter built on this one expects it too), on :data:`PIN` (any pin with ``any_pin``)."""
        if oracle.startswith(f"{DRAFT_TEST}[") and f"-{self.id}" in oracle and (any_pin or self.pin == PIN):
            return DRAFT_NORM_GAP
        return None

    # -- caches ----------------------------------------------------------------------------------
    def make_cache(self) -> list[Any]:
        return list(self.lm.make_cache())

    def mtp_trunk_cache(self) -> list[Any]:
        return self.make_cache()

    def mtp_history_cache(self) -> _History:
        return _History(self.drafter.make_cache())

    def cache_length(self, cache: Any) -> int:
        return int(cache[0].caches[0].offset) if cache else 0

    def snapshot(self, cache: Any) -> Any:
        """mlx-vlm's ``_snapshot_cache_state`` (copies), and the kind of cache it came from."""
        from mlx_vlm.models.inkling.language import _snapshot_cache_state

        return isinstance(cache, _History), _snapshot_cache_state(cache)

    def restore(self, snapshot: Any) -> Any:
        """A fresh cache of the snapshot's kind, filled by mlx-vlm's ``_restore_cache_state`` (it copies)."""
        from mlx_vlm.models.inkling.language import _restore_cache_state

        history, state = snapshot
        cache = self.mtp_history_cache() if history else self.make_cache()
        _restore_cache_state(cache, state)
        return cache

    # -- forwards --------------------------------------------------------------------------------
    def _np(self, a: Any) -> np.ndarray:
        return np.ascontiguousarray(np.array(a.astype(self._mx.float32)), dtype=np.float32)

    def _trunk(self, ids: Sequence[int], cache: Any) -> tuple[Any, Any]:
        mx = self._mx
        out = self.lm(mx.array([list(ids)]), cache=cache, return_hidden=True)
        return out.logits, out.hidden_states[-1]

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """The trunk over a text prompt: logits ``[T, V]`` and the final norm's output ``[T, D]``.

        Raises:
            Unsupported: ``layers=True``, or pictures (the MTP port runs the text trunk).
        """
        ids = self.text_ids(prompt)
        check_forward_length(self, self.cache_length(cache), len(ids))
        if layers:
            raise self._unsupported("tap its layers")
        logits, pre = self._trunk(ids, cache)
        hidden = self.lm.model.norm(pre)
        self._mx.eval(logits, hidden)
        lg, hd = self._np(logits[0]), self._np(hidden[0])
        return Step(logits=lg[-keep:] if keep else lg, hidden=hd[-keep:] if keep else hd)

    def mtp_trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        """(logits ``[T, V]``, pre-norm trunk state ``[T, D]``) float32 of ``ids`` after ``cache``."""
        logits, pre = self._trunk(ids, cache)
        self._mx.eval(logits, pre)
        return self._np(logits[0]), self._np(pre[0])

    def mtp_draft(self, tokens: Sequence[int], state: np.ndarray, start: int, history: Any,
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The drafter's block ``min(depth, L-1)`` over ``n`` pairs
        (:meth:`oracles.engines.systems.MtpDrafting.mtp_draft`).

        Raises:
            ValueError: ``start`` is not where ``history`` stands (mlx caches keep their own offsets, so a
                wrong position would otherwise be silently ignored).
        """
        mx = self._mx
        if self.cache_length(history) + 1 != start:
            raise ValueError(f"{self.id}: MTP step at position {start}, but the history holds "
                             f"{self.cache_length(history)} pairs")
        self.drafter._cache = history
        h = self.drafter._forward_seq(mx.array([list(tokens)]), mx.array(np.asarray(state, dtype=np.float32))[None],
                                      min(depth, self.mtp_layers - 1), mx.int32)
        logits = self.drafter._block_logits(h)
        mx.eval(h, logits)
        return self._np(logits[0]), self._np(h[0])

    def mtp_head(self, state: np.ndarray) -> np.ndarray:
        """The drafter's ``_block_logits`` of MTP states ``[n, D]`` (the trunk's final norm, muP division, head)."""
        logits = self.drafter._block_logits(self._mx.array(np.asarray(state, dtype=np.float32))[None])
        self._mx.eval(logits)
        return self._np(logits[0])

    # -- the library's own -----------------------------------------------------------------------
    def _generate(self, ids: Sequence[int], max_new_tokens: int, draft: bool) -> list[int]:
        mx = self._mx
        from mlx_vlm.generate.ar import generate_step

        kw: dict[str, Any] = {"draft_model": self.drafter, "draft_kind": "mtp"} if draft else {}
        out: list[int] = []
        for tok, _ in generate_step(mx.array([list(ids)]), self.model, None, None, max_tokens=max_new_tokens,
                                    sampler=lambda x: mx.argmax(x, axis=-1), **kw):
            out.append(int(tok))
            if len(out) >= max_new_tokens:
                break
        return out

    def mtp_generate(self, ids: Sequence[int], max_new_tokens: int) -> MtpGeneration:
        """mlx-vlm's greedy ``generate_step`` and its MTP speculative path from the same prompt."""
        greedy = self._generate(ids, max_new_tokens, False)
        tokens = self._generate(ids, max_new_tokens, True)
        acc, drafted = [int(a) for a in self.drafter.accept_lens], [int(d) for d in self.drafter.draft_lens]
        self.drafter.reset(self.model)
        return MtpGeneration(tokens=tokens, greedy=greedy, forwards=len(acc) + 1, accepted=sum(acc),
                             drafted=sum(drafted), extra={"accept_lens": acc, "draft_lens": drafted})
