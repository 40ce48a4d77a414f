"""MTP drafting (mtplx): draft/verify/commit rounds through a multi-token-prediction layer written out on
each engine's trunk and MTP layer (:mod:`oracles.families.execution.mtp`, over the engine's MTP
capability :class:`oracles.engines.systems.MtpDrafting`), the engines' own MTP generation (transformers
``generate(use_mtp=True)``, a port's library path), and each port's draft logits held against the
reference's, on the MTP twin (``mtp-twin``: a tiny Inkling with one MTP layer built to accept drafts,
:mod:`oracles.twins.mtp`).

The engines are the reference and every ``--port`` that can load the twin; one without an MTP layer
skips naming itself and the capability. A port's measured gaps are its adapter's
(:meth:`oracles.engines.base.Engine.known_gap`, strict xfails). Every run is made once a session through
the ``runs`` memo (keys ``("mtp", engine, pin, record, ...)``).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

from oracles.checks.exact import assert_ids_equal
from oracles.checks.port import held_figures, threshold_failures
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.mtp import MtpRun, greedy_tokens, mtp_generate
from oracles.families.execution.prompts import PromptRecord
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.mtplx, pytest.mark.slow, pytest.mark.builtin_pin("mtp-twin")]

#: Drafts a round (one MTP layer chained, as mlx-vlm's drafter runs it at its default block size 3).
DEPTH = 2
#: New tokens a run: "arith" + 24 tokens on the twin is 9 rounds of 2 drafts.
MAX_NEW = 24
#: MTPLX's history windows: the prompt's 44 history pairs prefilled 16 at a time.
WINDOW = 16
#: The port test whose measured gap :func:`test_mtp_draft_logits_gap_is_the_final_norm` explains.
DRAFT_TEST = "test_mtp_draft_logits_port_vs_reference"


@pytest.fixture(params=[r for r in ex.GENERATION if r.id == "arith"], ids=["arith"])
def record(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    return request.param.bind(pin)


def rounds(runs: Runs, engine: Engine, record: PromptRecord, window: int = 0) -> MtpRun:
    return runs(("mtp", engine.id, engine.pin, record.id, "rounds", window),
                lambda: mtp_generate(engine, record.ids, DEPTH, MAX_NEW, engine.eos_token_ids, window))


def greedy(runs: Runs, engine: Engine, record: PromptRecord) -> list[int]:
    return runs(("mtp", engine.id, engine.pin, record.id, "greedy"),
                lambda: greedy_tokens(engine, record.ids, MAX_NEW, engine.eos_token_ids))


def test_mtp_rounds_equal_greedy(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """MTP draft/verify/commit rounds commit exactly the greedy AR tokens, with drafts accepted (the twin
    is built to accept: a run that never accepts never tests commit); every round recorded."""
    run = rounds(runs, engine, record)
    ar = greedy(runs, engine, record)
    receipt.update(request_sha256=record.sha256, engine=engine.id, pin=engine.pin, depth=DEPTH, tokens=run.tokens,
                   rounds=[r.to_json() for r in run.rounds], accepted=run.accepted, drafted=run.drafted,
                   acceptance=round(run.accepted / max(run.drafted, 1), 4), prefill_history=run.prefill_history,
                   seconds=round(run.seconds, 4), describe=engine.describe())
    assert_ids_equal(run.tokens, ar, f"{record.id}: {engine.id} MTP rounds vs greedy AR")
    assert run.accepted > 0, f"{record.id}: {engine.id}: 0 of {run.drafted} drafts accepted; commit untested"
    assert run.accepted < run.drafted, f"{record.id}: {engine.id}: every draft accepted; correction untested"


def test_mtp_round_bookkeeping(runs: Runs, engine: Engine, record: PromptRecord) -> None:
    """Each round commits its accepted drafts then one trunk token (correction xor bonus), and leaves the
    trunk cache at the committed position and the history one pair behind it."""
    run = rounds(runs, engine, record)
    position = len(record.ids)
    assert run.prefill_history == position - 1, f"history prefill holds {run.prefill_history} pairs, not {position - 1}"
    for i, r in enumerate(run.rounds):
        last = r.correction if r.correction is not None else r.bonus
        assert (r.correction is None) != (r.bonus is None), f"round {i}: correction {r.correction}, bonus {r.bonus}"
        assert r.committed == [*r.drafts[: r.accepted], last], f"round {i}: committed {r.committed} from {r.drafts}"
        if r.correction is not None:
            assert r.correction != r.drafts[r.accepted], f"round {i}: correction equals the rejected draft"
        position += r.accepted + 1
        assert (r.trunk, r.history) == (position, position - 1), (
            f"round {i}: trunk {r.trunk}, history {r.history} at committed position {position}")


def test_mtp_history_windows(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """The history prefilled in MTPLX's windows (16 pairs a call) gives the rounds of the one-call prefill:
    the same drafts, acceptances and tokens; the first draft's logits within the engine's cache bound (a
    windowed prefill is a cache continuation; measured 0.0 on transformers and mlx-vlm)."""
    whole = rounds(runs, engine, record)
    windowed = rounds(runs, engine, record, WINDOW)
    assert whole.first_draft is not None and windowed.first_draft is not None
    dmax = float(np.abs(whole.first_draft - windowed.first_draft).max())
    receipt.update(engine=engine.id, window=WINDOW, first_draft_max_abs=dmax)
    assert [r.to_json()["drafts"] for r in windowed.rounds] == [r.to_json()["drafts"] for r in whole.rounds]
    assert_ids_equal(windowed.tokens, whole.tokens, f"{record.id}: {engine.id} windowed vs one-call history")
    tol = engine.tolerance()
    assert dmax <= tol.cache_atol, (f"{record.id}: {engine.id} first draft logits moved {dmax:.3e} by windowing the "
                                    f"history (cache bound {tol.cache_atol:g})")


def test_mtp_broken_commit_fails(runs: Runs, engine: Engine, record: PromptRecord) -> None:
    """Positive control: the same rounds with rejected drafts left in the trunk cache must not pass (the
    greedy check or the cache invariant catches it)."""

    class KeepsRejected:
        """The engine, but its trunk cache's cuts are dropped (the rejected drafts stay cached)."""

        trunk_caches: list[Any] = []

        def __getattr__(self, name: str) -> Any:
            return getattr(engine, name)

        def mtp_trunk_cache(self) -> Any:
            self.trunk_caches.append(engine.mtp_trunk_cache())
            return self.trunk_caches[-1]

        def trim(self, cache: Any, n: int) -> bool:
            return True if any(cache is c for c in self.trunk_caches) else bool(engine.trim(cache, n))

    ar = greedy(runs, engine, record)
    try:
        broken = mtp_generate(KeepsRejected(), record.ids, DEPTH, MAX_NEW, engine.eos_token_ids)
    except AssertionError:
        return
    assert broken.tokens != ar, f"{record.id}: {engine.id}: rounds that keep rejected drafts still equal greedy"


def test_library_mtp_equals_greedy(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """The engine's own MTP generation equals its own greedy generation token for token, with drafts
    accepted (transformers: derived from its trunk forwards; mlx-vlm: its drafter's accept counts), and
    that greedy generation equals the greedy decode the written-out rounds are held to."""
    lib = runs(("mtp", engine.id, engine.pin, record.id, "library"), lambda: engine.mtp_generate(record.ids, MAX_NEW))
    receipt.update(engine=engine.id, tokens=lib.tokens, greedy=lib.greedy, forwards=lib.forwards,
                   accepted=lib.accepted, drafted=lib.drafted, **lib.extra)
    assert_ids_equal(lib.tokens, lib.greedy, f"{record.id}: {engine.id} MTP generation vs its greedy")
    assert_ids_equal(lib.greedy, greedy(runs, engine, record),
                     f"{record.id}: {engine.id} generate's greedy vs the rounds' greedy decode through the cache")
    assert (lib.accepted or 0) > 0, f"{record.id}: {engine.id}: its MTP generation accepted no draft"


def test_mtp_draft_logits_port_vs_reference(runs: Runs, reference: Engine, port: Engine, record: PromptRecord,
                                            receipt: Receipt) -> None:
    """The port's first-round depth-0 draft logits against the reference's, within the port's bounds
    (:func:`oracles.checks.port.threshold_failures`)."""
    ref, got = rounds(runs, reference, record), rounds(runs, port, record)
    assert ref.first_draft is not None and got.first_draft is not None
    fig = held_figures(record.id, ref.first_draft, got.first_draft)
    receipt.update(figures={k: v for k, v in fig.items() if k != "disagreements"},
                   scale_ratio=float(np.std(got.first_draft) / np.std(ref.first_draft)))
    failures = threshold_failures(fig, tolerance=port.tolerance())
    assert not failures, f"{record.id}: {port.id} first draft logits: " + "; ".join(failures)


def test_mtp_draft_logits_gap_is_the_final_norm(runs: Runs, reference: Engine, port: Engine, record: PromptRecord,
                                               request: pytest.FixtureRequest, receipt: Receipt) -> None:
    """Where the port declares a measured gap on the draft logits (its ``known_gap`` of the test above), the
    gap is the one measured: the reference's MTP state put through the trunk's final norm before the MTP head
    gives the port's draft logits within the bounds, and the two engines' MTP inputs differ only in the state
    variant (the port's trunk state through the reference's final norm and MTP head gives the reference's
    trunk logits within the bounds; the state gap itself is recorded). A port that declares none skips."""
    declared = port.known_gap(request.node.name.replace(request.node.originalname, DRAFT_TEST))
    if declared is None:
        pytest.skip(f"port {port.id} on {port.pin} declares no draft-logits gap to explain")
    ref, got = rounds(runs, reference, record), rounds(runs, port, record)
    assert ref.first_draft_hidden is not None and got.first_draft is not None
    fig = held_figures(record.id, reference.mtp_head(reference.final_norm(ref.first_draft_hidden[None]))[0],
                       got.first_draft)
    ref_logits, ref_state = reference.mtp_trunk(record.ids, reference.mtp_trunk_cache())
    _, port_state = port.mtp_trunk(record.ids, port.mtp_trunk_cache())
    via_port = held_figures(record.id, ref_logits, reference.mtp_head(reference.final_norm(port_state)))
    state_gap = float(np.abs(reference.final_norm(port_state) - ref_state).max())
    receipt.update(declared=declared, normed_max_abs=fig["max_abs"], normed_nmse=fig["nmse"],
                   state_variant_gap=state_gap, port_state_logits_max_abs=via_port["max_abs"])
    failures = threshold_failures(fig, tolerance=port.tolerance())
    assert not failures, f"{record.id}: reference MTP state + final norm vs port draft logits: " + "; ".join(failures)
    failures = threshold_failures(via_port, tolerance=port.tolerance())
    assert not failures, (f"{record.id}: the port's trunk state through the reference's final norm and MTP head vs "
                          "the reference's logits: " + "; ".join(failures))


def test_mtp_trunk_port_vs_reference(runs: Runs, reference: Engine, port: Engine, record: PromptRecord,
                                     receipt: Receipt) -> None:
    """The port's trunk on the prompt against the reference's, every row, within the port's bounds; the two
    engines' MTP rounds commit the same tokens with the same drafts."""
    ref_run, port_run = rounds(runs, reference, record), rounds(runs, port, record)
    assert_ids_equal(port_run.tokens, ref_run.tokens, f"{record.id}: {port.id} rounds vs {reference.id} rounds")
    assert [r.drafts for r in port_run.rounds] == [r.drafts for r in ref_run.rounds], f"{record.id}: drafts differ"
    rl, _ = reference.mtp_trunk(record.ids, reference.mtp_trunk_cache())
    pl, _ = port.mtp_trunk(record.ids, port.mtp_trunk_cache())
    fig = held_figures(record.id, rl, pl)
    receipt.update(figures={k: v for k, v in fig.items() if k != "disagreements"})
    failures = threshold_failures(fig, tolerance=port.tolerance())
    assert not failures, f"{record.id}: {port.id} trunk prefill logits: " + "; ".join(failures)


def test_mtp_port_refuses_a_misplaced_step(port: Engine, record: PromptRecord) -> None:
    """An MTP step given a position its history does not stand at is refused, naming both (mlx caches
    keep their own offsets, so a wrong position would otherwise be silently ignored)."""
    with pytest.raises(ValueError, match=r"MTP step at position 5, but the history holds 0 pairs"):
        port.mtp_draft([1], np.zeros((1, port.hidden_size), np.float32), 5, port.mtp_history_cache())


#: A fresh interpreter computing the reference's trunk and first MTP draft on the twin without mlx,
#: mlx-vlm or mlx-audio imported, printing the sha256 of both float32 arrays (argv: pin, root, threads, ids).
_UNPATCHED = """
import hashlib, json, sys
from pathlib import Path
import numpy as np
from oracles.engines.torch.reference import TorchReference
from oracles.pins.pin import load_pin
pin, root, threads, ids = load_pin(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
h = TorchReference(root, pin, threads)
logits, state = h.mtp_trunk(ids, h.mtp_trunk_cache())
history = h.mtp_history_cache()
h.mtp_draft(ids[1:], state[:-1], 1, history)
draft, _ = h.mtp_draft([int(np.argmax(logits[-1]))], state[-1:], len(ids), history)
assert not any(m.startswith(("mlx", "mlx_vlm", "mlx_audio")) for m in sys.modules), "mlx was imported"
print(hashlib.sha256(logits.tobytes()).hexdigest(), hashlib.sha256(draft.tobytes()).hexdigest())
"""


def test_mtp_reference_unpatched_beside_the_port(reference: Engine, port: Engine, record: PromptRecord,
                                                receipt: Receipt) -> None:
    """The reference in this process, where the port is loaded (mlx-vlm's imports: mlx_audio sets
    ``TRANSFORMERS_NO_ADVISORY_WARNINGS``, the positive control where it is loaded), computes bit for bit
    what it computes in a fresh interpreter that never imports mlx: its trunk logits and first MTP draft."""
    import hashlib
    import json
    import subprocess
    import sys

    import torch

    here_modules = sorted(m for m in ("mlx", "mlx_vlm", "mlx_audio") if m in sys.modules)
    if "mlx_audio" in sys.modules:
        assert os.environ.get("TRANSFORMERS_NO_ADVISORY_WARNINGS") == "1", \
            "control: mlx_audio is loaded here but its import side effect is not: the proof would be vacuous"
    logits, state = reference.mtp_trunk(record.ids, reference.mtp_trunk_cache())
    history = reference.mtp_history_cache()
    reference.mtp_draft(list(record.ids[1:]), state[:-1], 1, history)
    draft, _ = reference.mtp_draft([int(np.argmax(logits[-1]))], state[-1:], len(record.ids), history)
    here = [hashlib.sha256(a.tobytes()).hexdigest() for a in (logits, draft)]
    out = subprocess.run([sys.executable, "-c", _UNPATCHED, reference.pin, str(reference.root),
                          str(torch.get_num_threads()), json.dumps(list(record.ids))],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"the fresh reference failed: {out.stderr.strip().splitlines()[-1:]}"
    fresh = out.stdout.split()[-2:]
    receipt.update(in_process=here, fresh_process=fresh, threads=torch.get_num_threads(), port=port.id,
                   port_modules_here=here_modules)
    assert here == fresh, f"{record.id}: reference trunk/draft sha256 here {here} vs a fresh interpreter {fresh}"
