"""The LiteRT port on the draft twin's .tflite (``smollm2-draft-twin-litert``) against the float32 torch
reference on the twin itself: prefill (one chunk, and three chunks through the 64-token signature),
the padding proven harmless, decode continuation against a teacher-forced reference, greedy generation,
and the refusals of a prompt past the KV rows. Slow: both engines load (~7 s, most of it transformers'
import), each forward takes milliseconds. The file tests at the top need the runtime but no pin."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from port_figures import held, prefill_held, prompt

from oracles.checks.tolerance import FLOAT32
from oracles.engines.base import ContextTooShort, Engine, Sampler
from oracles.errors import PinError
from oracles.pins.pin import load_pin

PIN, REFERENCE = "smollm2-draft-twin-litert", "smollm2-draft-twin"


def test_a_truncated_tflite_is_one_line(tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    from oracles.engines.litert.engine import load_interpreter

    path = tmp_path / "model.tflite"
    path.write_bytes(b"\x1c\x00\x00\x00TFL3" + bytes(4096))
    with pytest.raises(PinError, match=rf"^{path}: not a loadable .tflite \(4104 bytes\): .+$"):
        load_interpreter(path, 1)
    with pytest.raises(PinError, match=r"field 'files' names a .tflite that does not exist"):
        load_interpreter(tmp_path / "gone.tflite", 1)


@pytest.fixture(scope="module")
def engines(verified_snapshot: Callable[[str], Path]) -> tuple[Engine, Engine]:
    pytest.importorskip("ai_edge_litert")
    from oracles.engines.litert.engine import LiteRtPort
    from oracles.engines.torch.reference import TorchReference

    port = LiteRtPort(verified_snapshot(PIN), load_pin(PIN), threads=1)
    ref = TorchReference(verified_snapshot(REFERENCE), load_pin(REFERENCE), threads=1)
    return port, ref


@pytest.mark.slow
@pytest.mark.parametrize("n", [42, 150])
def test_prefill_matches_the_reference(engines: tuple[Engine, Engine], n: int) -> None:
    prefill_held(*engines, n)


@pytest.mark.slow
def test_padding_is_harmless(engines: tuple[Engine, Engine]) -> None:
    """The valid rows of a padded prefill do not depend on what pads it (0 or 7), bit for bit."""
    port = engines[0]
    ids = prompt(40, seed=1)
    one, two = port.make_cache(), port.make_cache()
    a, b = port._run(ids, one, pad=0), port._run(ids, two, pad=7)  # type: ignore[attr-defined]
    assert a["logits"][0, :40].tobytes() == b["logits"][0, :40].tobytes()
    assert port.snapshot_digest(one) == port.snapshot_digest(two)


@pytest.mark.slow
def test_decode_continues_the_cache(engines: tuple[Engine, Engine]) -> None:
    port, ref = engines
    ids, more = prompt(30, seed=2), prompt(8, seed=3)
    cache = port.make_cache()
    port.forward(ids, cache)
    steps = np.concatenate([port.forward([t], cache).logits for t in more])
    assert port.cache_length(cache) == 38
    held(steps, ref.forward(ids + more).logits[30:])
    snap = port.snapshot(cache)
    assert port.trim(cache, 8) and port.cache_length(cache) == 30
    again = port.forward(more, cache).logits  # the 8 tokens as one padded prefill chunk over the trimmed cache
    held(again, ref.forward(ids + more).logits[30:])
    assert port.cache_length(port.restore(snap)) == 38


@pytest.mark.slow
def test_greedy_generation_matches_the_reference(engines: tuple[Engine, Engine]) -> None:
    port, ref = engines
    ids = port.chat_ids([{"role": "user", "content": "Name three colours."}])
    a, b = port.generate(ids, Sampler(), 16), ref.generate(ids, Sampler(), 16)
    assert a.tokens == b.tokens
    held(a.step_logits, b.step_logits)


@pytest.mark.slow
def test_a_prompt_past_the_kv_rows_is_refused(engines: tuple[Engine, Engine]) -> None:
    port = engines[0]
    assert port.max_context == 512
    with pytest.raises(ValueError, match=r"0 cached \+ 513 new tokens exceed the context of 512"):
        port.forward(prompt(513))
    with pytest.raises(ContextTooShort, match=r"generate 16 tokens after 500.*holds 512 rows"):
        port.generate(prompt(500), Sampler(), 16)
    with pytest.raises(NotImplementedError, match=r"cannot sample"):
        port.generate(prompt(4), Sampler(temperature=0.7), 4)


PLAIN = "smollm2-draft-twin-litert-plain"


@pytest.fixture(scope="module")
def plain(verified_snapshot: Callable[[str], Path], engines: tuple[Engine, Engine]) -> tuple[Engine, Engine]:
    """The plain graph (one 512-id signature, no cache) and the reference it is held against."""
    from oracles.engines.litert.engine import LiteRtPort

    return LiteRtPort(verified_snapshot(PLAIN), load_pin(PLAIN), threads=1), engines[1]


@pytest.mark.slow
@pytest.mark.parametrize("n", [1, 300, 512])
def test_a_plain_graph_matches_the_reference(plain: tuple[Engine, Engine], n: int) -> None:
    """One cold forward of 1, 300 and all 512 positions: every row within the float32 bounds, the hidden
    state too, and ``keep`` the last rows of the same call."""
    port, ref = plain
    ids = prompt(n, seed=n)
    a, b = port.forward(ids), ref.forward(ids)
    held(a.logits, b.logits)
    assert np.abs(a.hidden - b.hidden).max() <= FLOAT32.max_abs_logit
    assert port.forward(ids, keep=1).logits.tobytes() == a.logits[-1:].tobytes()
    assert port.describe()["graph"] == "plain" and port.describe()["seq_len"] == 512


@pytest.mark.slow
def test_a_plain_graphs_padding_is_harmless(plain: tuple[Engine, Engine]) -> None:
    """The valid rows do not depend on the ids that pad the call to 512 (0 or 7), bit for bit, and
    differ where the pad is inside the rows read (the positive control: the first row past the prompt)."""
    port = plain[0]
    ids = prompt(40, seed=4)
    a = port._forward_plain(ids, None, 0, pad=0)  # type: ignore[attr-defined]
    b = port._forward_plain(ids, None, 0, pad=7)  # type: ignore[attr-defined]
    assert a.logits.tobytes() == b.logits.tobytes() and a.hidden.tobytes() == b.hidden.tobytes()
    c = port._forward_plain(ids + [0], None, 0)  # type: ignore[attr-defined]
    d = port._forward_plain(ids + [7], None, 0)  # type: ignore[attr-defined]
    assert c.logits[40].tobytes() != d.logits[40].tobytes()


@pytest.mark.slow
def test_a_plain_graph_refuses_what_needs_a_cache(plain: tuple[Engine, Engine]) -> None:
    """No cache: make_cache, a continuation and generation are Unsupported naming the graph; a prompt
    past its 512 positions is refused naming the context."""
    from oracles.engines.base import Unsupported

    port = plain[0]
    with pytest.raises(Unsupported, match=r"cannot keep a KV cache \(make_cache\): model.tflite is a plain graph: "
                                          r"signature 'serving_default' takes 512 ids and no cache"):
        port.make_cache()
    with pytest.raises(Unsupported, match=r"plain graph"):
        port.forward(prompt(3), cache=object())
    with pytest.raises(Unsupported, match=r"cannot generate: .*field 'signatures' has no 'decode' signature"):
        port.generate(prompt(3), Sampler(), 4)
    with pytest.raises(ValueError, match=r"0 cached \+ 513 new tokens exceed the context of 512"):
        port.forward(prompt(513))
