"""System One's request form, prompt and read-out (oracles.families.d1.system_one): strict parsing with
one-line errors naming file, record and field; option codes and their fallback; read-out groups; the
answer form. No weights, no torch: a fake encoder stands in for the tokenizer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from oracles.errors import FixtureError
from oracles.families.d1 import system_one as so
from oracles.families.records import canonical_sha256

pytestmark = [pytest.mark.dry, pytest.mark.d1]
WHERE = "system_one.json: record 'r1'"
#: A vocabulary of single-token texts; anything else encodes to two ids per character (so it is not one token).
VOCAB = {t: i for i, t in enumerate(["A", "B", "C", "D", " A", " B", "yes", "Yes", "no", " no", "0", "1", "2", "x",
                                     "00", "01"])}


def encode(text: str) -> Sequence[int]:
    return [VOCAB[text]] if text in VOCAB else [i for c in text for i in (1000 + ord(c), 999)]


@pytest.mark.parametrize("raw, field, text", [
    ({"type": "multi", "instructions": "i"}, "questions.q.type", "unknown type 'multi'"),
    ({"type": "noul"}, "questions.q.instructions", "missing or empty"),
    ({"type": "noul", "instructions": " "}, "questions.q.instructions", "missing or empty"),
    ({"type": "noul", "instructions": "i", "prompt": "p"}, "questions.q.prompt", "not a field"),
    ({"type": "choice", "instructions": "i", "criteria": {"a": None}}, "questions.q.criteria", "two or more"),
    ({"type": "choice", "instructions": "i", "criteria": ["a", "a"]}, "questions.q.criteria", "two or more"),
    ({"type": "choice", "instructions": "i", "criteria": {"a": 1, "b": None}}, "questions.q.criteria.a", "string or null"),
    ({"type": "score", "instructions": "i", "criteria": ["low"]}, "questions.q.criteria", "2 to 10"),
    ({"type": "score", "instructions": "i", "criteria": {"0": "low", "1": "high"}}, "questions.q.criteria", "2 to 10"),
    ({"type": "score", "instructions": "i", "criteria": [str(i) for i in range(11)]}, "questions.q.criteria", "2 to 10"),
    ({"type": "bool", "instructions": "i", "criteria": {"true": "t"}}, "questions.q.criteria", "optional"),
    ("noul", "questions.q", "must be an object"),
])
def test_refused_question_names_record_and_field(raw: Any, field: str, text: str) -> None:
    with pytest.raises(FixtureError) as err:
        so.parse_question("q", raw, WHERE)
    msg = str(err.value)
    assert msg.startswith(f"{WHERE}: field {field!r}") and text in msg and "\n" not in msg, msg


def _file(tmp_path: Path, request: Any, sha: str | None = None, rid: str = "r1") -> Path:
    rec = {"id": rid, "request": request, "sha256": sha if sha is not None else canonical_sha256(request)}
    path = tmp_path / "system_one.json"
    path.write_text(json.dumps({"records": [rec]}))
    return path


@pytest.mark.parametrize("request_, field", [
    ({"state": "s", "images": ["nope.png"], "questions": {"q": {"type": "noul", "instructions": "i"}}}, "request.images[0]"),
    ({"state": "s", "images": ["../x.png"], "questions": {"q": {"type": "noul", "instructions": "i"}}}, "request.images[0]"),
    ({"state": None, "questions": {"q": {"type": "noul", "instructions": "i"}}}, "request.state"),
    ({"state": 3, "questions": {"q": {"type": "noul", "instructions": "i"}}}, "request.state"),
    ({"state": "s", "questions": {}}, "request.questions"),
    ({"state": "s", "images": "circle_red.png", "questions": {"q": {"type": "noul", "instructions": "i"}}}, "request.images"),
])
def test_refused_record_names_file_record_field(tmp_path: Path, request_: Any, field: str) -> None:
    with pytest.raises(FixtureError) as err:
        so.load_requests(_file(tmp_path, request_))
    msg = str(err.value)
    assert msg.startswith(f"system_one.json: record 'r1': field {field!r}") and "\n" not in msg, msg


def test_sha256_and_json_errors(tmp_path: Path) -> None:
    req = {"state": "s", "questions": {"q": {"type": "noul", "instructions": "i"}}}
    with pytest.raises(FixtureError, match=r"record 'r1': field 'sha256': 0+ is not the request's"):
        so.load_requests(_file(tmp_path, req, "0" * 64))
    bad = tmp_path / "broken.json"
    bad.write_text('{"records": [\n  {"id": }\n]}')
    with pytest.raises(FixtureError, match=r"broken.json: not JSON: .* at line 2"):
        so.load_requests(bad)


def test_committed_records_parse() -> None:
    reqs = so.load_requests()
    kinds = {q.kind for r in reqs for q in r.questions}
    assert kinds == {"choice", "score", "noul"}
    assert any(r.images for r in reqs) and any(len(r.questions) > 1 and r.images for r in reqs)
    assert any(isinstance(r.state, dict) for r in reqs) and any(r.state is None for r in reqs)


def test_codes_letters_fallback_and_distinct() -> None:
    assert so.codes(encode, ["A", "B"]) == [("A", 0), ("B", 1)]  # single letters are their own codes
    assert [c for c, _ in so.codes(encode, ["red", "green", "blue"])] == ["A", "B", "C"]
    # 'E' is not one token here: the first free single-token code of the pool is taken (A..D are used)
    got = so.codes(encode, ["a1", "b1", "c1", "d1", "e1"])
    assert [c for c, _ in got] == ["A", "B", "C", "D", "00"] and len({t for _, t in got}) == 5


def test_prompt_and_groups() -> None:
    choice = so.parse_question("c", {"type": "choice", "instructions": "Pick.", "criteria": {"in_stock": None, "gone": "Sold"}},
                               WHERE)
    assert so.question_block(encode, choice) == "Pick.\n\nOptions:\nA in stock\nB Sold\n\nReply with the option code only."
    assert so.readout_groups(encode, choice) == [[0, 4], [1, 5]]
    noul = so.parse_question("n", {"type": "bool", "instructions": "Ok?", "criteria": {"true": "T", "false": "F"}}, WHERE)
    assert so.suffix(encode, noul) == "Ok?\nYes: T\nNo: F\n\nReply with yes or no only.<|im_end|>\n<|im_start|>assistant\n"
    assert so.readout_groups(encode, noul) == [[6, 7], [8]]  # 'YES', 'NO' are not one token; ' no' is not a form
    score = so.parse_question("s", {"type": "score", "instructions": "How?", "criteria": ["lo", "mid", "hi"]}, WHERE)
    assert so.question_block(encode, score).endswith("0 lo\n1 mid\n2 hi\n\nReply with a single digit 0-2 only.")
    assert so.readout_groups(encode, score) == [[10], [11], [12]]
    assert so.prefix({"k": 1}, "<s>", "<image>") == '<s><|im_start|>user\n<image>{\n  "k": 1\n}\n\n\nQUESTION:\n'
    assert so.prefix(None, "<s>", "<image>") == "<s><|im_start|>user\n<image>"
    wide = so.parse_question("w", {"type": "score", "instructions": "i", "criteria": [str(i) for i in range(4)]}, WHERE)
    with pytest.raises(ValueError, match="no single-token form"):
        so.readout_groups(encode, wide)  # '3' is not one token in the fake vocabulary


def test_readout_and_answers() -> None:
    logz = np.log(np.array([0.5, 0.2, 0.1, 0.1, 0.1], dtype=np.float64))
    p = so.readout(logz, [[0, 2], [1]])  # best of each group: 0.5 vs 0.2
    assert p == pytest.approx([5 / 7, 2 / 7])
    noul = so.parse_question("n", {"type": "noul", "instructions": "i"}, WHERE)
    assert so.answer(noul, [0.49996, 0.50004]) == {"type": "bool", "value": True, "probability": 0.5}
    score = so.parse_question("s", {"type": "score", "instructions": "i", "criteria": ["a", "b"]}, WHERE)
    got = so.answer(score, [0.25, 0.75])
    assert got["value"] == 0.75 and got["metadata"] == {"confidence": 0.75, "legend": {"0": "a", "1": "b"}}
    choice = so.parse_question("c", {"type": "choice", "instructions": "i", "criteria": ["x", "y"]}, WHERE)
    assert so.answer(choice, [0.3, 0.7])["value"] == "y" and choice.as_request()["criteria"] == {"x": None, "y": None}
