"""Capabilities of a model's own system beyond the forward, as :class:`oracles.engines.base.Engine` methods
with defaults that refuse: MTP drafting (:class:`MtpDrafting`) and System One decisions
(:class:`SystemOneDecisions`). :class:`~oracles.engines.base.Engine` inherits both, so every engine
has every method, and a family asks them of any engine: one that cannot serve raises
:class:`~oracles.engines.types.Unsupported`, which the plugin turns into a skip naming engine and capability.

Each method is flat, as the wire carries the contract call by call: its arguments and results are ints,
strings, lists and dicts of those, float32 numpy arrays (``<f4``), integer arrays, and caches as opaque
handles that the engine's own :meth:`~oracles.engines.base.Engine.cache_length`,
:meth:`~oracles.engines.base.Engine.trim`, :meth:`~oracles.engines.base.Engine.snapshot` and
:meth:`~oracles.engines.base.Engine.restore` serve (``docs/engines.md`` holds the table). What each
returns is checked on every call of an engine the plugin built (:mod:`oracles.engines.contract`).

numpy only.
"""

from __future__ import annotations

from typing import Any, ClassVar, Sequence

import numpy as np

from oracles.engines.types import MtpGeneration, Unsupported

#: The capability each refusal names (the skip reads ``engine 'E' cannot CAPABILITY``).
MTP = "draft with a multi-token-prediction layer"
DECISIONS = "answer System One decisions"


class MtpDrafting:
    """Multi-token-prediction drafting, in the primitives MTPLX's execution reference records: the
    trunk's hidden state, one MTP step at depth ``d``, the MTP history committed and cut back
    (:mod:`oracles.families.execution.mtp` runs draft/verify/commit rounds on them).

    An MTP layer pairs the trunk's state at position ``i`` with the embedding of the token at ``i + 1``
    and predicts the token at ``i + 2`` (DeepSeek-V3's MTP module, arXiv:2412.19437 section 2.2). The
    *trunk cache* holds the trunk's positions; the *history* holds one entry per such pair. Both are the
    engine's own caches: :meth:`~oracles.engines.base.Engine.cache_length` counts them,
    :meth:`~oracles.engines.base.Engine.trim` cuts them where it can (else the rounds roll back by
    :meth:`~oracles.engines.base.Engine.snapshot` / :meth:`~oracles.engines.base.Engine.restore`).
    """

    id: ClassVar[str]

    def mtp_trunk_cache(self) -> Any:
        """An empty trunk cache for :meth:`mtp_trunk` (an opaque handle).

        Raises:
            Unsupported: the engine has no MTP layer.
        """
        raise Unsupported(self.id, MTP)

    def mtp_history_cache(self) -> Any:
        """An empty MTP history for :meth:`mtp_draft` (an opaque handle).

        Raises:
            Unsupported: the engine has no MTP layer.
        """
        raise Unsupported(self.id, MTP)

    def mtp_trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        """The trunk over ``ids`` (``T`` ints) after what ``cache`` holds, appending to it.

        Returns:
            ``(logits [T, V], state [T, D])`` float32: the trunk's logits, and the trunk state its MTP
            layer reads (the library's choice: the final norm's output, or the stream before it;
            ``describe()`` says which).

        Raises:
            Unsupported: the engine has no MTP layer.
        """
        raise Unsupported(self.id, MTP)

    def mtp_draft(self, tokens: Sequence[int], state: np.ndarray, start: int, history: Any,
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """One MTP step over ``n`` pairs, appended to ``history``: ``state`` ``[n, D]`` float32 (the trunk's
        states at positions ``start - 1 ..``, or at depth > 0 the previous depth's MTP states),
        ``tokens`` the ``n`` ids at positions ``start ..``; ``depth`` chooses the MTP layer
        (``min(depth, layers - 1)``: one layer chained at every depth where there is one).

        Returns:
            ``(logits [n, V], state [n, D])`` float32: row ``r`` drafts the token at ``start + r + 1``;
            ``state`` is the MTP layer's output, what the next depth reads.

        Raises:
            ValueError: ``start`` is not where ``history`` stands (``cache_length(history) + 1``),
                naming both.
            Unsupported: the engine has no MTP layer.
        """
        raise Unsupported(self.id, MTP)

    def mtp_head(self, state: np.ndarray) -> np.ndarray:
        """``[n, D]`` MTP-layer states (:meth:`mtp_draft`'s) -> ``[n, V]`` float32 draft logits through the
        head the MTP step reads them with.

        Raises:
            Unsupported: the engine has no MTP layer, or cannot re-run its head.
        """
        raise Unsupported(self.id, MTP)

    def mtp_generate(self, ids: Sequence[int], max_new_tokens: int) -> MtpGeneration:
        """The library's own greedy generation from ``ids`` with its MTP drafter, and without it.

        Returns:
            :class:`~oracles.engines.types.MtpGeneration` (every field JSON-able).

        Raises:
            Unsupported: the engine has no MTP layer, or its library no MTP generation.
        """
        raise Unsupported(self.id, MTP)


class SystemOneDecisions:
    """System One decisions (d1): typed questions about a state (text, a JSON object, pictures) answered
    by reading log-probabilities at an answer slot (:mod:`oracles.families.d1.system_one` holds the
    request form, the prompt and the read-out the reference is built from).

    ``questions`` are in the published form (``{"type": "choice" | "score" | "bool" | "noul",
    "instructions": str, "criteria": ...}``); ``images`` are PIL images or ``uint8`` ``[H, W, 3]`` arrays;
    ``vision`` is a dict of arrays: ``pixel_values`` ``[N, P, C]`` float32, ``pixel_attention_mask``
    ``[N, P]`` integers (1: a real patch), ``spatial_shapes`` ``[N, 2]`` integers (patch rows, columns),
    one row per picture, ``{}`` without pictures.
    """

    id: ClassVar[str]

    def decision_inputs(self, state: str | dict[str, Any] | None, questions: Sequence[dict[str, Any]],
                        images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]], dict[str, np.ndarray]]:
        """The ids and pixels of a request, as the engine lays them out: ``(trunk, branches, vision)``.
        One question is one row (``branches`` empty); several share the prefix as the ``trunk``, each
        question's suffix a branch after it. Pictures' placeholders are expanded in the ids.

        Raises:
            Unsupported: the engine has no System One path.
        """
        raise Unsupported(self.id, DECISIONS)

    def decision_readout_ids(self, question: dict[str, Any]) -> list[list[int]]:
        """The token ids scored for each of the question's options, one non-empty group per option.

        Raises:
            Unsupported: the engine has no System One path.
        """
        raise Unsupported(self.id, DECISIONS)

    def decision_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                          vision: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Log-softmax ``[V]`` float32 at each answer slot: of ``trunk`` alone when ``branches`` is empty
        (a row), else of each branch after the trunk (the tree: one branch never sees another).

        Returns:
            ``max(1, len(branches))`` arrays ``[V]`` float32.

        Raises:
            ValueError: the ids' picture placeholders do not match ``vision``.
            Unsupported: the engine has no System One path.
        """
        raise Unsupported(self.id, DECISIONS)

    def decision_predict(self, state: str | dict[str, Any] | None, questions: dict[str, dict[str, Any]],
                         images: Sequence[Any] = ()) -> dict[str, Any]:
        """The answers as the engine's own API returns them: ``{"answers": {name: answer}}`` (JSON-able), an
        answer ``{"type", "value", ...}`` per question (``"probability"`` for a bool, ``"probabilities"``
        by option otherwise).

        Raises:
            Unsupported: the engine has no System One path.
        """
        raise Unsupported(self.id, DECISIONS)


__all__ = ["DECISIONS", "MTP", "MtpDrafting", "SystemOneDecisions"]
