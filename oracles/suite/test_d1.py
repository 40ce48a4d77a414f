"""d1 read-out oracle: rows, trees, head re-run, hidden states, determinism, red arms, on each pin.

Each request runs once per engine per session (``runs``): every question as its own row (the row
path) and, for several questions, one trunk plus a branch per question (the tree path). The tests
read what those passes computed. Ports (``engine_id`` beyond the reference) run the records
``--port-records`` selects (default ``sample``: the rows of at most 80 tokens; see README).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.checks import readout
from oracles.checks.close import log_softmax64
from oracles.checks.exact import assert_bits_equal, assert_ids_equal, assert_within, diff
from oracles.checks.fingerprint import as_f4, fingerprint
from oracles.engines.base import Engine, check_fits
from oracles.families.d1 import records as d1
from oracles.families.d1.params import FULL_BUCKETS, ArmKey, Bucket, QuestionKey, RequestId, full_keys
from oracles.families.d1.params import view as _view
from oracles.families.d1.rows import load_arms
from oracles.families.d1.run import RequestRun, row_pass, run_request
from oracles.families.port_scope import PortScope
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt
from oracles.receipts.units import attach_unit

pytestmark = [pytest.mark.d1, pytest.mark.slow]

REQUESTS = {r.id: r for r in d1.load_requests()}
#: Parameters come from the requests (tokenizer-independent); each pin's rows (its d1 tokens) say
#: which questions have rows for its tokenizer, its trees, buckets and sizes.
QUESTIONS = [QuestionKey(r.id, q.qid) for r in REQUESTS.values() for q in r.questions]
TREES = [RequestId(r.id) for r in REQUESTS.values() if len(r.questions) > 1]
TREE_QUESTIONS = [k for k in QUESTIONS if k[0] in TREES]
ARMS = {a["id"]: a for a in load_arms()}


def _row(pin: str, key: tuple[str, str]) -> dict[str, Any]:
    """The question's row on this pin's tokenizer; skipped (reason named) where the tokenizer rejects it."""
    row = _view(pin).rows.get(key)
    if row is None:
        pytest.skip(f"{_label(key)}: no row for pin {pin}'s tokenizer ({_view(pin).rejection(key)})")
    return row


def _tree_meta(pin: str, rid: str) -> dict[str, Any]:
    meta = _view(pin).meta[rid]
    if meta["path"] != "tree":
        pytest.skip(f"{rid}: fewer than two questions have rows for pin {pin}'s tokenizer")
    return meta


def _label(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


def _run(runs: Runs, engine: Engine, rid: str) -> RequestRun:
    """The request's row and tree passes on ``engine``, once a session (a port runs only the requests
    ``--port-records`` selects: the others are never collected for it, :mod:`oracles.families.d1.params`)."""
    req = REQUESTS[rid]
    view = _view(engine.pin)
    check_fits(engine, rid, view.row_tokens[rid])
    rows = {qid: view.rows[(r, qid)] for (r, qid) in view.rows if r == rid}
    full = [k.qid for k in full_keys(engine.pin) if k.rid == rid]
    return runs(("d1", engine.id, engine.pin, rid), lambda: run_request(engine, req, rows, full))


def _row_run(runs: Runs, engine: Engine, key: tuple[str, str]) -> Any:
    """The row pass of question ``key`` (skipped where the pin's tokenizer has no row for it)."""
    _row(engine.pin, key)
    return _run(runs, engine, key[0]).rows[key[1]]


def _facts(engine: Engine, key: tuple[str, str], probs: list[float]) -> dict[str, Any]:
    """The figures ``oracles summarize`` reads beside a question's read-out unit (which holds its record,
    question id, pin, engine, keys, probabilities and answer); ``near_tie`` by the engine's
    ``readout_near_tie``."""
    pin, (rid, qid) = engine.pin, key
    row, meta = _row(pin, key), _view(pin).meta[rid]
    top = row["keys"][readout.argmax(probs)]
    gold = REQUESTS[rid].gold.get(qid)
    gap = readout.top2_gap(probs)
    return {"source": meta["source"], "type": row["type"], "bucket": meta["bucket"], "path": meta["path"],
            "row_len": row["row_len"], "gold_key": gold, "gold_match": None if gold is None else gold == top,
            "top2_gap": gap, "near_tie": gap <= engine.tolerance().readout_near_tie}


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_row_ids(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The engine's chat-template ids of the row equal the pin's d1 rows's (the tokenizer-alone ids)."""
    run = _row_run(runs, engine, key)
    receipt.update(row_len=len(run.ids), request_sha256=_view(engine.pin).meta[key[0]]["sha256"])
    assert_ids_equal(run.ids, _row(engine.pin, key)["ids"], f"{_label(key)}: engine chat ids vs the pin's d1 rows")


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_logz(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The row's log-probabilities are log_softmax of its recorded slot logits, bit for bit, and
    within float32 rounding of a float64 log-softmax."""
    run = _row_run(runs, engine, key)
    logits = as_f4(run.logits, f"{_label(key)}: slot logits [1, V]")
    assert logits.shape == (1, engine.vocab_size), f"{_label(key)}: slot logits shape {list(logits.shape)}"
    assert_bits_equal(run.logz, readout.log_softmax(logits[0]), f"{_label(key)}: logz vs log_softmax(logits)")
    d = assert_within(run.logz, log_softmax64(logits[0]), engine.tolerance().logz_f64_atol,
                      f"{_label(key)}: logz vs float64 log-softmax")
    receipt.update(logits=dict(fingerprint(logits)), logz_vs_f64_max_abs=d.max_abs)


def _comparable(pytestconfig: pytest.Config, engine: Engine, key: QuestionKey, receipt: Receipt) -> bool:
    """Whether a question's unit is attached: a request inside ``--port-records`` (the rule of
    test_prefill_comparable). No port is held on the others in this scope, and their slot rows were most
    of the sidecar's d1 bytes (the reference reads out every question, a port its sample); said in the
    record otherwise."""
    scope = PortScope.parse(pytestconfig.getoption("port_records"))
    if scope.selects(key.port_tokens(engine.pin), key.sample_tokens):
        return True
    receipt.update(unit_not_attached=f"{_label(key)}: {key.port_tokens(engine.pin)} tokens, outside --port-records "
                                     f"{pytestconfig.getoption('port_records')}: no port is held on it in this scope "
                                     f"(pass --port-records all to attach its slot logits)")
    return False


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_readout(runs: Runs, engine: Engine, key: QuestionKey, receipt: Receipt, pytestconfig: pytest.Config) -> None:
    """readout(logz) with the pin's d1 rows's groups equals the row's probabilities bit for bit; the figures
    (probabilities, argmax, gold agreement, top-2 gap, seconds) go to the receipt."""
    run = _row_run(runs, engine, key)
    groups = _row(engine.pin, key)["readout_ids"]
    again = readout.group_probabilities(run.logz, groups)
    if _comparable(pytestconfig, engine, key, receipt):
        attach_unit(receipt, "d1-row", request_sha256=_view(engine.pin).meta[key[0]]["sha256"], pin=engine.pin,
                    engine=engine.id, record=key[0], unit=key[1], ids=run.ids, keys=_row(engine.pin, key)["keys"],
                    probs=run.probs, arrays={"slot_logits": run.logits})  # [1, V]: `oracles compare` holds a port's to it
    receipt.update(_facts(engine, key, run.probs), seconds=round(run.seconds, 4),
                   logz_groups=[[float(run.logz[i]) for i in g] for g in groups])
    assert len(run.probs) == len(groups), f"{_label(key)}: {len(run.probs)} probabilities for {len(groups)} groups"
    readout.assert_probs_equal(again, run.probs, f"{_label(key)}: readout(logz) vs the row's probabilities")
    assert abs(sum(run.probs) - 1.0) < engine.tolerance().prob_sum_atol, \
        f"{_label(key)}: probabilities sum to {sum(run.probs)!r}"


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_head_rerun(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """lm_head on the kept final-norm hidden row reproduces the kept slot logits row (the engine's
    ``head_rerun_atol``: one row each side, like with like)."""
    run = _row_run(runs, engine, key)
    atol = engine.tolerance().head_rerun_atol
    again = engine.lm_head(run.hidden)
    exact = diff(again, run.logits)
    receipt.update(bit_equal=exact.equal, mismatches=exact.mismatches, max_abs=exact.max_abs, atol=atol)
    assert_within(again, run.logits, atol, f"{_label(key)}: lm_head(hidden at the slot) vs slot logits")


@pytest.mark.parametrize("key", QUESTIONS, ids=[_label(k) for k in QUESTIONS])
def test_hidden_states(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The slot's final-norm hidden state is [1, D] and finite."""
    run = _row_run(runs, engine, key)
    h = as_f4(run.hidden, f"{_label(key)}: final-norm hidden state at the slot")
    assert h.shape == (1, engine.hidden_size), f"{_label(key)}: hidden shape {list(h.shape)}"
    receipt.update(hidden=dict(fingerprint(h)), hidden_norm=float(np.linalg.norm(h.astype(np.float64))))


@pytest.mark.parametrize("bucket", [Bucket(b) for b in FULL_BUCKETS], ids=[str(b) for b in FULL_BUCKETS])
def test_full_hidden_states(runs: Runs, engine: Engine, bucket: Bucket, receipt: Receipt) -> None:
    """The first question of the bucket's first request, every position: hidden states [L, D] finite;
    lm_head on them reproduces the [L, V] logits."""
    key = bucket.key(engine.pin)
    if key is None:
        pytest.skip(f"no d1 request falls in the {bucket}-token bucket on pin {engine.pin}'s tokenizer")
    full = _run(runs, engine, key[0]).full[key[1]]
    n = _row(engine.pin, key)["row_len"]
    h = as_f4(full.hidden, f"{_label(key)}: final-norm hidden states [L, D]")
    assert h.shape == (n, engine.hidden_size), f"{_label(key)}: hidden shape {list(h.shape)}, want [{n}, D]"
    d = assert_within(engine.lm_head(h), full.logits, engine.tolerance().head_rerun_atol,
                      f"{_label(key)}: lm_head(hidden [L, D]) vs logits")
    kept = _row_run(runs, engine, key)
    slot = diff(h[-1:], kept.hidden)
    receipt.update(hidden=dict(fingerprint(h)), head_bit_equal=d.equal, head_max_abs=d.max_abs,
                   last_row_vs_kept_max_abs=slot.max_abs, last_row_vs_kept_bit_equal=slot.equal)


@pytest.mark.parametrize("rid", TREES)
def test_tree_split(runs: Runs, engine: Engine, rid: str, receipt: Receipt) -> None:
    """The tree's recorded trunk and branches equal the pin's d1 rows's split; trunk + branch is each row."""
    meta = _tree_meta(engine.pin, rid)
    run = _run(runs, engine, rid)
    tree = run.tree
    assert tree is not None, f"{rid}: a request with several questions ran no tree"
    rows_s = sum(r.seconds for r in run.rows.values())
    receipt.update(engine=engine.id, pin=engine.pin, trunk_len=len(tree.trunk), branch_lens=[len(b) for b in tree.branches],
                   bucket=meta["bucket"], questions=len(tree.branches), tree_seconds=round(tree.seconds, 4),
                   rows_seconds=round(rows_s, 4), trunk_seconds=round(tree.trunk_seconds, 4),
                   tree_over_rows=round(tree.seconds / rows_s, 4))
    assert_ids_equal(tree.trunk, meta["trunk"], f"{rid}: recorded trunk vs the pin's d1 rows")
    assert len(tree.branches) == len(meta["branches"]), f"{rid}: {len(tree.branches)} branches recorded"
    for qid, got, want in zip(meta["questions"], tree.branches, meta["branches"]):
        assert_ids_equal(got, want, f"{rid}/{qid}: recorded branch vs the pin's d1 rows")
        assert_ids_equal(tree.trunk + got, _row(engine.pin, (rid, qid))["ids"], f"{rid}/{qid}: trunk + branch vs the row")


@pytest.mark.parametrize("rid", TREES)
def test_tree_snapshot_intact(runs: Runs, engine: Engine, rid: str, receipt: Receipt) -> None:
    """Restoring the trunk's snapshot for each branch leaves the snapshot itself unchanged."""
    _tree_meta(engine.pin, rid)
    tree = _run(runs, engine, rid).tree
    assert tree is not None
    receipt.update(digest=tree.digest_before)
    assert tree.digest_after == tree.digest_before, (f"{rid}: the trunk snapshot changed while branches ran: "
                                                     f"{tree.digest_before} -> {tree.digest_after}")


@pytest.mark.parametrize("key", TREE_QUESTIONS, ids=[_label(k) for k in TREE_QUESTIONS])
def test_tree_readout(runs: Runs, engine: Engine, key: QuestionKey, receipt: Receipt,
                      pytestconfig: pytest.Config) -> None:
    """The branch's logz is log_softmax of its slot logits, and readout of it is the tree's probabilities, bit for bit."""
    _tree_meta(engine.pin, key[0]), _row(engine.pin, key)
    tree = _run(runs, engine, key[0]).tree
    assert tree is not None
    k = _tree_meta(engine.pin, key[0])["questions"].index(key[1])
    assert_bits_equal(tree.logz[k], readout.log_softmax(tree.logits[k][0]), f"{_label(key)}: tree logz vs log_softmax(logits)")
    again = readout.group_probabilities(tree.logz[k], _row(engine.pin, key)["readout_ids"])
    keys = _row(engine.pin, key)["keys"]
    if _comparable(pytestconfig, engine, key, receipt):
        attach_unit(receipt, "d1-tree", request_sha256=_view(engine.pin).meta[key[0]]["sha256"], pin=engine.pin,
                    engine=engine.id, record=key[0], unit=key[1], ids=tree.trunk + tree.branches[k], keys=keys,
                    probs=tree.probs[k], arrays={"slot_logits": tree.logits[k]})  # [1, V] at the branch's answer slot
    receipt.update(seconds_branch=round(tree.branch_seconds[k], 4))
    readout.assert_probs_equal(again, tree.probs[k], f"{_label(key)}: readout(tree logz) vs the tree's probabilities")


@pytest.mark.parametrize("key", TREE_QUESTIONS, ids=[_label(k) for k in TREE_QUESTIONS])
def test_tree_vs_row(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """Tree and row probabilities of one question agree within the engine's ``tree_row_dp`` (figure recorded)."""
    _tree_meta(engine.pin, key[0]), _row(engine.pin, key)
    run = _run(runs, engine, key[0])
    assert run.tree is not None
    k = _tree_meta(engine.pin, key[0])["questions"].index(key[1])
    row = run.rows[key[1]]
    dp = readout.max_abs_dp(run.tree.probs[k], row.probs)
    dl = diff(run.tree.logits[k], row.logits)
    facts, tol = _facts(engine, key, run.tree.probs[k]), engine.tolerance().tree_row_dp
    receipt.update(engine=engine.id, pin=engine.pin, max_abs_dp=dp, max_abs_dlogit=dl.max_abs, logits_bit_equal=dl.equal,
                   tol=tol, argmax_equal=readout.argmax(row.probs) == readout.argmax(run.tree.probs[k]),
                   gold_match_tree=facts["gold_match"], probs_tree=run.tree.probs[k], probs_row=row.probs)
    assert dp <= tol, (f"{_label(key)}: tree vs row max |dp| {dp:.3e} > {tol:g} "
                                   f"(tree {run.tree.probs[k]}, row {row.probs}; max |dlogit| {dl.max_abs:.3e})")


@pytest.mark.parametrize("key", QUESTIONS[:1], ids=[_label(k) for k in QUESTIONS[:1]])
def test_determinism(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The first request's first row again, cold, on the first run's own ids: logits, hidden state and
    probabilities bit for bit. The same ids, so a difference is nondeterminism and nothing else (the
    first run's ids are the engine's chat ids; whether they equal the pin's rows is test_row_ids')."""
    first = _row_run(runs, engine, key)
    again = row_pass(engine, list(first.ids), _row(engine.pin, key)["readout_ids"])
    receipt.update(engine=engine.id, record=_label(key), probs=again.probs, seconds=round(again.seconds, 4))
    same = f"second run vs first, both on the same {len(first.ids)} ids"
    assert_bits_equal(again.logits, first.logits, f"{_label(key)}: slot logits, {same}")
    assert_bits_equal(again.hidden, first.hidden, f"{_label(key)}: slot hidden state, {same}")
    readout.assert_probs_equal(again.probs, first.probs, f"{_label(key)}: probabilities, {same}")


#: (base record id, arm id): an arm's test runs with its base record's tests (oracles.plugin.groups.record_group).
ARM_KEYS = [ArmKey(a["base_id"], arm_id) for arm_id, a in ARMS.items()]


@pytest.mark.parametrize("arm", ARM_KEYS, ids=[k[1] for k in ARM_KEYS])
def test_red_arm(runs: Runs, engine: Engine, arm: tuple[str, str], receipt: Receipt) -> None:
    """An adopted control arm moves some option's probability by more than the engine's ``red_arm_min``
    against its base row.

    Adoption is a measurement on one pin (the arm's ``measured.pin``): on another pin the move is
    recorded and the check skips naming both, since another model's sensitivity to the change was
    never measured (the hybrid twin's seeded weights move these arms by 0.004 to 0.016)."""
    arm_id = arm[1]
    spec = ARMS[arm_id]
    base_key = (spec["base_id"], spec["question"])
    base = _row_run(runs, engine, base_key)
    row = _view(engine.pin).arm_rows[arm_id]
    arm_run = runs(("d1-arm", engine.id, engine.pin, arm_id), lambda: row_pass(engine, row["ids"], row["readout_ids"]))
    assert row["keys"] == _row(engine.pin, base_key)["keys"], f"{arm_id}: keys {row['keys']} differ from the base's"
    dp, least = readout.max_abs_dp(arm_run.probs, base.probs), engine.tolerance().red_arm_min
    keys = row["keys"]
    receipt.update(engine=engine.id, pin=engine.pin, kind=spec["kind"], base=_label(base_key), max_abs_dp=dp,
                   threshold=least, probs_base=base.probs, probs_arm=arm_run.probs,
                   argmax_base=keys[readout.argmax(base.probs)], argmax_arm=keys[readout.argmax(arm_run.probs)],
                   measured_at_adoption=spec["measured"]["max_abs_dp"], row_len=len(row["ids"]))
    adopted_on = spec["measured"].get("pin")
    if adopted_on != engine.pin:
        pytest.skip(f"{arm_id} was adopted for its move on pin {adopted_on} (max |dp| "
                    f"{spec['measured']['max_abs_dp']:.4f} > {least}); on pin {engine.pin}, never measured for "
                    f"adoption, its move {dp:.4f} is recorded, not held")
    assert dp > least, (f"{arm_id}: moves {base_key[0]}/{base_key[1]} by max |dp| {dp:.4f} <= "
                        f"{least} (base {base.probs}, arm {arm_run.probs})")
