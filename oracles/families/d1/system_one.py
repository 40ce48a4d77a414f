"""System One: the d1 decision model's published request form, prompt and read-out, written here for the
reference (mlx-vlm's ``mlx_vlm/models/d1/prompt.py`` is the port's; it is held against this, never imported).

A request (``oracles/builtin/records/d1/system_one.json``)::

    {"id": "so_order", "request": {"state": "..." | {JSON object} | null, "images": ["circle_red.png"],
     "questions": {"NAME": {"type": "choice" | "score" | "bool" | "noul", "instructions": "...",
                            "criteria": ...}}}, "sha256": <canonical sha256 of "request">}

Question types (D1Model's defaults: no system turn, options described, no lead-in, no calibration):

* ``choice``: ``criteria`` maps each option's label to a description (or null: the label with ``_`` as
  spaces is shown); a list of labels is read as labels without descriptions; at least two options.
* ``score``: ``criteria`` lists 2..10 level descriptions, lowest first; levels are the digits 0..n-1.
* ``noul`` (``bool`` is its other name): an optional ``criteria`` ``{"true": ..., "false": ...}``.

Prompt: ``BOS + "<|im_start|>user\\n" + IMAGES + STATE_BLOCK + "\\nQUESTION:\\n"`` is the *prefix*
(everything the questions of one state share; with no state, just the head and the images), then per
question the *suffix* ``QUESTION_BLOCK + "<|im_end|>\\n<|im_start|>assistant\\n"``; the answer slot is
the suffix's last position. A text state is followed by a blank line; a JSON state is written with
2-space indent, then a blank line. IMAGES is what the chat template writes at the head of a user turn
for that many images (``<image>`` each for LFM2-VL). A question block:

* choice: ``instructions``, a blank line, ``Options:``, one line ``CODE DESCRIPTION`` per option, a blank
  line, ``Reply with the option code only.``;
* noul: ``instructions`` (then ``Yes: ...`` / ``No: ...`` lines when criteria are given), a blank line,
  ``Reply with yes or no only.``;
* score: ``instructions``, a blank line, one line ``DIGIT DESCRIPTION`` per level, a blank line,
  ``Reply with a single digit 0-N only.``

Option codes: the labels themselves when every label is one letter, else ``A``, ``B``, ... (up to 26
options), else ``00``, ``01``, ...; a code that is not one token of its own (or whose token an earlier
option holds) is replaced by the first free single-token code of the fallback pool :data:`FALLBACK`.

Read-out: per option a group of token ids (choice: the code's token, then `` CODE``'s if that is one
other token; noul: the single-token forms of ``yes``/``Yes``/``YES`` and ``no``/``No``/``NO``; score: the
digit's token); an option's score is the largest log-probability in its group, and the option
probabilities are the softmax of those scores (float64). Answers as D1Model writes them: a noul
``{"type": "bool", "value": p_yes >= 0.5, "probability": p_yes}``, a choice the label of the most
probable option, a score the expected level; probabilities rounded to 4 places.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from oracles.errors import FixtureError
from oracles.families.records import RECORDS, canonical_sha256, require

SYSTEM_ONE = RECORDS / "d1" / "system_one.json"
IMAGES = RECORDS.parent / "images"
TYPES = ("choice", "score", "bool", "noul")
TURN_OPEN, TURN_CLOSE = "<|im_start|>", "<|im_end|>"
YES, NO = ("yes", "Yes", "YES"), ("no", "No", "NO")
#: A noul's answer is true when its rounded P(yes) is at least this (D1Model's published decision rule, not a tolerance).
BOOL_AT = 0.5
#: Places an answer's probabilities are rounded to.
PLACES = 4
#: Single-token codes tried, in order, when an option's own code is not one token of its own.
FALLBACK: tuple[str, ...] = (tuple(chr(c) for c in range(65, 91)) + tuple(f"{i:02d}" for i in range(100))
                             + tuple(chr(c) for c in range(97, 123)) + tuple(f"#{i}" for i in range(200))
                             + tuple(chr(a) + chr(b) for a in range(65, 91) for b in range(65, 91)))
Encode = Callable[[str], Sequence[int]]


@dataclass(frozen=True)
class Question:
    """One parsed question: ``kind`` is ``choice``, ``score`` or ``noul``; ``labels`` the choice
    labels (with ``descriptions``), the score levels' descriptions, or for a noul its optional
    ``true``/``false`` descriptions."""

    qid: str
    kind: str
    instructions: str
    labels: tuple[str, ...] = ()
    descriptions: tuple[str | None, ...] = ()

    def names(self) -> list[str]:
        """The answer keys, one per read-out group: ``yes``, ``no``; the labels; ``"0"``..``"n-1"``."""
        if self.kind == "noul":
            return ["yes", "no"]
        return list(self.labels) if self.kind == "choice" else [str(i) for i in range(len(self.labels))]

    def as_request(self) -> dict[str, Any]:
        """The question as the published form (what a port's ``predict`` is given)."""
        if self.kind == "choice":
            criteria: Any = dict(zip(self.labels, self.descriptions))
        elif self.kind == "score":
            criteria = list(self.labels)
        else:
            criteria = dict(zip(self.labels, self.descriptions)) or None
        return {"type": self.kind, "instructions": self.instructions, "criteria": criteria}


@dataclass(frozen=True)
class Request:
    """A System One record: the state (text, a JSON object, or None), picture file names, questions."""

    id: str
    state: str | dict[str, Any] | None
    images: tuple[str, ...]
    questions: tuple[Question, ...]
    sha256: str


def _refuse(where: str, field: str, why: str) -> FixtureError:
    return FixtureError(f"{where}: field {field!r}: {why}")


def parse_question(qid: str, raw: Any, where: str) -> Question:
    """One question of the published form, strictly.

    Raises:
        FixtureError: one line naming ``where`` (file and record) and the field ``questions.<qid>.<f>``.
    """
    f = f"questions.{qid}"
    if not isinstance(raw, dict):
        raise _refuse(where, f, f"a question must be an object, got {type(raw).__name__}")
    extra = sorted(set(raw) - {"type", "instructions", "criteria"})
    if extra:
        raise _refuse(where, f"{f}.{extra[0]}", "not a field of a question (type, instructions, criteria)")
    kind = raw.get("type", "choice")
    if kind not in TYPES:
        raise _refuse(where, f"{f}.type", f"unknown type {kind!r} (known: {', '.join(TYPES)})")
    kind = "noul" if kind == "bool" else kind
    text = raw.get("instructions")
    if not isinstance(text, str) or not text.strip():
        raise _refuse(where, f"{f}.instructions", "missing or empty")
    crit = raw.get("criteria")
    if kind == "choice":
        if isinstance(crit, list):
            crit = dict.fromkeys(crit) if all(isinstance(x, str) for x in crit) and len(set(crit)) == len(crit) else crit
        if not isinstance(crit, dict) or len(crit) < 2:
            raise _refuse(where, f"{f}.criteria", "a choice needs {label: description} (or labels) with two or more options")
        for label, desc in crit.items():
            if not isinstance(label, str) or not label.strip():
                raise _refuse(where, f"{f}.criteria", f"label {label!r} is not a non-empty string")
            if desc is not None and not isinstance(desc, str):
                raise _refuse(where, f"{f}.criteria.{label}", "a description is a string or null")
        return Question(qid, kind, text, tuple(crit), tuple(crit.values()))
    if kind == "score":
        if not isinstance(crit, list) or not 2 <= len(crit) <= 10 or not all(isinstance(x, str) and x for x in crit):
            raise _refuse(where, f"{f}.criteria", "a score needs a list of 2 to 10 level descriptions, lowest first")
        return Question(qid, kind, text, tuple(crit), tuple(crit))
    if crit is None:
        return Question(qid, kind, text)
    if not isinstance(crit, dict) or set(crit) != {"true", "false"} or not all(isinstance(v, str) for v in crit.values()):
        raise _refuse(where, f"{f}.criteria", 'noul criteria are optional: {"true": "...", "false": "..."}')
    return Question(qid, kind, text, ("true", "false"), (crit["true"], crit["false"]))


def parse_request(rec: Any, where: str) -> Request:
    """One record of the System One file.

    Raises:
        FixtureError: a missing or malformed field, a picture not in ``oracles/builtin/images``, a sha256
            that is not the request's (each naming ``where`` and the field).
    """
    if not isinstance(rec, dict):
        raise FixtureError(f"{where}: a record must be an object")
    req = require(rec, "request", dict, where)
    state = req.get("state")
    if state is not None and not isinstance(state, (str, dict)) or isinstance(state, str) and not state.strip():
        raise _refuse(where, "request.state", "a state is a non-empty string, a JSON object, or null")
    images = req.get("images", [])
    if not isinstance(images, list) or not all(isinstance(x, str) for x in images):
        raise _refuse(where, "request.images", "a list of picture file names")
    for i, name in enumerate(images):
        if "/" in name or not (IMAGES / name).is_file():
            raise _refuse(where, f"request.images[{i}]", f"{name!r} is not a picture in {IMAGES}")
    if state is None and not images:
        raise _refuse(where, "request.state", "null only when pictures carry the state")
    raw_qs = require(req, "questions", dict, f"{where}: field 'request'")
    if not raw_qs:
        raise _refuse(where, "request.questions", "no questions")
    qs = tuple(parse_question(qid, raw, where) for qid, raw in raw_qs.items())
    sha = require(rec, "sha256", str, where)
    if sha != canonical_sha256(req):
        raise _refuse(where, "sha256", f"{sha} is not the request's {canonical_sha256(req)}")
    return Request(require(rec, "id", str, where), state, tuple(images), qs, sha)


def load_requests(path: Path = SYSTEM_ONE) -> list[Request]:
    """Every record of ``path``, parsed strictly (ids unique).

    Raises:
        FixtureError: unreadable JSON (with its line), a bad record (:func:`parse_request`), a repeated id.
    """
    try:
        doc = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}: not JSON: {exc.msg} at line {exc.lineno}") from None
    recs = require(doc, "records", list, str(path))
    out: list[Request] = []
    for i, rec in enumerate(recs):
        rid = rec.get("id") if isinstance(rec, dict) else None
        r = parse_request(rec, f"{path.name}: record {rid if isinstance(rid, str) else i!r}")
        if any(x.id == r.id for x in out):
            raise FixtureError(f"{path.name}: record {r.id!r}: field 'id': repeated")
        out.append(r)
    return out


# -- prompt ------------------------------------------------------------------------------------------
def single_token(encode: Encode, text: str) -> int | None:
    """The id of ``text`` when it encodes to exactly one token, else None."""
    ids = list(encode(text))
    return int(ids[0]) if len(ids) == 1 else None


def codes(encode: Encode, labels: Sequence[str]) -> list[tuple[str, int]]:
    """``(code, token id)`` per option, each token distinct (module docstring).

    Raises:
        ValueError: the fallback pool has no free single-token code left.
    """
    clean = [str(x).strip() for x in labels]
    if all(len(x) == 1 and x.isalpha() for x in clean):
        first = clean
    else:
        first = [chr(65 + i) for i in range(len(clean))] if len(clean) <= 26 else [f"{i:02d}" for i in range(len(clean))]
    out: list[tuple[str, int]] = []
    for code in first:
        for candidate in (code, *FALLBACK):
            tid = single_token(encode, candidate)
            if tid is not None and tid not in {t for _, t in out}:
                out.append((candidate, tid))
                break
        else:
            raise ValueError(f"no single-token code left for option {len(out)} of {len(clean)}")
    return out


def question_block(encode: Encode, q: Question) -> str:
    """The question's text before the turn closes (module docstring)."""
    if q.kind == "choice":
        lines = [f"{code} {desc or label.replace('_', ' ')}"
                 for (code, _), label, desc in zip(codes(encode, q.labels), q.labels, q.descriptions)]
        return q.instructions + "\n\nOptions:\n" + "\n".join(lines) + "\n\nReply with the option code only."
    if q.kind == "score":
        legend = "\n".join(f"{i} {d}" for i, d in enumerate(q.labels))
        return f"{q.instructions}\n\n{legend}\n\nReply with a single digit 0-{len(q.labels) - 1} only."
    extra = f"\nYes: {q.descriptions[0]}\nNo: {q.descriptions[1]}" if q.descriptions else ""
    return f"{q.instructions}{extra}\n\nReply with yes or no only."


def prefix(state: str | dict[str, Any] | None, bos: str, images: str) -> str:
    """The shared head of a request's rows: BOS, the user turn's head, the pictures' markup, the state."""
    if state is None:
        body = ""
    else:
        block = f"{state}\n\n" if isinstance(state, str) else json.dumps(state, ensure_ascii=False, indent=2) + "\n\n"
        body = block + "\nQUESTION:\n"
    return f"{bos}{TURN_OPEN}user\n{images}{body}"


def suffix(encode: Encode, q: Question) -> str:
    """A question's branch: its block, the turn's close and the assistant's head (the answer slot last)."""
    return f"{question_block(encode, q)}{TURN_CLOSE}\n{TURN_OPEN}assistant\n"


# -- read-out ----------------------------------------------------------------------------------------
def readout_groups(encode: Encode, q: Question) -> list[list[int]]:
    """The token ids scored for each option, one group per answer key (module docstring).

    Raises:
        ValueError: a form the rule needs has no single token (no yes/no, a digit, an option code).
    """
    def forms(texts: Sequence[str]) -> list[int]:
        out: list[int] = []
        for t in texts:
            tid = single_token(encode, t)
            if tid is not None and tid not in out:
                out.append(tid)
        return out

    if q.kind == "noul":
        groups = [forms(YES), forms(NO)]
    elif q.kind == "score":
        groups = [forms([str(i)]) for i in range(len(q.labels))]
    else:
        groups = [[tid] + [t for t in forms([f" {code}"]) if t != tid] for code, tid in codes(encode, q.labels)]
    if any(not g for g in groups):
        raise ValueError(f"question {q.qid}: an option has no single-token form in this tokenizer")
    return groups


def readout(logz: Sequence[float] | Any, groups: Sequence[Sequence[int]]) -> list[float]:
    """Option probabilities: softmax over the options of each group's largest log-probability (float64)."""
    scores = [max(float(logz[i]) for i in g) for g in groups]
    top = max(scores)
    e = [math.exp(s - top) for s in scores]
    return [x / sum(e) for x in e]


def answer(q: Question, p: Sequence[float]) -> dict[str, Any]:
    """The answer D1Model's ``predict`` writes for ``q`` with option probabilities ``p`` (module docstring)."""
    if q.kind == "noul":
        return {"type": "bool", "value": round(p[0], PLACES) >= BOOL_AT, "probability": round(p[0], PLACES)}
    best = max(range(len(p)), key=lambda i: p[i])
    names = q.names()
    out: dict[str, Any] = {"type": q.kind, "probabilities": {n: round(v, PLACES) for n, v in zip(names, p)},
                           "metadata": {"confidence": round(p[best], PLACES)}}
    if q.kind == "choice":
        out["value"] = names[best]
    else:
        out["value"] = round(sum(i * v for i, v in enumerate(p)), PLACES)
        out["metadata"]["legend"] = {str(i): d for i, d in enumerate(q.labels)}
    return out
