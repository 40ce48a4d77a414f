"""d1 dry checks: no weights, no torch or transformers.

rows.json is re-derived from requests.json, red_arms.json and the committed tokenizer copy
(jinja2 + tokenizers, :mod:`oracles.families.d1_rows`) and held against the committed file: row
ids, read-out groups, the trunk/branch split, rejected questions. A changed tokenizer, template,
request or variant rule shows up here before any model loads.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest

from oracles.checks.exact import assert_ids_equal
from oracles.families import d1
from oracles.families.d1_rows import current_rows, load_arms
from oracles.pins import sha256_file

pytestmark = [pytest.mark.dry, pytest.mark.d1]

COMMITTED = json.loads(d1.ROWS.read_text())
META = {r["id"]: r for r in COMMITTED["requests"]}
ROWS = {(r["id"], r["qid"]): r for r in COMMITTED["rows"]}
ARM_ROWS = {r["id"]: r for r in COMMITTED["arm_rows"]}
REQUESTS = d1.load_requests()
TREES = [rid for rid, m in META.items() if m["path"] == "tree"]
#: The issue's floor for the fixture: record count, multi-question records, sources.
MIN_RECORDS, MIN_MULTI = 60, 10
SOURCES = {"facts", "arithmetic", "sentiment", "entailment", "multiple_choice", "score"}


def _label(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


@pytest.fixture(scope="session")  # per record, test_d1 and this module's tests interleave on a worker:
def now() -> dict[str, Any]:       # module scope rebuilt it (~2 s) at every switch (98 s in make test)
    """rows.json as the tokenizer alone gives it today (keyed like the committed one)."""
    doc = current_rows()
    return {"doc": doc, "meta": {r["id"]: r for r in doc["requests"]},
            "rows": {(r["id"], r["qid"]): r for r in doc["rows"]}, "arm_rows": {r["id"]: r for r in doc["arm_rows"]}}


def test_dry_rows_file_current(receipt: Any) -> None:
    """rows.json was generated from the committed requests.json and red_arms.json."""
    want = sha256_file(d1.REQUESTS)
    arms = sha256_file(d1.RED_ARMS) if d1.RED_ARMS.is_file() else None
    receipt.update(requests_sha256=want, red_arms_sha256=arms)
    assert COMMITTED["requests_sha256"] == want, "rows.json is stale against requests.json: run `oracles records d1`"
    assert COMMITTED["red_arms_sha256"] == arms, "rows.json is stale against red_arms.json: run `oracles records d1`"


def test_dry_fixture_coverage(receipt: Any) -> None:
    """At least 60 records with gold answers, 10 with several questions, every bucket and source present."""
    buckets = Counter(m["bucket"] for m in META.values())
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


@pytest.mark.parametrize("key", list(ROWS), ids=[_label(k) for k in ROWS])
def test_dry_ids(now: dict[str, Any], key: tuple[str, str], receipt: Any) -> None:
    """The row ids the template and tokenizer give equal rows.json's."""
    got = now["rows"].get(key)
    assert got is not None, f"{_label(key)}: in rows.json but no longer a row"
    receipt.update(row_len=len(got["ids"]))
    assert_ids_equal(got["ids"], ROWS[key]["ids"], f"{_label(key)}: rendered+encoded ids vs rows.json")


@pytest.mark.parametrize("key", list(ROWS), ids=[_label(k) for k in ROWS])
def test_dry_readout_groups(now: dict[str, Any], key: tuple[str, str], receipt: Any) -> None:
    """The read-out groups (variant rule of oracles.families.d1) equal rows.json's."""
    got = now["rows"][key]
    receipt.update(keys=got["keys"], readout_ids=got["readout_ids"])
    assert got["keys"] == ROWS[key]["keys"], f"{_label(key)}: keys {got['keys']} vs rows.json {ROWS[key]['keys']}"
    assert got["readout_ids"] == ROWS[key]["readout_ids"], (f"{_label(key)}: read-out groups {got['readout_ids']} vs "
                                                            f"rows.json {ROWS[key]['readout_ids']}")


@pytest.mark.parametrize("rid", TREES)
def test_dry_tree_split(now: dict[str, Any], rid: str, receipt: Any) -> None:
    """The trunk/branch split equals rows.json's, and trunk + branch is each question's row."""
    got = now["meta"][rid]
    receipt.update(trunk_len=len(got["trunk"]), branch_lens=[len(b) for b in got["branches"]])
    assert_ids_equal(got["trunk"], META[rid]["trunk"], f"{rid}: trunk vs rows.json")
    assert got["questions"] == META[rid]["questions"], f"{rid}: questions {got['questions']} vs {META[rid]['questions']}"
    for qid, branch, want in zip(got["questions"], got["branches"], META[rid]["branches"]):
        assert_ids_equal(branch, want, f"{rid}/{qid}: branch vs rows.json")
        assert_ids_equal(got["trunk"] + branch, ROWS[(rid, qid)]["ids"], f"{rid}/{qid}: trunk + branch vs row ids")


@pytest.mark.parametrize("rid", list(META))
def test_dry_request(now: dict[str, Any], rid: str, receipt: Any) -> None:
    """Per request: sha256, bucket, path and rejected questions equal rows.json's (rejections listed)."""
    got, want = now["meta"][rid], META[rid]
    receipt.update(request_sha256=got["sha256"], bucket=got["bucket"], path=got["path"], rejected=got["rejected"],
                   state_tokens=got["state_tokens"])
    for name in ("sha256", "state_tokens", "bucket", "path", "questions", "rejected"):
        assert got[name] == want[name], f"{rid}: field {name!r} is {got[name]!r}, rows.json has {want[name]!r}"


@pytest.mark.parametrize("arm_id", list(ARM_ROWS))
def test_dry_arm_rows(now: dict[str, Any], arm_id: str, receipt: Any) -> None:
    """Each control arm's row ids and groups equal rows.json's; the arm differs from its base as declared."""
    got, want = now["arm_rows"][arm_id], ARM_ROWS[arm_id]
    arm = {a["id"]: a for a in load_arms()}[arm_id]
    base = next(r for r in REQUESTS if r.id == arm["base_id"]).raw["request"]
    receipt.update(kind=arm["kind"], base_id=arm["base_id"], change=arm["change"])
    assert_ids_equal(got["ids"], want["ids"], f"{arm_id}: arm row ids vs rows.json")
    assert got["readout_ids"] == want["readout_ids"], f"{arm_id}: read-out groups vs rows.json"
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
