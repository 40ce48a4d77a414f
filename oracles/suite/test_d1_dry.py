"""d1 dry checks: no weights, no torch or transformers.

Each pin's d1 rows (its tokens file) are re-derived from requests.json, red_arms.json and the pin's
tokenizer files (a committed copy, or its materialised snapshot; jinja2 + tokenizers,
:mod:`oracles.families.d1.rows`) and held against the committed document: row ids, read-out groups,
the trunk/branch split, rejected questions. A changed tokenizer, template, request or variant rule
shows up here before any model loads.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Callable

import pytest

from oracles.checks.exact import assert_ids_equal
from oracles.families.d1 import records as d1
from oracles.families.d1.rows import RowsView, current_rows, load_arms, rows_view
from oracles.pins.pin import Pin, sha256_file
from oracles.pins.tokenizer import tokenizer_folder
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.dry, pytest.mark.d1]

REQUESTS = d1.load_requests()
BY_ID = {r.id: r for r in REQUESTS}
QUESTIONS = [(r.id, q.qid) for r in REQUESTS for q in r.questions]
TREES = [r.id for r in REQUESTS if len(r.questions) > 1]
ARMS = [a["id"] for a in load_arms()]
#: The issue's floor for the fixture: record count, multi-question records, sources.
MIN_RECORDS, MIN_MULTI = 60, 10
SOURCES = {"facts", "arithmetic", "sentiment", "entailment", "multiple_choice", "score"}


def _label(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


# Session scope: per record, test_d1 and this module's tests interleave on a worker; one build per pin
# (~2 s), not one per module switch.
@pytest.fixture(scope="session")
def views(pins: Callable[[str], Pin]) -> Callable[[str], tuple[RowsView, RowsView]]:
    """``views(pin) -> (committed, now)``: the pin's committed d1 rows and the rows its tokenizer alone
    gives today (skips when no tokenizer copy or snapshot is at hand)."""
    made: dict[str, tuple[RowsView, RowsView]] = {}

    def get(pin: str) -> tuple[RowsView, RowsView]:
        if pin not in made:
            p = pins(pin)
            folder = tokenizer_folder(p)
            if folder is None:
                pytest.skip(f"pin {pin}: no tokenizer copy and no materialised snapshot (run `oracles materialize {pin}`)")
            made[pin] = (rows_view(pin), RowsView(current_rows(folder, pin, p.tokenizer_sha256)))
        return made[pin]

    return get


def _pair(views: Callable[[str], tuple[RowsView, RowsView]], pin: str,
          key: tuple[str, str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(committed row, row today) of a question; skips a question this tokenizer rejects in both."""
    committed, now = views(pin)
    got, want = now.rows.get(key), committed.rows.get(key)
    if got is None and want is None:
        pytest.skip(f"{_label(key)}: no row for pin {pin}'s tokenizer ({committed.rejection(key)})")
    assert got is not None, f"{_label(key)}: a row in the committed d1 tokens of {pin} but no longer a row"
    assert want is not None, \
        f"{_label(key)}: a row today but not in the committed d1 tokens of {pin}: run `oracles records d1 --pin {pin}`"
    return got, want


def test_dry_rows_file_current(pin: str, receipt: Receipt) -> None:
    """The pin's d1 rows were generated from the committed requests.json and red_arms.json."""
    committed = rows_view(pin).doc
    want = sha256_file(d1.REQUESTS)
    arms = sha256_file(d1.RED_ARMS) if d1.RED_ARMS.is_file() else None
    receipt.update(requests_sha256=want, red_arms_sha256=arms)
    fix = f"run `oracles records d1 --pin {pin}`"
    assert committed["requests_sha256"] == want, f"pin {pin}: d1 rows are stale against requests.json: {fix}"
    assert committed["red_arms_sha256"] == arms, f"pin {pin}: d1 rows are stale against red_arms.json: {fix}"


def test_dry_fixture_coverage(pin: str, receipt: Receipt) -> None:
    """At least 60 records with gold answers, 10 with several questions, every bucket and source present."""
    meta = rows_view(pin).meta
    buckets = Counter(m["bucket"] for m in meta.values())
    multi = sum(1 for r in REQUESTS if len(r.raw["request"]["questions"]) > 1)
    sources = {r.source for r in REQUESTS}
    gold = sum(1 for r in REQUESTS for g in r.gold.values() if g is not None)
    receipt.update(records=len(REQUESTS), multi_question=multi, gold_questions=gold,
                   buckets={str(k): v for k, v in sorted(buckets.items(), key=lambda kv: str(kv[0]))},
                   sources=sorted(sources))
    assert len(REQUESTS) >= MIN_RECORDS, f"{len(REQUESTS)} records < {MIN_RECORDS}"
    assert multi >= MIN_MULTI, f"{multi} multi-question records < {MIN_MULTI}"
    assert set(d1.BUCKETS) <= set(buckets), f"buckets without a record: {sorted(set(d1.BUCKETS) - set(buckets))}"
    assert None not in buckets, "a state is longer than the largest bucket"
    assert SOURCES <= sources, f"sources missing: {sorted(SOURCES - sources)}"
    assert all(g is not None for r in REQUESTS for g in r.gold.values()), "an accepted question has no gold answer"


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_dry_ids(views: Any, pin: str, key: tuple[str, str], receipt: Receipt) -> None:
    """The row ids the template and tokenizer give equal the committed ones."""
    got, want = _pair(views, pin, key)
    receipt.update(row_len=len(got["ids"]))
    assert_ids_equal(got["ids"], want["ids"], f"{_label(key)}: rendered+encoded ids vs the committed d1 rows of {pin}")


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_dry_readout_groups(views: Any, pin: str, key: tuple[str, str], receipt: Receipt) -> None:
    """The read-out groups (variant rule of oracles.families.d1.records) equal the committed ones."""
    got, want = _pair(views, pin, key)
    receipt.update(keys=got["keys"], readout_ids=got["readout_ids"])
    assert got["keys"] == want["keys"], f"{_label(key)}: keys {got['keys']} vs committed {want['keys']}"
    assert got["readout_ids"] == want["readout_ids"], (f"{_label(key)}: read-out groups {got['readout_ids']} vs "
                                                       f"committed {want['readout_ids']}")


@pytest.mark.parametrize("rid", TREES)
def test_dry_tree_split(views: Any, pin: str, rid: str, receipt: Receipt) -> None:
    """The trunk/branch split equals the committed one, and trunk + branch is each question's row."""
    committed, now = views(pin)
    meta, rows = committed.meta, committed.rows
    got = now.meta[rid]
    if meta[rid]["path"] != "tree":
        pytest.skip(f"{rid}: fewer than two questions have rows for pin {pin}'s tokenizer")
    receipt.update(trunk_len=len(got["trunk"]), branch_lens=[len(b) for b in got["branches"]])
    assert_ids_equal(got["trunk"], meta[rid]["trunk"], f"{rid}: trunk vs the committed d1 rows")
    assert got["questions"] == meta[rid]["questions"], f"{rid}: questions {got['questions']} vs {meta[rid]['questions']}"
    for qid, branch, want in zip(got["questions"], got["branches"], meta[rid]["branches"]):
        assert_ids_equal(branch, want, f"{rid}/{qid}: branch vs the committed d1 rows")
        assert_ids_equal(got["trunk"] + branch, rows[(rid, qid)]["ids"], f"{rid}/{qid}: trunk + branch vs row ids")


@pytest.mark.parametrize("rid", list(BY_ID))
def test_dry_request(views: Any, pin: str, rid: str, receipt: Receipt) -> None:
    """Per request: sha256, bucket, path and rejected questions equal the committed ones (rejections listed)."""
    committed, now = views(pin)
    got, want = now.meta[rid], committed.meta[rid]
    receipt.update(request_sha256=got["sha256"], bucket=got["bucket"], path=got["path"], rejected=got["rejected"],
                   state_tokens=got["state_tokens"])
    for name in ("sha256", "state_tokens", "bucket", "path", "questions", "rejected"):
        assert got[name] == want[name], f"{rid}: field {name!r} is {got[name]!r}, rows.json has {want[name]!r}"


@pytest.mark.parametrize("arm_id", ARMS)
def test_dry_arm_rows(views: Any, pin: str, arm_id: str, receipt: Receipt) -> None:
    """Each control arm's row ids and groups equal the committed ones; the arm differs from its base as declared."""
    committed, now = views(pin)
    got, want = now.arm_rows[arm_id], committed.arm_rows[arm_id]
    arm = {a["id"]: a for a in load_arms()}[arm_id]
    base = next(r for r in REQUESTS if r.id == arm["base_id"]).raw["request"]
    receipt.update(kind=arm["kind"], base_id=arm["base_id"], change=arm["change"])
    assert_ids_equal(got["ids"], want["ids"], f"{arm_id}: arm row ids vs the committed d1 rows")
    assert got["readout_ids"] == want["readout_ids"], f"{arm_id}: read-out groups vs the committed d1 rows"
    assert arm["request"]["questions"][arm["question"]] == base["questions"][arm["question"]], \
        f"{arm_id}: the arm's question differs from its base's"
    if arm["kind"] == "word_flip":
        a, b = arm["request"]["state"].split(), base["state"].split()
        changed = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
        assert len(a) == len(b) and len(changed) == 1, f"{arm_id}: a word flip changes {len(changed)} words"
        assert (b[changed[0]], a[changed[0]]) == (arm["change"]["from"], arm["change"]["to"]), f"{arm_id}: change {arm['change']}"
    else:
        other = next(r for r in REQUESTS if r.id == arm["change"]["state_of"]).raw["request"]["state"]
        assert arm["request"]["state"] == other, f"{arm_id}: the swapped state is not {arm['change']['state_of']!r}'s"
