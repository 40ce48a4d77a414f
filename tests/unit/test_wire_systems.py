"""The wire carries the systems' capabilities (:mod:`oracles.engines.systems`): the torch reference served on
the MTP twin and on the d1 twin (``oracles serve``'s own build and TCP server, in a thread of this process)
answers MTP drafting and System One decisions bit for bit as the same engine does in process, and ``oracles
wire-check``'s MTP or decision checks pass on each (its other findings on these hybrid twins are the
reference's, not the wire's: the torch reference says a linear-attention cache without past recording can be
trimmed, then its ``trim`` raises). A few calls each: the families'
own runs over the wire are the suite's business (``oracles/suite/test_wire.py``)."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

from oracles.engines.base import Engine

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

STATE = "Order 4471: two lamps, paid by card on Monday. The parcel left the warehouse on Tuesday."
QUESTIONS: dict[str, dict[str, Any]] = {
    "paid": {"type": "bool", "instructions": "Has the order been paid?",
             "criteria": {"true": "The customer has paid", "false": "No payment yet"}},
    "urgency": {"type": "score", "instructions": "How urgent is a reply?",
                "criteria": ["not urgent", "somewhat urgent", "very urgent"]},
}


def _served(pin: str) -> Iterator[tuple[Engine, Any]]:
    """(the torch engine on ``pin`` in process, a wire engine connected to it served over TCP)."""
    from oracles.commands.serve import build
    from oracles.engines.wire.client import wire_class
    from oracles.engines.wire.config import Target
    from oracles.engines.wire.server import serve_tcp
    from oracles.pins.pin import load_pin

    near = build("torch", pin, None, 1)
    where: list[tuple[str, int]] = []
    ready = threading.Event()

    def listening(host: str, port: int) -> None:
        where.append((host, port))
        ready.set()

    thread = threading.Thread(target=serve_tcp, args=(near, "127.0.0.1", 0), kwargs={"ready": listening}, daemon=True)
    thread.start()
    assert ready.wait(30), "the server did not listen"
    host, port = where[0]
    far = wire_class(Target("served", f"tcp://{host}:{port}", Path.cwd(), timeout=300))(near.root, load_pin(pin), 1)
    yield near, far
    far.close()


@pytest.fixture(scope="module")
def mtp() -> Iterator[tuple[Engine, Any]]:
    yield from _served("mtp-twin")


@pytest.fixture(scope="module")
def d1() -> Iterator[tuple[Engine, Any]]:
    yield from _served("lfm2-vl-d1-twin")


def _bits(a: np.ndarray, b: np.ndarray, what: str) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (
        f"{what}: {a.dtype} {list(a.shape)} over the wire vs {b.dtype} {list(b.shape)} in process")


def test_mtp_calls_over_the_wire_are_the_engines_bits(mtp: tuple[Engine, Any]) -> None:
    near, far = mtp
    ids = near.tokenizer.encode("The quick brown fox jumps over the lazy dog", add_special_tokens=False)[:8]
    caches = {side: (e.mtp_trunk_cache(), e.mtp_history_cache()) for side, e in (("near", near), ("far", far))}
    got = {}
    for side, e in (("near", near), ("far", far)):
        tc, mc = caches[side]
        logits, state = e.mtp_trunk(ids, tc)
        draft = e.mtp_draft(ids[1:], state[:-1], 1, mc)
        trimmed = e.trim(mc, 2)
        got[side] = (logits, state, *draft, e.mtp_head(draft[1]), e.cache_length(tc), e.cache_length(mc), trimmed)
    for i, what in enumerate(("trunk logits", "trunk state", "draft logits", "draft state", "mtp_head")):
        _bits(got["far"][i], got["near"][i], what)
    assert got["far"][5:] == got["near"][5:], f"cache lengths and trim: {got['far'][5:]} vs {got['near'][5:]}"
    a, b = far.mtp_generate(ids, 6), near.mtp_generate(ids, 6)
    assert (a.tokens, a.greedy, a.forwards, a.accepted, a.drafted) == (b.tokens, b.greedy, b.forwards, b.accepted,
                                                                        b.drafted)


def test_decision_calls_over_the_wire_are_the_engines_bits(d1: tuple[Engine, Any]) -> None:
    from PIL import Image

    from oracles.families.d1.system_one import IMAGES

    near, far = d1
    with Image.open(IMAGES / "circle_red.png") as im:
        picture = im.convert("RGB")
    forms = list(QUESTIONS.values())
    (nt, nb, nv), (ft, fb, fv) = near.decision_inputs(STATE, forms, [picture]), far.decision_inputs(STATE, forms, [picture])
    assert (ft, fb) == (nt, nb) and list(fv) == list(nv) and nv, "trunk, branches or the pixels' names differ"
    for name in nv:
        _bits(fv[name], nv[name], f"vision {name}")
    assert far.decision_readout_ids(forms[1]) == near.decision_readout_ids(forms[1])
    for a, b in zip(far.decision_logprobs(nt, nb, nv), near.decision_logprobs(nt, nb, nv), strict=True):
        _bits(a, b, "decision_logprobs")
    assert far.decision_predict(STATE, QUESTIONS, [picture]) == near.decision_predict(STATE, QUESTIONS, [picture])


@pytest.mark.parametrize(("which", "asked"), [("mtp", "mtp_trunk, mtp_draft: determinism"),
                                              ("d1", "decision_logprobs: a log-softmax [V], determinism")])
def test_wire_check_runs_the_systems_checks(which: str, asked: str, request: pytest.FixtureRequest) -> None:
    from oracles.engines.wire.conformance import run_checks

    _, far = request.getfixturevalue(which)
    report = run_checks(far)
    systems = [f for f in report.failures if f.startswith(("mtp", "decision"))]
    assert systems == [] and asked in report.passed, (report.failures, report.passed, report.skipped)
    assert [f for f in report.failures if not f.startswith("trim: ")] == [], report.failures
