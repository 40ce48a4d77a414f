"""A conversation whose rendering no longer covers the cache stops, saying why, instead of crashing.

An untrained model can answer with a run of one token ("\\n" 320 times) that the tokenizer re-encodes
to fewer ids; the next turn's rendering is then no longer than the cache and has nothing to feed.
"""

from __future__ import annotations

from typing import Any, Sequence

import pytest
from cohort_fake import FakeEngine

from oracles.families.execution.chat import ChatRecord, run_chat
from oracles.faults.matrix import chat_port

pytestmark = pytest.mark.dry


class MergingEngine(FakeEngine):
    """Renders a user message as one id per character and an assistant message as its first id only,
    as BPE merges a repeated token's text into fewer ids; ``merge=False`` renders answers whole."""

    def __init__(self, merge: bool = True) -> None:
        super().__init__()
        self.merge = merge
        self.eos_token_ids = frozenset()

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            if m["role"] == "user":
                ids += [5 + ord(c) % 50 for c in m["content"]]
            else:
                answer = [int(x) for x in m["content"].split()]
                ids += answer[:1] if self.merge else answer
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return " ".join(str(int(i)) for i in ids)


RECORD = ChatRecord(id="three-turns", turns=("what is the tide", "hi", "and the moon"), max_new_tokens=8,
                    sha256="0" * 64)


def test_a_rendering_shorter_than_the_cache_stops_the_conversation_naming_the_turn() -> None:
    run = run_chat(MergingEngine(), RECORD)
    assert len(run.turns) == 1
    assert run.stopped is not None
    assert run.stopped.startswith("three-turns turn 2: the template renders the conversation as 19 ids, "
                                  "no more than the 24 the cache holds (first difference at 17)")


def test_positive_control_a_faithful_rendering_runs_every_turn() -> None:
    run = run_chat(MergingEngine(merge=False), RECORD)
    assert run.stopped is None
    assert [len(t.tokens) for t in run.turns] == [8, 8, 8]
    assert all(t.frontier == t.rendered_prefix for t in run.turns)


def test_fault_matrix_names_a_port_that_ran_fewer_turns() -> None:
    ref, port = run_chat(MergingEngine(merge=False), RECORD), run_chat(MergingEngine(), RECORD)
    msg: Any = chat_port(ref, port)
    assert msg is not None and msg.startswith("three-turns: the port ran 1 turns, the reference 3")
