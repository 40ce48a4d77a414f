"""d1 System One on the LFM2-VL twin: the reference (transformers float32 CPU, System One's prompt and
read-out of :mod:`oracles.families.d1.system_one`, its own pictures) and every ``--port`` that answers System
One decisions (:class:`oracles.engines.systems.SystemOneDecisions`: ``decision_inputs``,
``decision_readout_ids``, ``decision_logprobs``, ``decision_predict``), question by question, on text states
and on pictures (``oracles/builtin/records/d1/system_one.json``).

These run on the twin pin ``lfm2-vl-d1-twin`` (the one d1 model among the built-in pins; ``--pin`` naming
other pins deselects them: marker ``builtin_pin``); a port that cannot load it is left out, one without the
capability skips naming it, and a port's measured gaps are its adapter's (``known_gap``, strict xfails).
Each request runs once per engine per session (``runs``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from oracles.checks.exact import assert_ids_equal, diff
from oracles.checks.readout import max_abs_dp, top2_gap
from oracles.engines.base import Engine
from oracles.families.d1 import system_one as so
from oracles.families.d1 import system_one_run as sr
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.d1, pytest.mark.slow, pytest.mark.builtin_pin("lfm2-vl-d1-twin")]

REQUESTS = {r.id: r for r in so.load_requests()}
KEYS = [(r.id, q.qid) for r in REQUESTS.values() for q in r.questions]
TREE_KEYS = [k for k in KEYS if len(REQUESTS[k[0]].questions) > 1]
PICTURES = [rid for rid, r in REQUESTS.items() if r.images]


def _label(key: tuple[str, str]) -> str:
    return f"{key[0]}/{key[1]}"


def _run(runs: Runs, engine: Engine, rid: str) -> sr.Run:
    return runs(("d1-so", engine.id, engine.pin, rid), lambda: sr.run(engine, REQUESTS[rid]))


def _ref_on_port_pixels(runs: Runs, reference: Engine, port: Engine, rid: str) -> list[np.ndarray]:
    """The reference's API path on the port's ids and pixels (the reference's own run for a text request)."""
    ref = _run(runs, reference, rid)
    if not REQUESTS[rid].images:
        return ref.logz
    return runs(("d1-so", f"{reference.id}-on-pixels-of", port.id, reference.pin, rid),
                lambda: sr.reference_on_port_pixels(reference, ref, _run(runs, port, rid)))


def _question(key: tuple[str, str]) -> tuple[int, so.Question]:
    qs = REQUESTS[key[0]].questions
    k = [q.qid for q in qs].index(key[1])
    return k, qs[k]


def _group_dz(a: np.ndarray, b: np.ndarray, groups: list[list[int]]) -> float:
    return max(abs(float(a[i]) - float(b[i])) for g in groups for i in g)


@pytest.mark.parametrize("key", KEYS, ids=[_label(k) for k in KEYS])
def test_so_reference_readout(runs: Runs, reference: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The reference's log-probabilities at the answer slot are a log-softmax (they exponentiate to 1),
    its read-out of them is a distribution over the options, and its answer is System One's for them."""
    run = _run(runs, reference, key[0])
    k, q = _question(key)
    z, p = run.logz[k], run.probs[key[1]]
    mass = float(np.exp(z.astype(np.float64)).sum())
    tol = reference.tolerance()
    receipt.update(kind=q.kind, ids=len(run.trunk) + (len(run.branches[k]) if run.branches else 0),
                   path="tree" if run.branches else "row", groups=run.groups[key[1]], probs=p,
                   answer=run.answers[key[1]], top2_gap=top2_gap(p), seconds=round(run.seconds, 4))
    assert z.dtype == np.float32 and z.shape == (reference.vocab_size,), f"{_label(key)}: logz {z.dtype} {list(z.shape)}"
    assert abs(mass - 1.0) < tol.logz_f64_atol, f"{_label(key)}: exp(logz) sums to {mass!r}"
    assert len(p) == len(q.names()) and abs(sum(p) - 1.0) < tol.prob_sum_atol, f"{_label(key)}: probabilities {p}"
    assert run.answers[key[1]] == so.answer(q, p), f"{_label(key)}: answer vs System One's for its probabilities"


@pytest.mark.parametrize("rid", list(REQUESTS))
def test_so_ids(runs: Runs, reference: Engine, port: Engine, rid: str, receipt: Receipt) -> None:
    """The port's ``decision_inputs`` ids (trunk and branches, pictures expanded) equal the reference's own
    renderer's and encoding's."""
    ref, got = _run(runs, reference, rid), _run(runs, port, rid)
    image_id = int(json.loads((reference.root / "config.json").read_text())["image_token_id"])
    receipt.update(trunk_len=len(ref.trunk), branch_lens=[len(b) for b in ref.branches],
                   image_ids=ref.trunk.count(image_id), reference=reference.describe())
    assert_ids_equal(got.trunk, ref.trunk, f"{rid}: {port.id} trunk vs the reference's")
    assert len(got.branches) == len(ref.branches), f"{rid}: {len(got.branches)} branches vs {len(ref.branches)}"
    for q, a, b in zip(REQUESTS[rid].questions, got.branches, ref.branches):
        assert_ids_equal(a, b, f"{rid}/{q.qid}: {port.id} branch vs the reference's")


@pytest.mark.parametrize("key", KEYS, ids=[_label(k) for k in KEYS])
def test_so_groups(runs: Runs, reference: Engine, port: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The port's ``decision_readout_ids`` groups equal the reference's read-out groups."""
    ref, got = _run(runs, reference, key[0]), _run(runs, port, key[0])
    receipt.update(groups=ref.groups[key[1]])
    assert got.groups[key[1]] == ref.groups[key[1]], \
        f"{_label(key)}: {port.id} groups {got.groups[key[1]]} vs the reference's {ref.groups[key[1]]}"


@pytest.mark.parametrize("key", KEYS, ids=[_label(k) for k in KEYS])
def test_so_port_logprobs(runs: Runs, reference: Engine, port: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The port's ``decision_logprobs`` on its API path against the reference's on the same ids and pixels
    (the port's, for a picture: the processors' difference is test_so_pixels'): max |dp| within the port's
    bound, log-probabilities at the read-out ids within its logit bound."""
    k, _ = _question(key)
    got = _run(runs, port, key[0])
    z_ref = _ref_on_port_pixels(runs, reference, port, key[0])[k]
    groups = got.groups[key[1]]
    p_ref = so.readout(z_ref, groups)
    dp, dz = max_abs_dp(got.probs[key[1]], p_ref), _group_dz(got.logz[k], z_ref, groups)
    full = diff(got.logz[k], z_ref)
    tol = port.tolerance()
    receipt.update(max_abs_dp=dp, max_abs_dlogz_groups=dz, max_abs_dlogz=full.max_abs, probs_port=got.probs[key[1]],
                   probs_reference=p_ref, pictures=list(REQUESTS[key[0]].images), path="tree" if got.branches else "row")
    assert dp <= tol.max_abs_dp, f"{_label(key)}: max |dp| {dp:.3g} > {tol.max_abs_dp}"
    assert dz <= tol.max_abs_logit, f"{_label(key)}: max |dlogz| at the read-out ids {dz:.3g} > {tol.max_abs_logit}"


@pytest.mark.parametrize("key", KEYS, ids=[_label(k) for k in KEYS])
def test_so_port_predict(runs: Runs, reference: Engine, port: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """The port's ``decision_predict`` answer equals the reference's System One answer on the same ids and
    pixels: the same value (a choice's label, a bool) unless the reference's top-2 gap is a near tie, each
    rounded probability within one unit of the 4th place plus the port's dp bound."""
    k, q = _question(key)
    z_ref = _ref_on_port_pixels(runs, reference, port, key[0])[k]
    p_ref = so.readout(z_ref, _run(runs, reference, key[0]).groups[key[1]])
    want = so.answer(q, p_ref)
    got = _run(runs, port, key[0]).answers[key[1]]
    tol = port.tolerance()
    receipt.update(port=got, reference=want)
    slack = 10.0 ** -so.PLACES + tol.max_abs_dp  # one unit of the rounded place, plus the dp bound
    assert got["type"] == want["type"], f"{_label(key)}: answer type {got['type']!r} vs {want['type']!r}"
    if q.kind == "noul":
        assert abs(got["probability"] - want["probability"]) <= slack, f"{_label(key)}: {got} vs {want}"
    else:
        assert set(got["probabilities"]) == set(want["probabilities"]), f"{_label(key)}: keys {got} vs {want}"
        worst = max(abs(got["probabilities"][n] - want["probabilities"][n]) for n in want["probabilities"])
        assert worst <= slack, f"{_label(key)}: a probability moves by {worst:.3g}: {got} vs {want}"
    if q.kind == "score":  # the expected level: each probability's slack, weighted by its level
        assert abs(got["value"] - want["value"]) <= slack * len(q.labels), f"{_label(key)}: {got} vs {want}"
    elif top2_gap(p_ref) > tol.key_margin:
        assert got["value"] == want["value"], (f"{_label(key)}: {port.id} answers {got['value']!r}, the reference "
                                               f"{want['value']!r}")


@pytest.mark.parametrize("key", TREE_KEYS, ids=[_label(k) for k in TREE_KEYS])
def test_so_tree_vs_rows(runs: Runs, engine: Engine, key: tuple[str, str], receipt: Receipt) -> None:
    """Each engine's tree (trunk once, a branch per question) against its own single-question rows: the
    row ids are the trunk + branch ids, and the probabilities agree within ``tree_row_dp``."""
    run = _run(runs, engine, key[0])
    k, _ = _question(key)
    ids, z_row = run.rows[key[1]]
    p_row = so.readout(z_row, run.groups[key[1]])
    dp, d = max_abs_dp(run.probs[key[1]], p_row), diff(run.logz[k], z_row)
    bound = engine.tolerance().tree_row_dp
    receipt.update(max_abs_dp=dp, max_abs_dlogz=d.max_abs, bit_equal=d.equal,
                   row_ids_equal_trunk_branch=ids == run.trunk + run.branches[k])
    assert_ids_equal(ids, run.trunk + run.branches[k], f"{_label(key)}: {engine.id} row ids vs trunk + branch")
    assert dp <= bound, f"{_label(key)}: {engine.id} tree vs rows max |dp| {dp:.3g} > {bound}"


@pytest.mark.parametrize("rid", PICTURES)
def test_so_pixels(runs: Runs, reference: Engine, port: Engine, rid: str, receipt: Receipt) -> None:
    """The port's pixels against the reference's own LFM2-VL preprocessing, on the real patches (same
    patch grid), within ``pixel_atol``; the figures (8-bit steps, share differing) and what the
    difference does to the log-probabilities (the reference on its own pixels vs on the port's) are recorded."""
    ref, got = _run(runs, reference, rid), _run(runs, port, rid)
    mine = np.asarray(ref.vision["pixel_values"])[np.asarray(ref.vision["pixel_attention_mask"]) == 1]
    theirs = np.asarray(got.vision["pixel_values"])[np.asarray(got.vision["pixel_attention_mask"]) == 1]
    assert mine.shape == theirs.shape, f"{rid}: port patches {list(theirs.shape)} vs the reference's {list(mine.shape)}"
    d = diff(theirs, mine)
    std = float(json.loads((reference.root / "preprocessor_config.json").read_text())["image_std"][0])
    on_port = _ref_on_port_pixels(runs, reference, port, rid)
    dz = max(_group_dz(a, b, g) for a, b, g in zip(ref.logz, on_port, ref.groups.values()))
    dp = max(max_abs_dp(so.readout(a, g), so.readout(b, g)) for a, b, g in zip(ref.logz, on_port, ref.groups.values()))
    bound = port.tolerance().pixel_atol
    receipt.update(max_abs=d.max_abs, steps_8bit=round(d.max_abs * std * 255, 3), share_differing=d.mismatches / mine.size,
                   logz_move_groups=dz, dp_move=dp, patches=int(mine.shape[0]))
    assert d.max_abs <= bound, (f"{rid}: port pixels differ from the reference's by up to {d.max_abs * std * 255:.1f} "
                                f"steps of the 8-bit scale ({d.mismatches} of {mine.size} values); the reference's "
                                f"log-probs move by {dz:.3g} on them")


def test_so_reference_unpatched(reference: Engine, port: Engine, tmp_path: Path, receipt: Receipt) -> None:
    """With the port loaded here, the reference's ids, pixels and log-probabilities of a picture request are
    bit-equal to a fresh process's that never imported mlx_vlm. Where the port brought mlx_vlm (which
    replaces transformers' ``Lfm2VlProcessor`` methods), the patch must be in place here: the positive
    control, without which the proof would be vacuous."""
    import torch
    from transformers.models.lfm2_vl import processing_lfm2_vl

    patched = processing_lfm2_vl.Lfm2VlProcessor.__call__.__module__
    if "mlx_vlm" in sys.modules:
        assert patched.startswith("mlx_vlm"), \
            f"control: mlx_vlm is loaded but did not patch Lfm2VlProcessor here (__call__ from {patched})"
    rid = "so_pic_square_tree"
    req = REQUESTS[rid]
    trunk, branches, vision = reference.decision_inputs(req.state, [q.as_request() for q in req.questions],
                                                        sr.pictures(req))
    logz = reference.decision_logprobs(trunk, branches, vision)
    out = tmp_path / "fresh.npz"
    here = str(Path(__file__).resolve().parents[2])  # the checkout or site-packages holding this oracles
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "oracles.engines.torch.lfm2_vl_fresh", reference.pin, str(reference.root), rid,
                           str(out), str(torch.get_num_threads())], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"fresh process exited {proc.returncode} (3: it imported mlx_vlm): {proc.stderr[-500:]}"
    fresh = np.load(out)
    receipt.update(patched_call=patched, threads=torch.get_num_threads(), record=rid, port=port.id)
    assert_ids_equal(trunk, fresh["trunk"].tolist(), f"{rid}: trunk here vs in a fresh process")
    assert np.array_equal(vision["pixel_values"], fresh["pixel_values"]), f"{rid}: pixels"
    for i, z in enumerate(logz):
        assert np.array_equal(z, fresh[f"logz{i}"]), f"{rid}: question {i}'s logz here vs in a fresh process"


def test_so_plain_lfm2_vl_refuses(pin: str, port: Engine, tmp_path: Path, receipt: Receipt) -> None:
    """Untranslated load check of mlx-vlm's d1 adapter (and of one built on it): without the d1 ``auto_map``
    the twin loads as mlx-vlm's plain ``lfm2_vl`` model, whose decision API refuses; with it (the port) it
    loads as the d1 model. Another port's loader is not mlx-vlm's: it skips, naming why."""
    from oracles.engines.mlx.d1 import MlxVlmD1, plain_refusal

    if not isinstance(port, MlxVlmD1):
        pytest.skip(f"port {port.id} ({type(port).__name__}) is not loaded by mlx-vlm's d1 rule: the load checked "
                    "here is mlx-vlm's")
    cls, why = plain_refusal(port.root, tmp_path / "plain")
    receipt.update(plain_class=cls, refusal=why, d1_class=port.describe()["model_class"], pin=pin)
    assert cls.endswith("lfm2_vl.Model") and "does not support decision prediction" in why, (cls, why)
    assert port.describe()["model_class"] == "mlx_vlm.models.d1.d1.Model"


def test_so_determinism(runs: Runs, engine: Engine, receipt: Receipt) -> None:
    """A picture request again, cold, from the pictures on: the same ids and the same log-probabilities
    bit for bit on each engine (so a difference elsewhere is the engines', never a run's)."""
    rid = "so_pic_circle"
    first = _run(runs, engine, rid)
    again = sr.run(engine, REQUESTS[rid])
    d = diff(again.logz[0], first.logz[0])
    receipt.update(record=rid, bit_equal=d.equal, max_abs=d.max_abs)
    assert_ids_equal(again.trunk, first.trunk, f"{rid}: {engine.id} ids, second run vs first")
    assert d.equal, f"{rid}: {engine.id} logz differ between two cold runs: {d.mismatches} values, max |d| {d.max_abs:.3g}"
