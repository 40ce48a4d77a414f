"""The MTP port: mlx-vlm's own Inkling model and its ``inkling_mtp`` drafter with
``mlx_vlm/speculative/mtp.py``'s rounds, float32, on MLX's default device (engine id ``mlx-vlm-mtp``).

Loads the verified snapshot with ``mlx_vlm.utils.load`` (the trunk) and
``mlx_vlm.speculative.drafters.load_drafter`` (the MTP layer, split in memory from the same
checkpoint by mlx-vlm's ``InklingMTPSplitter``: ``model.mtp.*`` and the trunk's final norm), then
``bind`` s the drafter to the trunk as mlx-vlm's ``_mtp_rounds`` does (``reset``).

For the written-out rounds (:mod:`oracles.families.execution.mtp`):

* trunk: ``model.language_model(ids, cache, return_hidden=True)``, the call mlx-vlm's speculative
  prefill and verify make; its hidden state is the trunk's *pre-norm* last layer output
  (``hidden_states=[pre_norm]``), which mlx-vlm's drafter reads;
* one MTP step: the drafter's own ``_forward_seq(tokens, hidden, block, dtype)`` on a cache list of
  its ``make_cache`` (``CacheList(KVCache, ArraysCache(4))`` a block) and its ``_block_logits``
  (trunk final norm, muP division, shared head);
* rollback: the caches hold short-convolution states (``ArraysCache``) that cannot be cut, so a
  round is rolled back the way mlx-vlm's own ``rollback_speculative_cache`` /
  ``accept_verified_tokens`` do: ``_snapshot_cache_state`` before, ``_restore_cache_state`` and a
  replay of the kept inputs after.

The library's own MTP generation is ``mlx_vlm.generate.ar.generate_step(..., draft_model=drafter,
draft_kind="mtp")`` against the same call without a drafter; the drafter's ``accept_lens`` /
``draft_lens`` are its own acceptance counts.

Import needs (recorded in :meth:`MlxVlmMtp.describe`): ``mlx_vlm.models.inkling`` imports
``mlx_audio.dsp`` at package import (its audio feature extractor); mlx-audio 0.6.2 is installed
``--no-deps`` (its ``dsp`` module needs numpy and mlx only). mlx and mlx-vlm are imported when a
head is built, so the registry can import this file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.engines.torch.mtp import LibraryMtpRun

#: The modules mlx-vlm's Inkling path imports that its own requirements do not bring (checked by
#: :func:`unavailable_reason`).
NEEDS = ("mlx", "mlx_vlm", "mlx_audio")


def unavailable_reason() -> str | None:
    """Why the port cannot run here (the first missing module and how to install it), or None."""
    for module in NEEDS:
        if importlib.util.find_spec(module) is None:
            extra = "pip install --no-deps mlx-audio==0.6.2" if module == "mlx_audio" else "make setup"
            return f"{module} is not installed ({extra})"
    return None


class MlxVlmMtp:
    """mlx-vlm's Inkling trunk and MTP drafter on one snapshot (float32 numpy at the boundary).

    Raises:
        ValueError: mlx-vlm finds no MTP splitter for the snapshot's config (its own message).
    """

    library = "mlx-vlm"
    id = "mlx-vlm-mtp"

    def __init__(self, root: Path) -> None:
        import mlx.core as mx
        from mlx_vlm.speculative.drafters import load_drafter
        from mlx_vlm.utils import load

        self._mx = mx
        self.root = root
        self.model, _ = load(str(root))
        self.drafter: Any
        self.drafter, self.kind = load_drafter(str(root))
        self.drafter.reset(self.model)
        self.lm = self.model.language_model
        self.num_layers = len(self.drafter.blocks)

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version

        import mlx.core as mx

        return {"engine": self.id, "model_class": type(self.model).__name__, "drafter": type(self.drafter).__name__,
                "draft_kind": self.kind, "mtp_layers": self.num_layers, "mlx": version("mlx"),
                "mlx_vlm": version("mlx-vlm"), "mlx_audio": version("mlx-audio"), "device": str(mx.default_device()),
                "library_patches": [], "import_needs": ["mlx_audio.dsp (mlx-audio 0.6.2, --no-deps)"],
                "import_side_effects": ["mlx_audio/__init__.py sets TRANSFORMERS_NO_ADVISORY_WARNINGS=1"],
                "hidden_state": "pre-norm (mlx-vlm's return_hidden)"}

    # -- caches ----------------------------------------------------------------------------------
    def trunk_cache(self) -> Any:
        return self.lm.make_cache()

    def mtp_cache(self) -> Any:
        return self.drafter.make_cache()

    @staticmethod
    def length(cache: Any) -> int:
        return int(cache[0].caches[0].offset)

    @staticmethod
    def trim(cache: Any, n: int) -> bool:
        """False unless ``n == 0``: the short-convolution states cannot be cut (restore instead)."""
        return n == 0

    @staticmethod
    def snapshot(cache: Any) -> Any:
        from mlx_vlm.models.inkling.language import _snapshot_cache_state

        return _snapshot_cache_state(cache)

    @staticmethod
    def restore(cache: Any, saved: Any) -> None:
        from mlx_vlm.models.inkling.language import _restore_cache_state

        _restore_cache_state(cache, saved)

    # -- forwards --------------------------------------------------------------------------------
    def _np(self, a: Any) -> np.ndarray:
        mx = self._mx
        return np.ascontiguousarray(np.array(a.astype(mx.float32)), dtype=np.float32)

    def trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        """(logits [T, V], pre-norm hidden state [T, D]) float32 of ``ids`` after ``cache``."""
        mx = self._mx
        out = self.lm(mx.array([list(ids)]), cache=cache, return_hidden=True)
        mx.eval(out.logits, out.hidden_states[-1])
        return self._np(out.logits[0]), self._np(out.hidden_states[-1][0])

    def draft(self, tokens: Sequence[int], hidden: np.ndarray, start: int, cache: Any,
              depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """The drafter's block ``min(depth, L-1)`` over ``n`` pairs (see the torch head's ``draft``).

        Raises:
            ValueError: ``start`` is not where ``cache`` stands (mlx caches keep their own offsets).
        """
        mx = self._mx
        if self.length(cache) + 1 != start:
            raise ValueError(f"{self.id}: MTP step at position {start}, but the history holds {self.length(cache)} pairs")
        self.drafter._cache = cache
        h = self.drafter._forward_seq(mx.array([list(tokens)]), mx.array(hidden)[None], min(depth, self.num_layers - 1),
                                      mx.int32)
        logits = self.drafter._block_logits(h)
        mx.eval(h, logits)
        return self._np(logits[0]), self._np(h[0])

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

    def generate(self, ids: Sequence[int], max_new_tokens: int) -> LibraryMtpRun:
        """mlx-vlm's greedy ``generate_step`` and its MTP speculative path from the same prompt."""
        greedy = self._generate(ids, max_new_tokens, False)
        tokens = self._generate(ids, max_new_tokens, True)
        acc, drafted = list(self.drafter.accept_lens), list(self.drafter.draft_lens)
        self.drafter.reset(self.model)
        return LibraryMtpRun(tokens=tokens, greedy=greedy, forwards=len(acc) + 1, accepted=int(sum(acc)),
                             drafted=int(sum(drafted)), extra={"accept_lens": acc, "draft_lens": drafted})
