"""Recordings without a model (the cohort family's numpy fake engine, tests/unit/cohort_fake.py): a recording
replays every call bit for bit (caches named by lineage, refusals kept as refusals), a call not recorded fails
naming it, an altered, cut or misfiled entry is named, two writers of one store agree and a different answer
is a conflict, the store's layout and the pin's digest are held, keys are RFC 8785's, and the options refuse
what cannot hold at session start."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.engines.base import Unsupported
from oracles.engines.recorded.check import check_store
from oracles.engines.recorded.keys import es_number, jcs
from oracles.engines.recorded.recorder import recording_class
from oracles.engines.recorded.replay import NotRecorded, recorded_class
from oracles.engines.recorded.store import Conflict, StoreError
from oracles.pins.pin import FileDigest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cohort_fake import DryTokenizer, FakeEngine, fake_pin  # noqa: E402

TOKENIZER = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"


class Fake(FakeEngine):
    """The fake with a tokenizer (the recording writes its calls too)."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = DryTokenizer(TOKENIZER)
        self.eos_token_ids = frozenset({2})


class Skewed(Fake):
    """The same engine (id, pin, settings) whose head answers otherwise."""

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        return super().lm_head(hidden) + np.float32(1e-3)


def script(e: Any) -> list[Any]:
    """A session's worth of calls: cold and cached forwards, a snapshot, its buffers and digests, a restore, a
    cohort of two lanes, a grown cache, the tokenizer, a refusal (taps), a ValueError (grow below the length)."""
    out: list[Any] = [e.forward([5, 17, 300]).logits, e.forward([5, 17, 300], keep=1).hidden]
    c = e.make_cache()
    e.forward([1, 2, 3], c)
    out += [e.forward([4], c).logits, e.cache_length(c), e.cache_length(None)]
    s = e.snapshot(c)
    e.forward([9], c)
    out += [e.snapshot_digest(s), e.buffer_digests(s), *e.snapshot_buffers(s).values(), e.forward([9], c).logits]
    r = e.restore(s)
    out += [e.decode_cohort([7, 8], [r, e.make_cache()]).logits, e.cache_length(r)]
    g = e.grow(c, 32)
    out += [e.cache_capacity(g), e.resident_bytes(s), e.weight_bytes(), e.lm_head(out[1])]
    out += [e.tokenizer.encode("hello world", add_special_tokens=False), e.chat_ids([{"role": "user", "content": "hi"}])]
    for call in (lambda: e.taps([1, 2]), lambda: e.grow(c, 1)):
        try:
            call()
        except (Unsupported, ValueError) as exc:
            out.append((type(exc).__name__, str(exc).replace(e.id, "ENGINE")))
    return out


def _same(a: list[Any], b: list[Any]) -> None:
    assert len(a) == len(b)
    for i, (x, y) in enumerate(zip(a, b)):
        if isinstance(x, np.ndarray):
            assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), f"item {i}"
        else:
            assert x == y, f"item {i}: {x!r} vs {y!r}"


def _record(folder: Path, cls: type[Fake] = Fake) -> list[Any]:
    made: Any = recording_class(cls, folder)
    return script(made())


def _replay(folder: Path) -> Any:
    return recorded_class(f"recorded:{folder}")(Path("."), fake_pin("fake-pin"))


@pytest.mark.dry
def test_a_recording_replays_every_call_bit_for_bit(tmp_path: Path) -> None:
    live = _record(tmp_path / "rec")
    replayed = _replay(tmp_path / "rec")
    _same(live, script(replayed))
    assert live[-2][0] == "Unsupported" and live[-1][0] == "ValueError"  # refusals replay as the engine's own
    d = replayed.describe()
    assert d["recorded_engine"] == "fake" and d["recorded"]["pin"]["name"] == "fake-pin" and d["recorded"]["entries"] > 20
    report, contexts, counts = check_store(tmp_path / "rec")
    assert report.failures == [] and len(contexts) == 1 and sum(counts.values()) == d["recorded"]["entries"]


@pytest.mark.dry
def test_a_call_not_recorded_fails_naming_it(tmp_path: Path) -> None:
    _record(tmp_path / "rec")
    e = _replay(tmp_path / "rec")
    with pytest.raises(NotRecorded, match=r"forward\(\): not recorded: .* no answer of fake on pin fake-pin .*sha256 "
                                          r"[0-9a-f]{16}"):
        e.forward([5, 17, 301])
    c = e.make_cache()
    e.forward([1, 2, 3], c)
    with pytest.raises(NotRecorded, match=r"cache_length\(\): not recorded"):  # asked after [1, 2, 3] + [4] only
        e.cache_length(c)
    with pytest.raises(NotRecorded, match=r"forward\(\): not recorded"):
        e.forward([5], c)


@pytest.mark.dry
def test_a_cache_is_named_by_the_calls_that_made_it(tmp_path: Path) -> None:
    """Two caches made by the same calls are one lineage; a trim, a snapshot, a restore each rename."""
    recording_class(Fake, tmp_path / "rec")  # no call: nothing written
    assert not (tmp_path / "rec").exists()
    made: Any = recording_class(Fake, tmp_path / "rec")
    e = made()
    a, b = e.make_cache(), e.make_cache()
    e.forward([1, 2], a), e.forward([1, 2], b)
    assert a.lineage == b.lineage and a.live is not b.live
    before = a.lineage
    e.trim(a, 0)
    s = e.snapshot(a)
    assert len({before, a.lineage, s.lineage, e.restore(s).lineage}) == 4


def _entry(folder: Path, call: str) -> Path:
    for path in sorted(folder.glob("entries/*/*.orwp")):
        data = path.read_bytes()
        if f'"call":"{call}"'.encode() in data[:4096]:
            return path
    raise AssertionError(f"no {call} entry")


@pytest.mark.dry
def test_an_altered_cut_or_misfiled_entry_is_named(tmp_path: Path) -> None:
    _record(tmp_path / "rec")
    path = _entry(tmp_path / "rec", "lm_head")
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    e = _replay(tmp_path / "rec")
    with pytest.raises(StoreError, match=re.escape(str(path)) + ".*sha256.*changed after it was written"):
        script(e)
    path.write_bytes(bytes(data[:-5]))
    with pytest.raises(StoreError, match=re.escape(str(path)) + ": not an entry"):
        script(_replay(tmp_path / "rec"))
    other = _entry(tmp_path / "rec", "weight_bytes")
    path.write_bytes(other.read_bytes())  # an entry filed under another request's key
    with pytest.raises(StoreError, match="field key is '[0-9a-f]+'; it is filed as"):
        script(_replay(tmp_path / "rec"))
    report, _, _ = check_store(tmp_path / "rec")
    assert len(report.failures) == 1 and str(path) in report.failures[0], report.failures


def test_two_writers_agree_and_a_different_answer_conflicts(tmp_path: Path) -> None:
    """Two processes recording the same calls into one store at once (xdist workers) write each entry once
    and agree; an engine answering one request otherwise is a conflict naming the call and the file. Not dry:
    it forks two processes."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(2) as pool:
        pool.map(_record, [tmp_path / "rec"] * 2)
    _same(_record(tmp_path / "rec"), script(_replay(tmp_path / "rec")))
    assert check_store(tmp_path / "rec")[0].failures == []
    with pytest.raises(Conflict, match=r"engine fake forward\(\): answered request .* unlike its recorded answer "
                                       r"\(array 0 \(f32 \[3, 2003\]\) differs\) in .*\.orwp"):
        _record(tmp_path / "rec", Skewed)


@pytest.mark.dry
def test_the_layout_and_the_pin_digest_are_held(tmp_path: Path) -> None:
    _record(tmp_path / "rec")
    marker = tmp_path / "rec" / "store.json"
    moved = dataclasses.replace(fake_pin("fake-pin"), files={"model.safetensors": FileDigest(bytes=1, sha256="0" * 64)})
    assert moved.digest != fake_pin("fake-pin").digest
    with pytest.raises(Exception, match=r"was made on pin fake-pin of digest .*: record again"):
        recorded_class(f"recorded:{tmp_path / 'rec'}")(Path("."), moved)
    with pytest.raises(Exception, match="holds no recording of pin other; it holds fake on fake-pin"):
        recorded_class(f"recorded:{tmp_path / 'rec'}")(Path("."), fake_pin("other"))
    marker.write_text(json.dumps({"format": "oracles-recording", "layout": 2}))
    cls = recorded_class(f"recorded:{tmp_path / 'rec'}")
    assert "layout 2; this suite reads 'oracles-recording' layout 1" in str(cls.unavailable_reason())
    assert "holds no store.json" in str(recorded_class(f"recorded:{tmp_path / 'none'}").unavailable_reason())


@pytest.mark.dry
def test_keys_are_rfc_8785() -> None:
    """RFC 8785 section 3.2.2.3's number samples and its section 3.2.4 example, byte for byte."""
    assert es_number(-0.0) == "0"
    numbers = {0.0: "0", 5e-324: "5e-324", 1.7976931348623157e308: "1.7976931348623157e+308",
               9007199254740992.0: "9007199254740992", 295147905179352830000.0: "295147905179352830000",
               1e21: "1e+21", 1e-7: "1e-7", 0.000001: "0.000001", 333333333.3333333: "333333333.3333333",
               1e23: "1e+23", 4.5: "4.5", 0.002: "0.002", 1e-27: "1e-27"}
    assert {x: es_number(x) for x in numbers} == numbers
    sample = {"numbers": [333333333.33333329, 1e30, 4.50, 2e-3, 0.000000000000000000000000001],
              "string": "\u20ac$\u000f\nA'B\"\\\\\"/", "literals": [None, True, False]}
    assert jcs(sample) == ('{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],'
                           '"string":"€$\\u000f\\nA\'B\\"\\\\\\\\\\"/"}').encode()
    with pytest.raises(ValueError):
        jcs(float("nan"))


@pytest.mark.dry
def test_the_docs_worked_example_is_the_codes() -> None:
    """docs/recordings.md's worked example (a page a store's writer in another language checks against)."""
    from oracles.engines.recorded.keys import lineage_of, request_key

    text = (Path(__file__).resolve().parents[2] / "docs" / "recordings.md").read_text(encoding="utf-8")
    c = "0" * 64
    made = request_key(c, "make_cache", {})
    cache = lineage_of(made, "result")
    args = {"prompt": {"ids": [1, 2, 3], "images": [], "videos": []}, "cache": cache, "keep": 0, "layers": False}
    key = request_key(c, "forward", args)
    for value in (made, cache, key, lineage_of(key, "cache"), jcs({"context": c, "call": "forward", "args": args}).decode()):
        assert value in text, value


@pytest.mark.dry
def test_record_options_refuse_what_cannot_hold(tmp_path: Path) -> None:
    from oracles.engines.recorded.options import parse_records
    from oracles.errors import OracleError

    assert parse_records(["torch=rec"], ["torch", "mlx"], tmp_path) == {"torch": (tmp_path / "rec").resolve()}
    for values, engines, message in (
            (["llamacpp=rec"], ["torch"], "this run does not run engine 'llamacpp' (it runs torch)"),
            (["torch"], ["torch"], "expected ENGINE=DIR"),
            (["recorded:x=rec"], ["recorded:x"], "is a recording already"),
            (["torch=a", "mlx=a"], ["torch", "mlx"], "one folder an engine"),
            ([f"torch={tmp_path / 'x'}"], ["torch", f"recorded:{tmp_path / 'x'}"], "is the store this run replays")):
        with pytest.raises(OracleError, match=re.escape(message)):
            parse_records(values, engines, tmp_path)


def test_a_session_refuses_a_recording_it_cannot_use(pytester: pytest.Pytester, tmp_path: Path) -> None:
    """At session start, one line naming the option: --record of an engine the session does not run, a
    recorded reference whose store is missing, or lacks a pin --pin names. Not dry: three inner pytest sessions."""
    _record(tmp_path / "rec")
    pytester.makepyfile("def test_x():\n    pass\n")
    for args, message in ((["--record", "mlx=rec", "--port", "none"], "--record 'mlx=rec': this run does not run "
                                                                      "engine 'mlx'"),
                          (["--reference", f"recorded:{tmp_path / 'none'}"], "holds no store.json"),
                          (["--reference", f"recorded:{tmp_path / 'rec'}", "--pin", "smollm2-135m-instruct",
                            "--port", "none"], "holds no recording of pin(s) smollm2-135m-instruct (it holds fake-pin)")):
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "--no-receipt", *args)
        assert result.ret == pytest.ExitCode.USAGE_ERROR and message in "\n".join(result.errlines), result.errlines
