"""d1 family: a *request* is a state (text) and typed *questions* read out at an answer slot.

A request record of ``oracles/builtin/records/d1/requests.json``::

    {"id": "fact_planets", "source": "facts",
     "request": {"state": "...", "questions": {"q1": {"type": "noul", "prompt": "..."}, ...}},
     "gold": {"q1": "true"}, "sha256": <sha256 of the canonical JSON of "request">}

Question types (each renders to a row whose last position is the *answer slot*):

* ``noul`` -- true/false; keys ``["true", "false"]``.
* ``choice`` -- named options ``"options": [str, ...]``; keys = the options.
* ``score`` -- a whole number ``"min".."max"`` with ``0 <= min <= max <= 9`` (one digit token each in
  this tokenizer); keys = ``"min"``, ..., ``"max"``.

Parsing is strict (:func:`parse_question`): an unknown type, an empty or duplicate option, an empty
score range, a missing prompt are refused with the file, record id and field named. A refused question
is left out of its request and kept in :attr:`Request.rejected` (the receipt lists it).

Rendering: the user turn is ``STATE + "\\n\\nQuestion: " + prompt + "\\n" + instruction`` through the
snapshot's chat template with the generation prompt; the answer slot is the row's last position (the
first token of the assistant's answer is predicted there). The *tree* path shares one trunk: the ids
of ``STATE + "\\n\\nQuestion:"`` (prefilled once into the KV cache); each question's *branch* is the
rest of its row. The trunk ends at ``:`` so the byte-level BPE cannot merge across the split (the row's
next pre-token is `` <word>``); :func:`tree_split` finds it from ids alone, and ``oracles records d1``
checks it against the text split.

Read-out groups (:func:`readout_groups`): for each key, the variants ``key``, ``Key`` (first letter
capitalised), `` key`` and `` Key`` (leading space), each contributing the *first* token id of its
encoding. Duplicates within a group are dropped (first occurrence kept, in that variant order). A
token id that two groups share spells no single answer: it is removed from both, and a group left
empty refuses the question (field ``options``). So for scores, where this tokenizer encodes `` 7`` as a
bare space then ``7``, the shared space drops out and each group is the one digit token; for options
such as ``Lisbon``/``London`` a shared first piece (``L``) drops out and the space-led forms remain.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

from oracles.errors import FixtureError
from oracles.families.records import RECORDS, canonical_sha256, family_tokens, load_record_list, require

D1 = RECORDS / "d1"
REQUESTS = D1 / "requests.json"
RED_ARMS = D1 / "red_arms.json"
#: Length buckets of a state, in tokens of the state text alone (a state of n tokens falls in the
#: smallest bucket >= n); the d1 read-out program's contract buckets.
BUCKETS = (64, 128, 256, 512, 1024, 2048, 4096)
TYPES = ("noul", "choice", "score")
QUESTION_MARK = "\n\nQuestion:"
INSTRUCTIONS = {
    "noul": "Answer with true or false only.",
    "choice": "Answer with one of these options only: {options}.",
    "score": "Answer with one whole number from {min} to {max} only.",
}


@dataclass(frozen=True)
class Question:
    """One parsed question. ``keys`` name the read-out groups in order."""

    qid: str
    type: str
    prompt: str
    keys: tuple[str, ...]
    options: tuple[str, ...] = ()
    low: int = 0
    high: int = 0

    def instruction(self) -> str:
        return INSTRUCTIONS[self.type].format(options=", ".join(self.options), min=self.low, max=self.high)

    def user_tail(self) -> str:
        """What follows the state in the user turn."""
        return f"{QUESTION_MARK} {self.prompt}\n{self.instruction()}"


@dataclass(frozen=True)
class Rejected:
    """A question the strict parser refused: its id, the offending field and why."""

    qid: str
    field: str
    reason: str

    def to_json(self) -> dict[str, str]:
        return {"qid": self.qid, "field": self.field, "reason": self.reason}


@dataclass(frozen=True)
class Request:
    """A parsed request record; ``questions`` holds the accepted questions in file order."""

    id: str
    source: str
    state: str
    questions: tuple[Question, ...]
    gold: dict[str, str | None]
    sha256: str
    rejected: tuple[Rejected, ...] = ()
    raw: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @property
    def path(self) -> str:
        """``tree`` when several questions share the state, else ``row``."""
        return "tree" if len(self.questions) > 1 else "row"


class ChatIds(Protocol):
    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]: ...


class QuestionError(FixtureError):
    """A question refused by the strict parser; ``field`` is the offending field."""

    def __init__(self, where: str, field_name: str, reason: str) -> None:
        super().__init__(f"{where}: field {field_name!r}: {reason}")
        self.field, self.reason = field_name, reason


def parse_question(qid: str, raw: Any, where: str) -> Question:
    """Parse one question strictly.

    Args:
        qid: the question's key in ``request.questions``.
        raw: its JSON value.
        where: ``"<file>: record '<id>'"`` for messages.

    Raises:
        QuestionError: naming ``where`` and the field ``questions.<qid>.<field>``.
    """
    f = f"questions.{qid}"
    if not isinstance(raw, dict):
        raise QuestionError(where, f, f"a question must be an object, got {type(raw).__name__}")
    kind = raw.get("type")
    if kind not in TYPES:
        raise QuestionError(where, f"{f}.type", f"unknown type {kind!r} (known: {', '.join(TYPES)})")
    prompt = raw.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        raise QuestionError(where, f"{f}.prompt", "missing or empty")
    known = {"type", "prompt", "options"} if kind == "choice" else {"type", "prompt", "min", "max"} if kind == "score" \
        else {"type", "prompt"}
    extra = sorted(set(raw) - known)
    if extra:
        raise QuestionError(where, f"{f}.{extra[0]}", f"not a field of a {kind} question (fields: {', '.join(sorted(known))})")
    if kind == "noul":
        return Question(qid, kind, prompt, ("true", "false"))
    if kind == "choice":
        options = raw.get("options")
        if not isinstance(options, list) or not options:
            raise QuestionError(where, f"{f}.options", "empty or not a list")
        for i, o in enumerate(options):
            if not isinstance(o, str) or not o.strip() or o != o.strip():
                raise QuestionError(where, f"{f}.options[{i}]", f"{o!r} is not a non-empty trimmed string")
        lowered = [o.lower() for o in options]
        dup = next((o for i, o in enumerate(options) if lowered[i] in lowered[:i]), None)
        if dup is not None:
            raise QuestionError(where, f"{f}.options", f"duplicate option {dup!r} (case-insensitive)")
        if len(options) < 2:
            raise QuestionError(where, f"{f}.options", "a choice needs at least two options")
        return Question(qid, kind, prompt, tuple(options), options=tuple(options))
    low, high = raw.get("min"), raw.get("max")
    for name, v in (("min", low), ("max", high)):
        if type(v) is not int or not 0 <= v <= 9:
            raise QuestionError(where, f"{f}.{name}", f"{v!r} is not a whole number 0..9")
    assert isinstance(low, int) and isinstance(high, int)
    if high < low:
        raise QuestionError(where, f"{f}.max", f"empty score range {low}..{high}")
    return Question(qid, kind, prompt, tuple(str(i) for i in range(low, high + 1)), low=low, high=high)


def parse_request(rec: dict[str, Any], where: str) -> Request:
    """Parse one record; refused questions go to ``rejected`` (other errors raise FixtureError).

    A record declares the refusals it expects in ``expect_rejected`` (the refused fields, e.g.
    ``"questions.sea.type"``): a refusal it does not declare, or a declared one that does not happen,
    is a FixtureError, so a typo in a question type cannot quietly drop the question.
    """
    req = require(rec, "request", dict, where)
    state = require(req, "state", str, f"{where}: field 'request'")
    if not state.strip():
        raise FixtureError(f"{where}: field 'request.state' is empty")
    raw_qs = require(req, "questions", dict, f"{where}: field 'request'")
    gold = require(rec, "gold", dict, where)
    sha = require(rec, "sha256", str, where)
    actual = canonical_sha256(req)
    if sha != actual:
        raise FixtureError(f"{where}: field 'sha256' is {sha} but the request hashes to {actual}")
    questions, rejected = [], []
    for qid, raw in raw_qs.items():
        try:
            questions.append(parse_question(qid, raw, where))
        except QuestionError as exc:
            rejected.append(Rejected(qid, exc.field, exc.reason))
    declared = rec.get("expect_rejected", [])
    if not (isinstance(declared, list) and all(isinstance(f, str) for f in declared)):
        raise FixtureError(f"{where}: field 'expect_rejected' must be a list of question fields")
    for r in rejected:
        if r.field not in declared:  # a typo must not quietly drop a question: refusals are declared
            raise FixtureError(f"{where}: field '{r.field}' is refused ({r.reason}); a refusal the record "
                               f"expects is listed in 'expect_rejected'")
    unrefused = sorted(set(declared) - {r.field for r in rejected})
    if unrefused:
        raise FixtureError(f"{where}: field 'expect_rejected' lists {unrefused[0]!r}, which parsed without refusal")
    for q in questions:
        g = gold.get(q.qid)
        if g is not None and g not in q.keys:
            raise FixtureError(f"{where}: field 'gold.{q.qid}' is {g!r}, not one of {list(q.keys)}")
    unknown = sorted(set(gold) - set(raw_qs))
    if unknown:
        raise FixtureError(f"{where}: field 'gold.{unknown[0]}' names no question")
    return Request(rec["id"], str(rec.get("source", "")), state, tuple(questions),
                   {q.qid: gold.get(q.qid) for q in questions}, sha, tuple(rejected), raw=rec)


def load_requests(path: Path = REQUESTS, key: str = "records") -> list[Request]:
    """Every record of a requests file, parsed (see :func:`parse_request`).

    Raises:
        FixtureError: malformed JSON (path:line:col), a missing field, a sha256 mismatch, a bad gold key.
    """
    _, records = load_record_list(path, key, family="d1", fields=("id", "source", "request", "gold", "sha256",
                                                                  "expect_rejected", "note"))
    return [parse_request(rec, f"{path}: record {rec['id']!r}") for rec in records]


def rows_doc(pin: str) -> dict[str, Any]:
    """The d1 rows document of ``pin``'s tokenizer (its tokens file, written by ``oracles records d1
    --pin PIN``): per request its bucket, path, trunk and branches, and per question its row ids and
    read-out groups (see :mod:`oracles.families.d1.rows`).

    Raises:
        TokensMissing: no rows for that tokenizer (the command to run named).
    """
    return family_tokens("d1", pin)


# -- rendering and splitting ---------------------------------------------------------------------
def row_messages(state: str, q: Question) -> list[dict[str, str]]:
    """The chat messages of one question's row (one user turn; the template adds its system turn)."""
    return [{"role": "user", "content": state + q.user_tail()}]


def trunk_messages(state: str) -> list[dict[str, str]]:
    """The user turn cut at the shared trunk's end (``STATE`` + ``QUESTION_MARK``)."""
    return [{"role": "user", "content": state + QUESTION_MARK}]


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def tree_split(tok: ChatIds, state: str, questions: Sequence[Question]) -> tuple[list[int], list[list[int]]]:
    """(trunk ids, one branch per question) with ``trunk + branch == row ids`` for every question.

    The trunk is the common prefix of the rows' ids and of the ids of :func:`trunk_messages` (the
    template then closes the turn with a special token, so the prefix stops exactly at ``:``).

    Raises:
        ValueError: a branch would be empty (a row equals the trunk).
    """
    rows = [tok.chat_ids(row_messages(state, q)) for q in questions]
    cut = tok.chat_ids(trunk_messages(state), add_generation_prompt=False)
    n = min(common_prefix(cut, r) for r in rows)
    if any(len(r) <= n for r in rows):
        raise ValueError("tree_split: a question's row is no longer than the trunk")
    return list(rows[0][:n]), [list(r[n:]) for r in rows]


def variants(key: str) -> list[str]:
    """The surface forms whose first token spells ``key`` (see the module docstring)."""
    forms = [key, key[:1].upper() + key[1:]]
    return list(dict.fromkeys(forms + [" " + f for f in forms]))


def readout_groups(encode: Callable[[str], list[int]], q: Question) -> list[list[int]]:
    """One list of token ids per key of ``q`` (see the module docstring for the variant rule).

    Raises:
        ValueError: a group is empty once the ids shared with another group are removed.
    """
    groups = [list(dict.fromkeys(encode(v)[0] for v in variants(k))) for k in q.keys]
    owners: dict[int, set[int]] = {}
    for g, ids in enumerate(groups):
        for i in ids:
            owners.setdefault(i, set()).add(g)
    shared = {i for i, gs in owners.items() if len(gs) > 1}
    out = [[i for i in ids if i not in shared] for ids in groups]
    empty = [q.keys[g] for g, ids in enumerate(out) if not ids]
    if empty:
        raise ValueError(f"no token spells only {empty[0]!r}: its first tokens are shared with another option")
    return out


def bucket_of(n_tokens: int) -> int | None:
    """The smallest bucket holding ``n_tokens`` (None beyond the largest)."""
    return next((b for b in BUCKETS if n_tokens <= b), None)
