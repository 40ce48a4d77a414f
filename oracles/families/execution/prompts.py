"""mtplx family: chat prompt records (``oracles/builtin/records/mtplx/prompts.json`` and ``generation.json``).

A record is ``{"id", "messages": [{"role", "content"}], "sha256"}``: ``sha256`` is the sha256 of the
canonical JSON of ``messages`` (the request's identity across receipts and machines). Its token ids
depend on the pin's tokenizer and chat template: they are kept per tokenizer in the family's tokens
file (:mod:`oracles.families.records`; ``oracles records mtplx --pin NAME`` renders the template with jinja2 and
encodes with ``tokenizers``, generation prompt added), so that a tokenizer or template change is caught
without loading weights. A test works on a record bound to its pin (:meth:`PromptRecord.bind`).
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from oracles.errors import FixtureError
from oracles.families.records import RECORDS, canonical_sha256, family_tokens, load_record_list, require

PROMPTS = RECORDS / "mtplx" / "prompts.json"
GENERATION = RECORDS / "mtplx" / "generation.json"
#: The files whose records carry per-tokenizer ids (one id space: record ids are unique across them).
SOURCES = (PROMPTS, GENERATION)
#: The chat roles a record may use (the roles chat templates render; a misspelt one would be rendered
#: as given and caught only as an ids mismatch).
ROLES = ("system", "user", "assistant")
SUMMARY_REQUEST = "Give a summary of the following text:\n\n"


@dataclass(frozen=True)
class PromptRecord:
    """A prompt record; ``ids`` and ``pin`` are set once it is bound to a pin (:meth:`bind`)."""

    id: str
    messages: tuple[dict[str, str], ...]
    sha256: str
    ids: tuple[int, ...] = ()
    pin: str | None = None

    @property
    def message_list(self) -> list[dict[str, str]]:
        return [dict(m) for m in self.messages]

    def bind(self, pin: str) -> "PromptRecord":
        """This record with the token ids of ``pin``'s tokenizer.

        Raises:
            TokensMissing: the family has no ids for that tokenizer (the command to run named).
            FixtureError: the tokens file lacks this record (regenerate it) or holds a malformed list.
        """
        return dataclasses.replace(self, ids=prompt_ids(pin, self.id), pin=pin)

    def port_tokens(self, pin: str) -> int:
        """The prompt's length in tokens on ``pin`` (what ``--port-records`` compares)."""
        return len(prompt_ids(pin, self.id))


def prompt_ids(pin: str, record_id: str) -> tuple[int, ...]:
    """The token ids of record ``record_id`` for ``pin``'s tokenizer (:func:`oracles.families.records.family_tokens`).

    Raises:
        FixtureError: the tokens file has no such record, or its ids are not non-negative ints.
    """
    doc = family_tokens("mtplx", pin)
    ids = doc.get("ids", {}).get(record_id) if isinstance(doc.get("ids"), dict) else None
    if not (isinstance(ids, list) and all(type(i) is int and i >= 0 for i in ids)):
        raise FixtureError(f"mtplx tokens of pin {pin}: field 'ids.{record_id}' is missing or not a list of "
                           f"non-negative ints; run `oracles records mtplx --pin {pin}`")
    return tuple(ids)


def load_prompts(path: Path = PROMPTS) -> list[PromptRecord]:
    """Read and verify the prompt records.

    Raises:
        FixtureError: malformed file (path and line), or a record whose field is missing, whose
            message is not ``{"role": str, "content": str}``, or whose ``sha256`` does not match its
            messages (path, record id, expected and actual).
    """
    _, records = load_record_list(path, family="mtplx", fields=("id", "messages", "sha256"))
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
        out.append(PromptRecord(rec["id"], tuple(dict(m) for m in messages), sha))
    return out


def build_tokens(pin: str, tokenizer_sha256: str,
                 chat_ids: Callable[[list[dict[str, str]]], list[int]]) -> dict[str, Any]:
    """The mtplx tokens document of one tokenizer: every record of :data:`SOURCES` rendered with the
    generation prompt and encoded by ``chat_ids``, with the sha256 of each source file it was made from.

    Raises:
        FixtureError: a record id appears in two source files.
    """
    ids: dict[str, list[int]] = {}
    for path in SOURCES:
        for record in load_prompts(path):
            if record.id in ids:
                raise FixtureError(f"{path}: record {record.id!r} is also a record of another mtplx file")
            ids[record.id] = [int(i) for i in chat_ids(record.message_list)]
    return {"family": "mtplx", "pin": pin, "tokenizer_sha256": tokenizer_sha256,
            "generated_by": f"oracles records mtplx --pin {pin}", "sources": source_digests(), "ids": ids}


def source_digests() -> dict[str, str]:
    """sha256 of each file of :data:`SOURCES`, by file name (a tokens file is stale when they differ)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in SOURCES}
