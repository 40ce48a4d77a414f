"""mtplx family: chat prompt records (``fixtures/records/mtplx/prompts.json``).

A record is ``{"id", "messages": [{"role", "content"}], "sha256", "ids"}``: ``sha256`` is the sha256
of the canonical JSON of ``messages`` (the request's identity across receipts and machines) and
``ids`` the chat-template token ids transformers gives (generation prompt added), committed so that a
tokenizer or template change is caught without loading weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from oracles.errors import FixtureError
from oracles.records import RECORDS, canonical_sha256, load_record_list, require

PROMPTS = RECORDS / "mtplx" / "prompts.json"
#: The chat roles a record may use (the roles chat templates render; a misspelt one would be rendered
#: as given and caught only as an ids mismatch).
ROLES = ("system", "user", "assistant")
SUMMARY_REQUEST = "Give a summary of the following text:\n\n"


@dataclass(frozen=True)
class PromptRecord:
    id: str
    messages: tuple[dict[str, str], ...]
    sha256: str
    ids: tuple[int, ...]
    pin: str

    @property
    def message_list(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]


def load_prompts(path: Path = PROMPTS) -> list[PromptRecord]:
    """Read and verify the prompt records.

    Raises:
        FixtureError: malformed file (path and line), or a record whose field is missing, whose
            message is not ``{"role": str, "content": str}``, or whose ``sha256`` does not match its
            messages (path, record id, expected and actual).
    """
    top, records = load_record_list(path, family="mtplx", fields=("id", "messages", "sha256", "ids"))
    pin = top.get("pin")
    if not isinstance(pin, str):
        raise FixtureError(f"{path}: field 'pin' is missing or not a str")
    out = []
    for rec in records:
        where = f"{path}: record {rec['id']!r}"
        messages = require(rec, "messages", list, where)
        for j, m in enumerate(messages):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
                raise FixtureError(f"{where}: field 'messages[{j}]' must be {{'role': str, 'content': str}}")
            if m["role"] not in ROLES:
                raise FixtureError(f"{where}: field 'messages[{j}].role' is {m['role']!r}, not one of {', '.join(ROLES)}")
        sha = require(rec, "sha256", str, where)
        actual = canonical_sha256(messages)
        if sha != actual:
            raise FixtureError(f"{where}: field 'sha256' is {sha} but the messages hash to {actual}")
        ids = require(rec, "ids", list, where)
        if not all(type(i) is int and i >= 0 for i in ids):
            raise FixtureError(f"{where}: field 'ids' must be a list of non-negative ints")
        out.append(PromptRecord(rec["id"], tuple(dict(m) for m in messages), sha, tuple(ids), pin))
    return out


def rebuild_prompts(records: Sequence[dict[str, Any]], pin: str,
                    chat_ids: Callable[[list[dict[str, str]]], list[int]]) -> dict[str, Any]:
    """The prompts file for ``records`` (each ``{"id", "messages"}``), hashing and tokenising anew."""
    return {"family": "mtplx", "pin": pin, "records": [
        {"id": r["id"], "messages": r["messages"], "sha256": canonical_sha256(r["messages"]),
         "ids": chat_ids(r["messages"])} for r in records]}
