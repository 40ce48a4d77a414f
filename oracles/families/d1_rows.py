"""``oracles records d1``: the d1 rows file (``fixtures/records/d1/rows.json``) from the tokenizer alone.

No weights, no torch: the chat template is rendered with jinja2 and encoded with ``tokenizers``
(:class:`oracles.chat.LightTokenizer` on ``fixtures/tokenizers/<pin>``). For every accepted question
of every request: the row ids, the read-out groups (see :mod:`oracles.families.d1` for the variant
rule); for every request: its state's token count and length bucket, the trunk and the branches (for
several questions), and the rejected questions with field and reason. The control arms of
``red_arms.json`` get their rows too (``arm_rows``). The slow suite holds the engine's ids against
this file, the dry suite re-derives it and holds it against the committed copy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from oracles.chat import LightTokenizer
from oracles.errors import FixtureError
from oracles.families import d1
from oracles.pins import sha256_file
from oracles.records import load_record_list, require


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
    return {"family": "d1", "pin": pin, "tokenizer": f"fixtures/tokenizers/{pin}", "generated_by": "oracles records d1",
            "buckets": list(d1.BUCKETS), "requests": out_req, "rows": rows, "arm_rows": arm_rows}


def current_rows(root: Path | None = None) -> dict[str, Any]:
    """:func:`build_rows` on the committed requests and arms with the committed tokenizer copy."""
    requests = d1.load_requests()
    top = json.loads(d1.REQUESTS.read_text())
    pin = str(top.get("pin", "smollm2-135m-instruct"))
    tok = LightTokenizer(root or d1.TOKENIZER.parent / pin)
    doc = build_rows(tok, requests, load_arms(), pin)
    doc["requests_sha256"] = sha256_file(d1.REQUESTS)
    doc["red_arms_sha256"] = sha256_file(d1.RED_ARMS) if d1.RED_ARMS.is_file() else None
    return doc


def regenerate(args: argparse.Namespace) -> int:
    """Write ``rows.json`` anew (``args.snapshot``, when given, is a folder with the tokenizer files)."""
    doc = current_rows(getattr(args, "snapshot", None))
    d1.ROWS.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
    n_rej = sum(len(r["rejected"]) for r in doc["requests"])
    print(f"wrote {d1.ROWS}: {len(doc['requests'])} requests, {len(doc['rows'])} rows, "
          f"{sum(r['path'] == 'tree' for r in doc['requests'])} trees, {len(doc['arm_rows'])} arm rows, {n_rej} rejected")
    return 0
