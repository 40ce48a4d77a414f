"""Return checks of a snapshot's buffers and digests and of the system capabilities
(:mod:`oracles.engines.systems`: MTP drafting, System One decisions), installed on every engine the plugin
builds by :func:`oracles.engines.contract.install_checks`.

Each check reads types, shapes and dtypes only, and a wrong return raises
:class:`oracles.engines.types.EngineContractError` in one line naming engine, method, field, what came
back and what was expected. numpy only.
"""

from __future__ import annotations

import re
from numbers import Integral
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from oracles.engines.contract_arrays import expect_f4, seen
from oracles.engines.types import EngineContractError, MtpGeneration

if TYPE_CHECKING:
    from oracles.engines.base import Engine

#: A sha256 as :func:`oracles.engines.types.digest_buffers` writes it.
SHA256 = re.compile(r"[0-9a-f]{64}")


def _refuse(engine: "Engine", call: str, field: str, value: Any, expected: str) -> EngineContractError:
    return EngineContractError(f"engine {engine.id} {call}: {field} is {seen(value)}; expected {expected}")


def _is_int(value: Any) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def check_ids(engine: "Engine", call: str, field: str, value: Any) -> None:
    """``value`` is a list of ints (token ids).

    Raises:
        EngineContractError: naming the field, or the first element that is not an int (index, type, value).
    """
    if not isinstance(value, list):
        raise _refuse(engine, call, field, value, "a list of int token ids")
    for i, v in enumerate(value):
        if not _is_int(v):
            raise EngineContractError(f"engine {engine.id} {call}: {field}[{i}] is {type(v).__name__} {v!r}; expected an "
                                      "int token id")


def check_rows_pair(engine: "Engine", call: str, out: Any, rows: int, why: str) -> None:
    """``out`` is ``(logits [rows, V], state [rows, D])`` float32 (``mtp_trunk``, ``mtp_draft``).

    Raises:
        EngineContractError: not a pair, or either array off its dtype or shape.
    """
    if not (isinstance(out, tuple) and len(out) == 2):
        raise _refuse(engine, call, "the return value", out, "a pair (logits [T, V], state [T, D])")
    expect_f4(engine, call, "logits", out[0], "T, V", (rows, engine.vocab_size), why)
    expect_f4(engine, call, "state", out[1], "T, D", (rows, engine.hidden_size), why)


def check_mtp_generation(engine: "Engine", call: str, gen: Any) -> None:
    """An :class:`~oracles.engines.types.MtpGeneration` of int lists, an int ``forwards``, ints or None.

    Raises:
        EngineContractError: the first field off its type.
    """
    if not isinstance(gen, MtpGeneration):
        raise _refuse(engine, call, "the return value", gen, "oracles.engines.types.MtpGeneration")
    check_ids(engine, call, "MtpGeneration.tokens", gen.tokens)
    check_ids(engine, call, "MtpGeneration.greedy", gen.greedy)
    for name in ("forwards", "accepted", "drafted"):
        value = getattr(gen, name)
        if not (_is_int(value) or value is None and name != "forwards"):
            raise _refuse(engine, call, f"MtpGeneration.{name}", value, "an int" + (" or None" if name != "forwards" else ""))
    if not isinstance(gen.extra, dict):
        raise _refuse(engine, call, "MtpGeneration.extra", gen.extra, "a dict")


def check_decision_inputs(engine: "Engine", call: str, out: Any) -> None:
    """``(trunk ids, branches [ids], vision {name: array})``.

    Raises:
        EngineContractError: the first part off its type.
    """
    if not (isinstance(out, tuple) and len(out) == 3):
        raise _refuse(engine, call, "the return value", out, "a triple (trunk ids, branch ids, vision arrays)")
    trunk, branches, vision = out
    check_ids(engine, call, "trunk", trunk)
    if not isinstance(branches, list):
        raise _refuse(engine, call, "branches", branches, "a list of id lists")
    for i, branch in enumerate(branches):
        check_ids(engine, call, f"branches[{i}]", branch)
    if not isinstance(vision, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in vision.items()):
        raise _refuse(engine, call, "vision", vision, "a dict of numpy arrays by name")


def check_readout(engine: "Engine", call: str, groups: Any) -> None:
    """One non-empty list of int ids per option, at least two options.

    Raises:
        EngineContractError: naming the first bad group.
    """
    if not isinstance(groups, list) or len(groups) < 2:
        raise _refuse(engine, call, "the return value", groups, "a list of two or more id groups")
    for i, group in enumerate(groups):
        check_ids(engine, call, f"group {i}", group)
        if not group:
            raise _refuse(engine, call, f"group {i}", group, "a non-empty list of int token ids")


def check_logprobs(engine: "Engine", call: str, out: Any, branches: Sequence[Any]) -> None:
    """``max(1, len(branches))`` arrays ``[V]`` float32.

    Raises:
        EngineContractError: the count or the first array off its shape or dtype.
    """
    want = max(1, len(branches))
    if not isinstance(out, list) or len(out) != want:
        raise _refuse(engine, call, "the return value", out, f"a list of {want} arrays [V] ({len(branches)} branches)")
    for i, z in enumerate(out):
        expect_f4(engine, call, f"answer slot {i}", z, "V", (engine.vocab_size,), "with V = vocab_size")


def check_predict(engine: "Engine", call: str, out: Any, questions: dict[str, Any]) -> None:
    """``{"answers": {name: {"type": ..., ...}}}`` with one answer per question name.

    Raises:
        EngineContractError: no answers dict, or its names not the questions'.
    """
    answers = out.get("answers") if isinstance(out, dict) else None
    if not isinstance(answers, dict) or set(answers) != set(questions):
        raise _refuse(engine, call, "answers", answers, f"a dict of one answer per question {sorted(questions)}")
    for name, answer in answers.items():
        if not isinstance(answer, dict) or "type" not in answer:
            raise _refuse(engine, call, f"answers[{name!r}]", answer, "a dict with 'type'")


def check_buffers(engine: "Engine", call: str, out: Any) -> None:
    """``{name: numpy array}``.

    Raises:
        EngineContractError: not a dict of arrays by name.
    """
    if not isinstance(out, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray) for k, v in out.items()):
        raise _refuse(engine, call, "the return value", out, "a dict of numpy arrays by buffer name")


def check_digests(engine: "Engine", call: str, out: Any) -> None:
    """``{name: sha256 hex}``.

    Raises:
        EngineContractError: not a dict of 64-hex-digit strings by name.
    """
    if not isinstance(out, dict) or not all(isinstance(k, str) and isinstance(v, str) and SHA256.fullmatch(v)
                                            for k, v in out.items()):
        raise _refuse(engine, call, "the return value", out, "a dict of sha256 hex digests by buffer name")


def checked_buffers(engine: "Engine") -> dict[str, Callable[..., Any]]:
    """``snapshot_buffers``, ``snapshot_digest`` and ``buffer_digests`` of ``engine``, checked."""
    buffers, digest, digests = engine.snapshot_buffers, engine.snapshot_digest, engine.buffer_digests

    def snapshot_buffers(snapshot: Any) -> dict[str, np.ndarray]:
        out = buffers(snapshot)
        check_buffers(engine, "snapshot_buffers()", out)
        return out

    def snapshot_digest(snapshot: Any) -> str:
        out = digest(snapshot)
        if not (isinstance(out, str) and SHA256.fullmatch(out)):
            raise _refuse(engine, "snapshot_digest()", "the return value", out, "a sha256 hex digest")
        return out

    def buffer_digests(snapshot: Any) -> dict[str, str]:
        out = digests(snapshot)
        check_digests(engine, "buffer_digests()", out)
        return out

    return {"snapshot_buffers": snapshot_buffers, "snapshot_digest": snapshot_digest, "buffer_digests": buffer_digests}


def checked_systems(engine: "Engine") -> dict[str, Callable[..., Any]]:
    """The MTP and System One methods of ``engine`` (:mod:`oracles.engines.systems`), checked; the cache
    factories (``mtp_trunk_cache``, ``mtp_history_cache``) return opaque handles and are left as they are."""
    trunk, draft, head, generate = engine.mtp_trunk, engine.mtp_draft, engine.mtp_head, engine.mtp_generate
    inputs, readout, logprobs, predict = (engine.decision_inputs, engine.decision_readout_ids,
                                          engine.decision_logprobs, engine.decision_predict)

    def mtp_trunk(ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        out = trunk(ids, cache)
        check_rows_pair(engine, "mtp_trunk()", out, len(ids), f"with T = {len(ids)} ids, V = vocab_size, D = hidden_size")
        return out

    def mtp_draft(tokens: Sequence[int], state: np.ndarray, start: int, history: Any,
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        out = draft(tokens, state, start, history, depth)
        check_rows_pair(engine, "mtp_draft()", out, len(tokens),
                        f"with T = {len(tokens)} tokens, V = vocab_size, D = hidden_size")
        return out

    def mtp_head(state: np.ndarray) -> np.ndarray:
        out = head(state)
        expect_f4(engine, "mtp_head()", "the return value", out, "n, V", (*np.shape(state)[:-1], engine.vocab_size),
                  f"for state {list(np.shape(state))}, V = vocab_size")
        return out

    def mtp_generate(ids: Sequence[int], max_new_tokens: int) -> MtpGeneration:
        out = generate(ids, max_new_tokens)
        check_mtp_generation(engine, "mtp_generate()", out)
        return out

    def decision_inputs(state: Any, questions: Sequence[dict[str, Any]],
                        images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]], dict[str, np.ndarray]]:
        out = inputs(state, questions, images)
        check_decision_inputs(engine, "decision_inputs()", out)
        return out

    def decision_readout_ids(question: dict[str, Any]) -> list[list[int]]:
        out = readout(question)
        check_readout(engine, "decision_readout_ids()", out)
        return out

    def decision_logprobs(trunk_ids: Sequence[int], branches: Sequence[Sequence[int]],
                          vision: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        out = logprobs(trunk_ids, branches, vision)
        check_logprobs(engine, "decision_logprobs()", out, branches)
        return out

    def decision_predict(state: Any, questions: dict[str, dict[str, Any]], images: Sequence[Any] = ()) -> dict[str, Any]:
        out = predict(state, questions, images)
        check_predict(engine, "decision_predict()", out, questions)
        return out

    return {"mtp_trunk": mtp_trunk, "mtp_draft": mtp_draft, "mtp_head": mtp_head, "mtp_generate": mtp_generate,
            "decision_inputs": decision_inputs, "decision_readout_ids": decision_readout_ids,
            "decision_logprobs": decision_logprobs, "decision_predict": decision_predict}
