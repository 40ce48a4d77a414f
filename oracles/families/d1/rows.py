"""``oracles records d1 --pin NAME``: the d1 rows of one tokenizer (``<records>/d1/tokens/NAME.json``)
from the tokenizer alone.

No weights, no torch: the chat template is rendered with jinja2 and encoded with ``tokenizers``
(:class:`oracles.pins.tokenizer.LightTokenizer` on a folder holding the pin's tokenizer files). For every accepted question
of every request: the row ids, the read-out groups (see :mod:`oracles.families.d1.records` for the variant
rule); for every request: its state's token count and length bucket, the trunk and the branches (for
several questions), and the rejected questions with field and reason. The control arms of
``red_arms.json`` get their rows too (``arm_rows``). The slow suite holds the engine's ids against
this file, the dry suite re-derives it and holds it against the committed copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from oracles.errors import FixtureError
from oracles.families.d1 import records as d1
from oracles.families.records import load_record_list, require
from oracles.pins.pin import sha256_file
from oracles.pins.tokenizer import LightTokenizer, load_tokenizer


def load_arms(path: Path = d1.RED_ARMS) -> list[dict[str, Any]]:
    """The adopted control arms of ``red_arms.json`` (``[]`` when the file does not exist).

    Each arm is ``{"id", "kind", "base_id", "question", "request", "sha256", "change", "measured", "adopted": true}``.

    Raises:
        FixtureError: a malformed file or arm (path, arm id and field named), an arm whose sha256
            does not match its request, or an arm not marked adopted.
    """
    if not path.is_file():
        return []
    _, arms = load_record_list(path, "arms")
    for arm in arms:
        where = f"{path}: arm {arm['id']!r}"
        for name, kind in (("kind", str), ("base_id", str), ("question", str), ("measured", dict)):
            require(arm, name, kind, where)
        if arm.get("adopted") is not True:
            raise FixtureError(f"{where}: field 'adopted' must be true for an arm under 'arms'")
        d1.parse_request({"request": arm.get("request"), "sha256": arm.get("sha256"), "gold": {}, "id": arm["id"]}, where)
    return arms


def _row(tok: LightTokenizer, rid: str, state: str, q: d1.Question) -> dict[str, Any]:
    ids = tok.chat_ids(d1.row_messages(state, q))
    return {"id": rid, "qid": q.qid, "type": q.type, "keys": list(q.keys), "row_len": len(ids), "ids": ids,
            "readout_ids": d1.readout_groups(tok.encode, q)}


def _text_trunk(tok: LightTokenizer, state: str, q: d1.Question) -> list[int]:
    """The trunk by text: the rendered row cut right after ``STATE + QUESTION_MARK``, encoded."""
    text = tok.render(d1.row_messages(state, q))
    cut = text.index(state + d1.QUESTION_MARK) + len(state + d1.QUESTION_MARK)
    return tok.encode(text[:cut])


def build_rows(tok: LightTokenizer, requests: Sequence[d1.Request], arms: Sequence[dict[str, Any]],
               pin: str) -> dict[str, Any]:
    """The rows document for ``requests`` and ``arms`` (see the module docstring).

    Questions whose read-out groups cannot be formed are rejected (field ``questions.<qid>.options``).

    Raises:
        FixtureError: the id split of a tree does not equal its text split (record named), or an
            arm's base record or question is unknown.
    """
    out_req, rows = [], []
    for r in requests:
        rejected = [x.to_json() for x in r.rejected]
        accepted = []
        for q in r.questions:
            try:
                rows.append(_row(tok, r.id, r.state, q))
                accepted.append(q)
            except ValueError as exc:
                rejected.append({"qid": q.qid, "field": f"questions.{q.qid}.options", "reason": str(exc)})
        n_state = len(tok.encode(r.state))
        entry: dict[str, Any] = {"id": r.id, "sha256": r.sha256, "source": r.source, "state_tokens": n_state,
                                 "bucket": d1.bucket_of(n_state), "path": "tree" if len(accepted) > 1 else "row",
                                 "questions": [q.qid for q in accepted], "rejected": rejected,
                                 "trunk": None, "branches": None}
        if len(accepted) > 1:
            trunk, branches = d1.tree_split(tok, r.state, accepted)
            if trunk != _text_trunk(tok, r.state, accepted[0]):
                raise FixtureError(f"record {r.id!r}: the id split of the tree differs from the text split at "
                                   f"{d1.QUESTION_MARK!r}; the BPE merged across it")
            entry["trunk"], entry["branches"] = trunk, branches
        out_req.append(entry)
    by_id = {r.id: r for r in requests}
    arm_rows = []
    for arm in arms:
        base = by_id.get(arm["base_id"])
        if base is None or arm["question"] not in {q.qid for q in base.questions}:
            raise FixtureError(f"arm {arm['id']!r}: base {arm['base_id']!r}/{arm['question']!r} is not a request question")
        parsed = d1.parse_request({"request": arm["request"], "sha256": arm["sha256"], "gold": {}, "id": arm["id"]},
                                  f"arm {arm['id']!r}")
        q = next(x for x in parsed.questions if x.qid == arm["question"])
        arm_rows.append(_row(tok, arm["id"], parsed.state, q) | {"base_id": arm["base_id"]})
    return {"family": "d1", "pin": pin, "generated_by": f"oracles records d1 --pin {pin}",
            "buckets": list(d1.BUCKETS), "requests": out_req, "rows": rows, "arm_rows": arm_rows}


def current_rows(tokenizer_root: Path, pin: str, tokenizer_sha256: str) -> dict[str, Any]:
    """:func:`build_rows` of the committed requests and arms with the tokenizer files in ``tokenizer_root``:
    the d1 tokens document of that tokenizer, with the sha256 of the request and arm files it was made from.

    Raises:
        FixtureError: see :func:`build_rows`, or a tokenizer file missing from ``tokenizer_root``.
    """
    doc = build_rows(load_tokenizer(tokenizer_root), d1.load_requests(), load_arms(), pin)
    doc["tokenizer_sha256"] = tokenizer_sha256
    doc["requests_sha256"] = sha256_file(d1.REQUESTS)
    doc["red_arms_sha256"] = sha256_file(d1.RED_ARMS) if d1.RED_ARMS.is_file() else None
    return doc


class RowsView:
    """A d1 rows document keyed for the tests: ``meta`` by request id, ``rows`` by (request, question),
    ``arm_rows`` by arm id, ``row_tokens`` (a request's longest row, what ``--port-records`` compares)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.doc = doc
        self.meta: dict[str, dict[str, Any]] = {r["id"]: r for r in doc["requests"]}
        self.rows: dict[tuple[str, str], dict[str, Any]] = {(r["id"], r["qid"]): r for r in doc["rows"]}
        self.arm_rows: dict[str, dict[str, Any]] = {r["id"]: r for r in doc["arm_rows"]}
        self.row_tokens = {rid: max((r["row_len"] for (r_id, _), r in self.rows.items() if r_id == rid), default=0)
                           for rid in self.meta}

    def rejection(self, key: tuple[str, str]) -> str | None:
        """Why question ``key`` has no row for this tokenizer (its read-out groups could not be formed), or None."""
        for r in self.meta.get(key[0], {}).get("rejected", []):
            if r["qid"] == key[1]:
                return f"{r['field']}: {r['reason']}"
        return None


def rows_view(pin: str) -> RowsView:
    """:class:`RowsView` of pin ``pin``'s d1 tokens (:func:`oracles.families.d1.records.rows_doc`)."""
    return RowsView(d1.rows_doc(pin))
