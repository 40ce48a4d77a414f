"""d1 parsing, read-out groups, tree split and the read-out numerics (no weights, no torch)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest

from oracles.checks import readout
from oracles.checks.close import log_softmax64
from oracles.errors import FixtureError
from oracles.families.d1 import records as d1
from oracles.families.records import canonical_sha256

pytestmark = [pytest.mark.dry, pytest.mark.d1]
WHERE = "requests.json: record 'r1'"


@pytest.mark.parametrize("raw, field, text", [
    ({"type": "yesno", "prompt": "p"}, "questions.q.type", "unknown type 'yesno'"),
    ({"type": "choice", "prompt": "p", "options": []}, "questions.q.options", "empty"),
    ({"type": "choice", "prompt": "p", "options": ["a", "b", "A"]}, "questions.q.options", "duplicate option 'A'"),
    ({"type": "choice", "prompt": "p", "options": ["a"]}, "questions.q.options", "at least two"),
    ({"type": "choice", "prompt": "p", "options": ["a", " b"]}, "questions.q.options[1]", "trimmed"),
    ({"type": "score", "prompt": "p", "min": 5, "max": 1}, "questions.q.max", "empty score range 5..1"),
    ({"type": "score", "prompt": "p", "min": 0, "max": 12}, "questions.q.max", "0..9"),
    ({"type": "score", "prompt": "p", "min": True, "max": 3}, "questions.q.min", "0..9"),
    ({"type": "noul", "prompt": " "}, "questions.q.prompt", "missing or empty"),
    ({"type": "noul", "prompt": "p", "options": ["x"]}, "questions.q.options", "not a field of a noul question"),
    (["noul"], "questions.q", "must be an object"),
])
def test_refused_question_names_record_and_field(raw: Any, field: str, text: str) -> None:
    with pytest.raises(d1.QuestionError) as err:
        d1.parse_question("q", raw, WHERE)
    assert err.value.field == field
    msg = str(err.value)
    assert msg.startswith(f"{WHERE}: field {field!r}") and text in msg and "\n" not in msg, msg


def test_accepted_questions_have_their_keys() -> None:
    assert d1.parse_question("a", {"type": "noul", "prompt": "p"}, WHERE).keys == ("true", "false")
    assert d1.parse_question("b", {"type": "choice", "prompt": "p", "options": ["x", "y"]}, WHERE).keys == ("x", "y")
    assert d1.parse_question("c", {"type": "score", "prompt": "p", "min": 2, "max": 4}, WHERE).keys == ("2", "3", "4")


def _record(questions: dict[str, Any], gold: dict[str, Any], **over: Any) -> dict[str, Any]:
    req = {"state": "s", "questions": questions}
    return {"id": "r1", "source": "facts", "request": req, "gold": gold, "sha256": canonical_sha256(req)} | over


def test_rejected_question_is_left_out_and_listed() -> None:
    rec = _record({"ok": {"type": "noul", "prompt": "p"}, "bad": {"type": "maybe", "prompt": "p"}}, {"ok": "true"},
                  expect_rejected=["questions.bad.type"])
    r = d1.parse_request(rec, WHERE)
    assert [q.qid for q in r.questions] == ["ok"] and r.path == "row"
    assert [x.to_json() for x in r.rejected] == [{"qid": "bad", "field": "questions.bad.type",
                                                  "reason": "unknown type 'maybe' (known: noul, choice, score)"}]


@pytest.mark.parametrize("over, text", [
    ({"sha256": "0" * 64}, "field 'sha256' is 000"),
    ({"gold": {"ok": "maybe"}}, "field 'gold.ok' is 'maybe'"),
    ({"gold": {"nope": "true"}}, "field 'gold.nope' names no question"),
])
def test_bad_record_is_a_located_error(over: dict[str, Any], text: str) -> None:
    with pytest.raises(FixtureError, match=text):
        d1.parse_request(_record({"ok": {"type": "noul", "prompt": "p"}}, {"ok": "true"}) | over, WHERE)


def test_malformed_requests_file_names_path_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "requests.json"
    bad.write_text('{"records": [\n  {"id": "a",,}\n]}')
    with pytest.raises(FixtureError, match=r"requests.json:2:"):
        d1.load_requests(bad)


def test_readout_groups_variant_rule_and_shared_tokens() -> None:
    vocab: dict[str, list[int]] = {"yes": [1], "Yes": [2], " yes": [3], " Yes": [3], "no": [4], "No": [5], " no": [6],
                                   " No": [7], "nab": [4, 9], "Nab": [5, 9], " nab": [8], " Nab": [8]}
    q = d1.Question("q", "choice", "p", ("yes", "no"), options=("yes", "no"))
    assert d1.readout_groups(lambda s: vocab[s], q) == [[1, 2, 3], [4, 5, 6, 7]]
    shared = d1.Question("q", "choice", "p", ("no", "nab"), options=("no", "nab"))
    assert d1.readout_groups(lambda s: vocab[s], shared) == [[6, 7], [8]]  # 4 and 5 spell both: dropped
    gone = {"a": [1], "A": [1], " a": [2], " A": [2], "ab": [1, 5], "Ab": [1, 5], " ab": [2, 5], " Ab": [2, 5]}
    with pytest.raises(ValueError, match="no token spells only 'a'"):
        d1.readout_groups(lambda s: gone[s], d1.Question("q", "choice", "p", ("a", "ab"), options=("a", "ab")))


class _Tok:
    """chat_ids over a toy character-level template: each character is its code point."""

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        text = "".join(f"<{m['role']}>{m['content']}|" for m in messages) + ("<a>" if add_generation_prompt else "")
        return [ord(c) for c in text]


def test_tree_split_is_the_shared_prefix_up_to_the_question_mark() -> None:
    qs = [d1.Question("a", "noul", "Is it?", ("true", "false")), d1.Question("b", "noul", "Is it not?", ("true", "false"))]
    trunk, branches = d1.tree_split(_Tok(), "S", qs)
    assert "".join(map(chr, trunk)) == "<user>S" + d1.QUESTION_MARK
    for q, b in zip(qs, branches):
        assert trunk + b == _Tok().chat_ids(d1.row_messages("S", q))


def test_bucket_of() -> None:
    assert [d1.bucket_of(n) for n in (1, 64, 65, 4096, 4097)] == [64, 64, 128, 4096, None]


def test_log_softmax_against_float64() -> None:
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(49152) * 6).astype(np.float32)
    z = readout.log_softmax(x)
    assert z.dtype == np.float32 and z.shape == x.shape
    # float32 rounding of values of magnitude <= 40: a few ULP(32) = 3.8e-6
    assert np.abs(z.astype(np.float64) - log_softmax64(x)).max() < 1e-5
    with pytest.raises(ValueError, match="1 non-finite logits, first at \\[3\\]"):
        readout.log_softmax(np.array([0, 1, 2, np.nan], np.float32))


def test_group_probabilities_formula() -> None:
    z = np.log(np.array([0.5, 0.2, 0.1, 0.05, 0.15], np.float32))
    p = readout.group_probabilities(z, [[0, 3], [1, 2]])
    # P(G0) = 0.55, P(G1) = 0.30, renormalised over the two groups
    assert p == pytest.approx([0.55 / 0.85, 0.30 / 0.85], abs=1e-7)
    assert readout.group_probabilities(z, [[0, 3], [1, 2]]) == p  # same input, same bits
    with pytest.raises(ValueError, match="group 1 is empty"):
        readout.group_scores(z, [[0], []])
    with pytest.raises(ValueError, match="outside 0..4"):
        readout.group_scores(z, [[0], [5]])


def test_gap_argmax_dp_and_bit_assert() -> None:
    assert readout.top2_gap([0.2, 0.5, 0.3]) == pytest.approx(0.2) and readout.argmax([0.2, 0.5, 0.3]) == 1
    assert readout.max_abs_dp([0.2, 0.8], [0.25, 0.75]) == pytest.approx(0.05)
    readout.assert_probs_equal([0.25, 0.75], [0.25, 0.75], "same")
    refusal = "1 of 2 probabilities differ in bits .*first at group 1: 0.75 vs 0.7500000000000001"
    with pytest.raises(AssertionError, match=refusal):
        readout.assert_probs_equal([0.25, 0.75], [0.25, 0.7500000000000001], "x")


def test_committed_requests_parse_and_hash() -> None:
    top = json.loads(d1.REQUESTS.read_text())
    reqs = d1.load_requests()
    assert len(reqs) == len(top["records"])
    assert all(r.sha256 == canonical_sha256(rec["request"]) for r, rec in zip(reqs, top["records"]))


def test_an_undeclared_refusal_is_a_located_error() -> None:
    """A typo in a question type must not quietly drop the question (the refusal is not declared)."""
    rec = _record({"ok": {"type": "noul", "prompt": "p"}, "bad": {"type": "bool", "prompt": "p"}}, {"ok": "true"})
    with pytest.raises(FixtureError, match=r"record 'r1': field 'questions.bad.type' is refused \(unknown type 'bool'"):
        d1.parse_request(rec, WHERE)


def test_a_declared_refusal_that_parses_is_a_located_error() -> None:
    rec = _record({"ok": {"type": "noul", "prompt": "p"}}, {"ok": "true"}, expect_rejected=["questions.ok.type"])
    with pytest.raises(FixtureError, match="field 'expect_rejected' lists 'questions.ok.type', which parsed without refusal"):
        d1.parse_request(rec, WHERE)
