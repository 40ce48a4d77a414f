"""The wire against a far side in a subprocess (tests/unit/wire_fake.py: the cohort family's numpy engine
served by :class:`oracles.engines.wire.server.Server`): every carried call gives the in-process engine's
bits, handles are released, refusals keep their kind, and each fault of a far side (it crashes, hangs past
the time-out, closes mid-answer, answers a wrong shape, a wrong dtype, bytes that are not a frame, an
answer without its result, an error) fails its call in one line naming engine, call and field, with the
far side's last stderr lines, and leaves no process behind.

Not dry: each far side is a Python process of its own (numpy and oracles imported there, 0.2 to 0.3 s each,
eight of them), one fault waits out its 2 s time-out (the framing and the codec in process are
test_wire_dry.py's)."""

from __future__ import annotations

import gc
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.engines.base import Unsupported
from oracles.engines.wire.channel import WireError
from oracles.engines.wire.client import WireEngine, wire_class
from oracles.engines.wire.config import parse_lines

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cohort_fake import FakeEngine, fake_pin  # noqa: E402
from processes import alive  # noqa: E402

FAKE = Path(__file__).resolve().parent / "wire_fake.py"


def _engine(*faults: str, timeout: float = 60.0) -> WireEngine:
    line = f"fake = {sys.executable} {FAKE} {' '.join(faults)}"
    target = parse_lines([line, f"fake.timeout = {timeout}"], Path.cwd(), "test.ini")["wire:fake"]
    return wire_class(target)(Path("."), fake_pin("fake-pin"), 0)


@pytest.fixture(scope="module")
def far() -> Any:
    engine = _engine()
    yield engine
    engine.close()


def test_every_carried_call_gives_the_engines_bits(far: WireEngine) -> None:
    near = FakeEngine()
    assert (far.vocab_size, far.hidden_size, far.num_layers) == (near.vocab_size, near.hidden_size, near.num_layers)
    ids = [5, 17, 300, 42]
    assert far.forward(ids).logits.tobytes() == near.forward(ids).logits.tobytes()
    assert far.forward(ids, keep=1).hidden.tobytes() == near.forward(ids, keep=1).hidden.tobytes()
    fc, nc = far.make_cache(), near.make_cache()
    for chunk in ([1, 2, 3], [4], [5, 6]):
        assert far.forward(chunk, fc).logits.tobytes() == near.forward(chunk, nc).logits.tobytes()
    assert far.cache_length(fc) == near.cache_length(nc) == 6 and far.cache_length(None) == 0
    fs, ns = far.snapshot(fc), near.snapshot(nc)
    far.forward([9], fc), near.forward([9], nc)
    fb, nb = far.snapshot_buffers(fs), near.snapshot_buffers(ns)
    assert list(fb) == list(nb) and all(fb[k].tobytes() == nb[k].tobytes() for k in nb)
    assert far.snapshot_digest(fs) == near.snapshot_digest(ns) and far.buffer_digests(fs) == near.buffer_digests(ns)
    fr, nr = far.restore(fs), near.restore(ns)
    lanes_far, lanes_near = [fr, far.make_cache()], [nr, near.make_cache()]
    assert far.decode_cohort([7, 8], lanes_far).logits.tobytes() == near.decode_cohort([7, 8], lanes_near).logits.tobytes()
    hidden = near.forward(ids).hidden
    assert far.lm_head(hidden).tobytes() == near.lm_head(hidden).tobytes()
    assert (far.grow(fc, 32) is not fc) and far.cache_capacity(far.grow(fc, 32)) == 32
    assert far.resident_bytes(fs) == near.resident_bytes(ns) and far.weight_bytes() == near.weight_bytes()
    assert far.tokenizer.encode("hello world", add_special_tokens=False) == [28120, 905]
    assert far.chat_ids([{"role": "user", "content": "hi"}])[:2] == [1, 9690]


def test_a_refusal_keeps_its_kind_and_names_the_client_engine(far: WireEngine) -> None:
    with pytest.raises(Unsupported, match="engine 'wire:fake' cannot tap the attention"):
        far.taps([1, 2])  # FakeEngine keeps the base class's refusal; it crosses the wire as Unsupported
    with pytest.raises(ValueError, match="grow: capacity 1 below"):
        far.grow(far.forward([1, 2], c := far.make_cache()) and c, 1)
    with pytest.raises(WireError, match=r"engine wire:fake trim\(\): an argument cannot be carried: .* is not a cache"):
        far.trim(object(), 1)
    served = far.served
    far.served = served - {"snapshot"}  # a far side that does not serve a capability: the base class's refusal
    try:
        with pytest.raises(Unsupported, match="engine 'wire:fake' cannot snapshot a cache"):
            far.snapshot(far.make_cache())
    finally:
        far.served = served


def test_collected_handles_are_released_with_the_next_request(far: WireEngine) -> None:
    cache = far.make_cache()
    number = cache.number
    del cache
    gc.collect()
    assert number in far.channel.released
    far.cache_length(None)
    assert far.channel.released == []


def _fails(engine: WireEngine, call: str, *fragments: str) -> str:
    __tracebackhide__ = True
    with pytest.raises(WireError) as err:
        engine.forward([1, 2, 3]) if call == "forward" else getattr(engine, call)(np.zeros((2, 8), "<f4"))
    message = str(err.value)
    assert "\n" not in message, message
    assert message.startswith(f"engine wire:fake {call}(): "), message
    assert "last stderr: 'wire_fake: ready' | 'wire_fake: injecting" in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


@pytest.mark.parametrize(("fault", "fragment"), [
    ("crash", "the stream ended after 0 of the 16 bytes of a frame's prefix (the process exited with status 3)"),
    ("half", "bytes of a "),
    ("garbage", "the answer is not a frame: magic is b'loading model..."),
    ("hang", "a frame's prefix did not arrive within the time-out (2 s)"),
])
def test_a_far_side_that_breaks_the_stream_fails_its_call_and_is_gone(fault: str, fragment: str) -> None:
    engine = _engine(f"{fault}:forward", timeout=2.0)
    proc = engine.channel.transport.proc  # type: ignore[attr-defined]
    _fails(engine, "forward", fragment)
    assert proc.poll() is not None, "the far side outlived its failure"
    with pytest.raises(WireError, match=r"engine wire:fake cache_length\(\): the far side is gone since forward\(\)"):
        engine.cache_length(None)


def test_a_wrong_answer_fails_its_call_only() -> None:
    engine = _engine("shape:forward", "dtype:lm_head", "missing:final_norm", "refuse:make_cache")
    try:
        _fails(engine, "forward", "Step.logits is float32 [3, 2002]; expected float32 [T, V] = [3, 2003]")
        _fails(engine, "lm_head", "field result: is i32 [2, 2003]; expected f32")
        with pytest.raises(Unsupported):  # FakeEngine has no final norm: its refusal comes first, unharmed
            engine.final_norm(np.zeros((2, 8), "<f4"))
        with pytest.raises(WireError, match=r"make_cache\(\): the far side raised RuntimeError: the fake refuses"):
            engine.make_cache()
        assert engine.cache_length(None) == 0  # the conversation goes on
    finally:
        engine.close()
    assert engine.channel.transport.proc.poll() is not None  # type: ignore[attr-defined]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the kernel's parent-death signal is Linux's")
def test_no_far_side_outlives_a_killed_client() -> None:
    """A client process SIGKILLed while its far side is busy in a call (not reading its stdin, so EOF
    would not stop it): the far side dies with it."""
    import subprocess
    import time

    code = f"""
import os, signal, sys, threading, time
from pathlib import Path
sys.path.insert(0, {str(FAKE.parent)!r})
from cohort_fake import fake_pin
from oracles.engines.wire.client import wire_class
from oracles.engines.wire.config import parse_lines
target = parse_lines([{f"fake = {sys.executable} {FAKE} hang:cache_length"!r}], Path.cwd(), "t.ini")["wire:fake"]
engine = wire_class(target)(Path("."), fake_pin("fake-pin"), 0)
threading.Thread(target=engine.cache_length, args=(None,), daemon=True).start()
print(engine.channel.transport.pid, flush=True)
time.sleep(1.0)
os.kill(os.getpid(), signal.SIGKILL)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == -9, run.stderr[-2000:]
    pid = int(run.stdout.split()[0])
    deadline = time.monotonic() + 10
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(pid), f"far side {pid} outlived its killed client"
