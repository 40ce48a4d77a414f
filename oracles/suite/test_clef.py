"""clef oracle on the vision-language pin: each engine's own invariants, row by row.

Every row (a question of a record in an arm: :mod:`oracles.families.clef.records`) runs once per engine per
session (``runs``) with the residual stream tapped; the tests read that run. ``engine`` is each
(pin, engine) pair the plugin gives the family: the reference and each port that serves a vision pin
(``--port auto``: mlx-vlm where it imports) on each pin (default ``qwen35-vl-twin``); a port is held
against the reference in ``test_clef_port.py``. Rows are parametrized module-scoped, so a row's tests
run together and a run cut by ``--deadline`` leaves whole rows finished (``test_clef_longrun.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.checks import readout
from oracles.checks.exact import assert_bits_equal, assert_within, diff
from oracles.checks.fingerprint import fingerprint
from oracles.checks.mrope import ClosedFormGap, Media, decode_planes, first_mismatches, mrope_planes, pad_runs, rope_delta
from oracles.engines.base import Engine
from oracles.engines.vision import pixel_digest
from oracles.families.clef import records as clef
from oracles.families.clef.run import (
    STREAM_RUNS,
    Row,
    RowRun,
    absmax_record,
    all_rows,
    build_prompt,
    memo_row,
    run_decode,
    vision_spec,
)
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt
from oracles.receipts.units import attach_unit

pytestmark = [pytest.mark.clef, pytest.mark.slow]

RECORDS = clef.load_records()
ROWS = all_rows(RECORDS)
ROW_IDS = [r.label for r in ROWS]
#: The decode-position checks: the first row of each (record, arm) with pictures, and the first text row.
DECODE_ROWS = [ROWS[0], *[r for i, r in enumerate(ROWS) if i and r.record.media and ROWS[i - 1].key[:2] != r.key[:2]]]
#: Pairs of cold requests on one engine, the second after the first's prefill and decode steps: a picture
#: request then a text one (the delta must fall back to 0), and two picture requests of other grids.
PAIRS = [("img_circle/native/red", "txt_count/text/circles"), ("img_pair/native/triangle", "img_circle/native/red"),
         ("vid_move4/video/last", "img_word/g128/word")]
BY_LABEL = {r.label: r for r in ROWS}


def _run(runs: Runs, engine: Engine, row: Row, root: Path, manifest: dict[str, Any], receipt: Receipt) -> RowRun:
    run, made = memo_row(runs, engine, row, vision_spec(root), manifest)
    receipt.update(row=row.label, engine=engine.id, run_made=made)
    return run


def _media(run: RowRun) -> list[Media]:
    return [Media(m.kind, m.grid) for m in run.step.media]


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_prompt_structure(runs: Runs, engine: Engine, row: Row, clef_root: Path, manifest: dict[str, Any],
                          receipt: Receipt) -> None:
    """Each picture is one vision start, its pads, one vision end (a video: one such block per temporal
    group); the engine's processor chose the grid the arm fixes (g64/g128: the square's; native/video:
    the drawn size's)."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    spec = vision_spec(clef_root)
    ids = run.ids
    got = [m.grid for m in run.step.media]
    receipt.update(tokens=len(ids), grids=[list(g) for g in got], expected_grids=[list(g) for g in run.rendered.grids])
    assert got == run.rendered.grids, f"{row.label}: processor grids {got} vs the arm's {run.rendered.grids}"
    blocks = pad_runs(ids, (spec.image_id, spec.video_id))
    want = [(kind, spec.tokens((1, h, w))) for kind, (t, h, w) in zip(run.rendered.kinds, got) for _ in range(t)]
    have = [("image" if pad == spec.image_id else "video", n) for _, n, pad in blocks]
    assert have == want, f"{row.label}: pad blocks {have} vs {want} (kind, tokens) from the grids"
    for start, n, _ in blocks:
        assert ids[start - 1] == spec.start_id and ids[start + n] == spec.end_id, \
            f"{row.label}: the block of {n} pads at {start} is not between a vision start and a vision end"
    assert ids.count(spec.start_id) == ids.count(spec.end_id) == len(blocks), \
        f"{row.label}: {ids.count(spec.start_id)} starts, {ids.count(spec.end_id)} ends for {len(blocks)} blocks"


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_tower_rows(runs: Runs, engine: Engine, row: Row, clef_root: Path, manifest: dict[str, Any],
                    receipt: Receipt) -> None:
    """The vision tower gave each picture t*h*w/merge^2 rows of the text width, as many as its pads."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    spec = vision_spec(clef_root)
    pads = {"image": run.ids.count(spec.image_id), "video": run.ids.count(spec.video_id)}
    rows = {"image": 0, "video": 0}
    for i, m in enumerate(run.step.media):
        assert m.tower.shape == (spec.tokens(m.grid), engine.hidden_size), \
            f"{row.label}: picture {i} grid {list(m.grid)}: tower rows {list(m.tower.shape)}, expected " \
            f"[{spec.tokens(m.grid)}, {engine.hidden_size}]"
        rows[m.kind] += m.tower.shape[0]
    receipt.update(tower=[dict(fingerprint(m.tower)) for m in run.step.media],
                   pixels=[pixel_digest(m.pixels) for m in run.step.media])
    if run.step.media:
        receipt.array("tower", np.concatenate([m.tower for m in run.step.media]))  # [N, D], pictures in order
    assert rows == pads, f"{row.label}: tower rows {rows} vs pad tokens {pads}"


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_mrope_closed_form(runs: Runs, engine: Engine, row: Row, clef_root: Path,
                           manifest: dict[str, Any], receipt: Receipt) -> None:
    """The rotary planes the text model received equal the closed form of :mod:`oracles.checks.mrope`."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    spec = vision_spec(clef_root)
    got = np.asarray(run.step.positions, dtype=np.int64)
    try:
        want = mrope_planes(run.ids, _media(run), spec.image_id, spec.video_id, spec.merge)
    except ClosedFormGap as exc:
        pytest.fail(f"{row.label}: {exc}", pytrace=False)
    receipt.update(rope_delta=rope_delta(want), planes_shape=list(got.shape))
    receipt.array("positions", got.astype(np.float32))
    assert got.shape == want.shape, f"{row.label}: planes of shape {list(got.shape)} vs {list(want.shape)}"
    assert not first_mismatches(got, want), f"{row.label}: M-RoPE planes vs closed form: {first_mismatches(got, want)}"


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_head_rerun(runs: Runs, engine: Engine, row: Row, clef_root: Path, manifest: dict[str, Any],
                    receipt: Receipt) -> None:
    """The LM head on the tapped final-norm hidden states reproduces the logits within the engine's
    ``vision_head_rerun_atol`` (bit equality recorded)."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    atol = engine.tolerance().vision_head_rerun_atol
    again = engine.lm_head(run.step.hidden)
    exact = diff(again, run.step.logits)
    receipt.update(bit_equal=exact.equal, max_abs=exact.max_abs, atol=atol)
    assert_within(again, run.step.logits, atol, f"{row.label}: lm_head(hidden) vs logits")


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_final_norm(runs: Runs, engine: Engine, row: Row, clef_root: Path, manifest: dict[str, Any],
                    receipt: Receipt) -> None:
    """The final norm on the last layer's tapped residual stream equals the tapped final-norm output."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    assert run.step.layers is not None and run.step.layers.shape[0] == engine.num_layers + 1
    receipt.array("hidden", run.step.hidden)  # [T, D], the final norm's output the head read
    d = assert_bits_equal(engine.final_norm(run.step.layers[-1]), run.step.hidden,
                          f"{row.label}: final_norm(layers[-1]) vs hidden")
    receipt.update(bit_equal=d.equal)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_independent_forward(runs: Runs, engine: Engine, row: Row, clef_root: Path,
                             manifest: dict[str, Any], receipt: Receipt) -> None:
    """The library's plain forward (no taps) gives the hooked run's logits bit for bit; the first row is
    also run hooked again (determinism)."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    plain = getattr(engine, "plain_logits", None)
    if plain is None:
        pytest.skip(f"engine {engine.id!r} cannot run a plain forward (no plain_logits)")
    assert_bits_equal(plain(run.rendered.prompt), run.step.logits, f"{row.label}: plain forward vs hooked logits")
    if row is ROWS[0]:
        again = engine.forward(run.rendered.prompt, layers=True)
        assert_bits_equal(again.logits, run.step.logits, f"{row.label}: second hooked run vs first (determinism)")
        receipt.update(determinism=True)


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_readout(runs: Runs, engine: Engine, row: Row, clef_root: Path, manifest: dict[str, Any],
                 receipt: Receipt) -> None:
    """d1's read-out on the answer slot: logz is log_softmax of the slot logits bit for bit, and the
    read-out of logz is the row's probabilities. The comparable ``clef-row`` unit goes to the receipt:
    the read-out and every prompt position's logits ``[T, V]`` (text and picture tokens, the slot the
    last), the rows test_port_logits holds, so ``oracles compare`` holds what the port tests hold."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    slot = run.step.logits[-1:]
    assert_bits_equal(run.logz, readout.log_softmax(slot[0]), f"{row.label}: logz vs log_softmax(slot logits)")
    readout.assert_probs_equal(readout.group_probabilities(run.logz, run.groups), run.probs,
                               f"{row.label}: readout(logz) vs the row's probabilities")
    keys = list(row.question.keys)
    gold = row.record.request.gold.get(row.question.qid)
    top = keys[readout.argmax(run.probs)]
    logits = run.step.logits  # [T, V] float32
    attach_unit(receipt, "clef-row", request_sha256=clef.arm_sha256(row.record, row.arm), pin=engine.pin,
                engine=engine.id, record=f"{row.record.id}/{row.arm}", unit=row.question.qid, ids=run.ids, keys=keys,
                probs=run.probs, argmax=logits.argmax(-1), arrays={"logits": logits})
    receipt.update(arm=row.arm, gold_key=gold, gold_match=None if gold is None else gold == top,
                   top2_gap=readout.top2_gap(run.probs), seconds=round(run.seconds, 4))
    assert abs(sum(run.probs) - 1.0) < engine.tolerance().prob_sum_atol, \
        f"{row.label}: probabilities sum to {sum(run.probs)!r}"


@pytest.mark.parametrize("row", ROWS, ids=ROW_IDS, scope="module")
def test_absmax(runs: Runs, engine: Engine, row: Row, clef_root: Path, manifest: dict[str, Any],
                receipt: Receipt) -> None:
    """Per decoder layer, the residual stream's absmax (position 0, the rest, overall, where) and the
    MLP down-projection input's, for ``oracles survey``; two chosen runs keep every layer's stream."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    figures = absmax_record(run.step, f"{row.label}")
    receipt.update(kind="absmax", pin=engine.pin, **{k: v for k, v in figures.items() if k != "run"}, run=row.label)
    if row.key in STREAM_RUNS:
        receipt.array("residual_stream", run.step.layers)  # [L + 1, T, D]
    assert len(figures["layers"]) == engine.num_layers


@pytest.mark.parametrize("row", DECODE_ROWS, ids=[r.label for r in DECODE_ROWS], scope="module")
def test_decode_positions(runs: Runs, engine: Engine, row: Row, clef_root: Path,
                          manifest: dict[str, Any], receipt: Receipt) -> None:
    """Decode steps after a prefill sit at cache length + delta on all three planes, delta from the
    prefill's closed-form planes; the prefill itself matches the closed form too."""
    run = _run(runs, engine, row, clef_root, manifest, receipt)
    dec = runs(("clef-decode", engine.id, row.key), lambda: run_decode(engine, run.rendered.prompt))
    spec = vision_spec(clef_root)
    want = mrope_planes(dec.ids, _media(run), spec.image_id, spec.video_id, spec.merge)
    assert not first_mismatches(dec.prefill, want), f"{row.label}: cached prefill planes: {first_mismatches(dec.prefill, want)}"
    delta = rope_delta(want)
    receipt.update(delta=delta, lengths=dec.lengths, steps=[p[:, 0].tolist() for p in dec.steps])
    for j, (planes, length) in enumerate(zip(dec.steps, dec.lengths)):
        expected = decode_planes(length, 1, delta)
        assert np.array_equal(planes, expected), \
            f"{row.label}: decode step {j} (cache length {length}): planes {planes[:, 0].tolist()} vs length + delta " \
            f"{expected[:, 0].tolist()} (delta {delta})"


@pytest.mark.parametrize("pair", PAIRS, ids=[f"{a}>{b}" for a, b in PAIRS], scope="module")
def test_second_request(engine: Engine, pair: tuple[str, str], clef_root: Path, manifest: dict[str, Any],
                        receipt: Receipt) -> None:
    """A request after another on the same engine gets its own planes and delta, not the first one's
    (both libraries keep the last delta on the model). The first request's delta is nonzero, so a
    stale delta would show."""
    spec = vision_spec(clef_root)
    runs_ = []
    for label in pair:
        rendered = build_prompt(engine, BY_LABEL[label], spec, manifest)
        dec = run_decode(engine, rendered.prompt)
        media = [Media(k, g) for k, g in zip(rendered.kinds, rendered.grids)]
        runs_.append((label, dec, mrope_planes(dec.ids, media, spec.image_id, spec.video_id, spec.merge)))
    (first, _, want_a), (second, dec_b, want_b) = runs_
    receipt.update(deltas=[rope_delta(want_a), rope_delta(want_b)])
    assert rope_delta(want_a) != rope_delta(want_b), f"{first} and {second} have one delta: the check could not fail"
    assert not first_mismatches(dec_b.prefill, want_b), f"{second} after {first}: {first_mismatches(dec_b.prefill, want_b)}"
    for planes, length in zip(dec_b.steps, dec_b.lengths):
        expected = decode_planes(length, 1, rope_delta(want_b))
        assert np.array_equal(planes, expected), \
            f"{second} after {first}: decode planes {planes[:, 0].tolist()} vs {expected[:, 0].tolist()} (its own delta " \
            f"{rope_delta(want_b)}; the first request's was {rope_delta(want_a)})"
