"""The wire without a far side: the call table against the Engine base class, the frame format and its
refusals, the kinds' codec, the ``oracles_wire`` lines of an ini file and the registry's ``wire:NAME`` ids."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.engines.base import Engine, Generation, Prompt, Sampler, Step
from oracles.engines.types import TOKENIZER_MEMBERS, VISION_TOKENIZER_MEMBERS
from oracles.engines.wire import codec
from oracles.engines.wire.calls import CALLS, LOCAL, table_gaps
from oracles.engines.wire.config import parse_lines, read_ini
from oracles.engines.wire.frame import Frame, FrameError, Limits, encode, parse, read_frame, read_prefix
from oracles.errors import OracleError

pytestmark = pytest.mark.dry


def test_the_table_carries_every_method_of_the_base_class() -> None:
    """Every public Engine method is carried or answered by the client, with the method's own parameter
    names in order, and every tokenizer member is carried: a capability added to the base class fails here
    until it is one entry of the table."""
    assert table_gaps(Engine, TOKENIZER_MEMBERS + VISION_TOKENIZER_MEMBERS) == []
    assert set(LOCAL).isdisjoint(CALLS)


def test_a_method_the_table_lacks_is_named() -> None:
    """Positive control: a base class with one more capability, and one whose parameter was renamed."""

    class Grown(Engine):
        def draft_tokens(self, cache: Any, n: int) -> list[int]:
            return []

        def trim(self, kv: Any, n: int) -> bool:
            return False

    gaps = table_gaps(Grown, TOKENIZER_MEMBERS)
    assert any("Engine.draft_tokens is neither carried" in g for g in gaps), gaps
    assert any("calls.CALLS['trim'] carries ['cache', 'n']; Engine.trim takes ['kv', 'n']" in g for g in gaps), gaps


def _frame(header: dict[str, Any], arrays: list[np.ndarray], limits: Limits | None = None) -> Frame:
    data = b"".join(bytes(c) for c in encode(header, arrays))
    at = [0]

    def recv(buf: memoryview, what: str) -> None:
        buf[:] = data[at[0]:at[0] + len(buf)]
        at[0] += len(buf)

    return read_frame(recv, limits or Limits())


def test_a_frame_round_trips_header_and_arrays_bit_for_bit() -> None:
    logits = np.random.default_rng(0).standard_normal((3, 7)).astype("<f4")
    ids = np.arange(6, dtype="<i8").reshape(3, 2)
    frame = _frame({"id": 4, "call": "forward", "result": {"logits": {"array": 0}}}, [logits, ids, np.zeros(0, "<f4")])
    assert frame.header == {"id": 4, "call": "forward", "result": {"logits": {"array": 0}}}
    assert [a.dtype.str for a in frame.arrays] == ["<f4", "<i8", "<f4"]
    assert frame.arrays[0].tobytes() == logits.tobytes() and np.array_equal(frame.arrays[1], ids)
    assert frame.arrays[0].flags.writeable  # views of a bytearray: a family may write into what an engine returned


def test_the_prefix_is_sixteen_little_endian_bytes() -> None:
    chunks = encode({"id": 1}, [np.ones(2, "<f4")])
    head = bytes(chunks[0])
    magic, hlen, blen = struct.unpack("<4sIQ", head[:16])
    assert (magic, blen) == (b"ORWP", 8) and json.loads(head[16:16 + hlen])["arrays"] == [
        {"dtype": "f32", "shape": [2], "nbytes": 8}]


@pytest.mark.parametrize(("header", "arrays", "body", "field"), [
    ({"arrays": [{"dtype": "f64", "shape": [2]}]}, [], bytearray(16), "arrays[0].dtype"),
    ({"arrays": [{"dtype": "f32", "shape": [2, -1]}]}, [], bytearray(8), "arrays[0].shape"),
    ({"arrays": [{"dtype": "f32", "shape": [2], "nbytes": 12}]}, [], bytearray(8), "arrays[0].nbytes"),
    ({"arrays": [{"dtype": "f32", "shape": [4]}]}, [], bytearray(8), "arrays[0]: its 16 bytes pass the body's end"),
    ({"arrays": [{"dtype": "f32", "shape": [1]}]}, [], bytearray(8), "the descriptors hold 4 bytes, the body 8"),
])
def test_a_descriptor_that_breaks_the_format_names_its_field(header: dict[str, Any], arrays: list[Any], body: bytearray,
                                                             field: str) -> None:
    with pytest.raises(FrameError, match=re.escape(field)):
        parse(json.dumps(header).encode(), body, Limits())


def test_prefix_refusals_name_the_magic_and_the_limits() -> None:
    with pytest.raises(FrameError, match="not a frame"):
        read_prefix(b"loading model...", Limits())
    with pytest.raises(FrameError, match="body length 9000 bytes passes the limit of 8000"):
        read_prefix(struct.pack("<4sIQ", b"ORWP", 2, 9000), Limits(body=8000))
    with pytest.raises(FrameError, match="header is not UTF-8 JSON"):
        parse(b"{not json", bytearray(), Limits())
    with pytest.raises(FrameError, match="not JSON"):
        encode({"nan": float("nan")})
    with pytest.raises(FrameError, match="float64 is not one the wire carries"):
        encode({}, [np.zeros(2)])


def _roundtrip(kind: str, value: Any) -> Any:
    out = codec.Arrays()
    handles: dict[int, Any] = {}

    def number(obj: Any) -> int:
        handles[len(handles) + 1] = obj
        return len(handles)

    encoded = codec.encode_value(kind, value, out, number)
    frame = _frame({"v": encoded}, out.items)
    return codec.decode_value(kind, frame.header["v"], frame.arrays, "result", lambda i, field: handles[i])


def test_the_kinds_round_trip() -> None:
    rng = np.random.default_rng(1)
    step = Step(logits=rng.standard_normal((2, 5)).astype("<f4"), hidden=rng.standard_normal((2, 3)).astype("<f4"),
                positions=np.arange(6, dtype=np.int64).reshape(3, 2))
    got = _roundtrip("step", step)
    assert got.logits.tobytes() == step.logits.tobytes() and got.layers is None
    assert got.positions.tolist() == [[0, 1], [2, 3], [4, 5]]
    gen = Generation([3, 4], "ab", "stop", step.logits, 0.5, 1.5, {"sampler": "greedy", "n": np.int64(2)})
    back = _roundtrip("generation", gen)
    assert (back.tokens, back.text, back.finish_reason, back.extra) == ([3, 4], "ab", "stop", {"sampler": "greedy", "n": 2})
    assert list(_roundtrip("buffers", {"layers.0.keys": step.hidden, "layers.0.values": step.hidden})) == [
        "layers.0.keys", "layers.0.values"]
    assert _roundtrip("sampler", Sampler(0.6, 0.95, 20, 7)) == Sampler(0.6, 0.95, 20, 7)
    picture = np.full((4, 4, 3), 7, np.uint8)
    prompt = _roundtrip("prompt", Prompt((1, 2), (picture,)))
    assert prompt.ids == (1, 2) and prompt.images[0].tobytes() == picture.tobytes()
    assert _roundtrip("prompt", [5, 6]) == [5, 6]  # ids alone, as the families pass them
    from oracles.checks.tolerance import FLOAT32

    assert _roundtrip("tolerance", FLOAT32) == FLOAT32
    handle = object()
    assert _roundtrip("handle", handle) is handle and _roundtrip("handle?", None) is None


def test_the_systems_kinds_round_trip() -> None:
    """MTP drafting's and System One's kinds: pairs, an MtpGeneration, pictures, named arrays of any dtype, lists
    of float32 arrays and of id groups, bit for bit and dtype for dtype."""
    from oracles.engines.base import MtpGeneration

    rng = np.random.default_rng(2)
    logits, state = rng.standard_normal((2, 5)).astype("<f4"), rng.standard_normal((2, 3)).astype("<f4")
    got = _roundtrip("mtp_step", (logits, state))
    assert got[0].tobytes() == logits.tobytes() and got[1].tobytes() == state.tobytes()
    gen = MtpGeneration([1, 2], [1, 3], 4, None, 2, {"rounds": [1, np.int64(0)]})
    assert _roundtrip("mtp_generation", gen) == MtpGeneration([1, 2], [1, 3], 4, None, 2, {"rounds": [1, 0]})
    vision = {"pixel_values": logits, "pixel_attention_mask": np.ones((1, 4), np.int32),
              "spatial_shapes": np.array([[2, 2]], np.int64)}
    trunk, branches, back = _roundtrip("decision_inputs", ([5, 6], [[7], [8, 9]], vision))
    assert (trunk, branches, list(back)) == ([5, 6], [[7], [8, 9]], list(vision))
    assert all(back[k].dtype == v.dtype and back[k].tobytes() == v.tobytes() for k, v in vision.items())
    assert _roundtrip("named?", None) is None and _roundtrip("named", {}) == {}
    picture = np.arange(12, dtype=np.uint8).reshape(2, 2, 3)
    assert _roundtrip("pictures", [picture])[0].tobytes() == picture.tobytes()
    assert [a.tobytes() for a in _roundtrip("f32s", [logits[0], logits[1]])] == [logits[0].tobytes(), logits[1].tobytes()]
    assert _roundtrip("id_groups", [[1], [2, 3]]) == [[1], [2, 3]]
    assert _roundtrip("json", {"answers": {"q": {"p": np.float32(0.5)}}}) == {"answers": {"q": {"p": 0.5}}}


@pytest.mark.parametrize(("kind", "value", "arrays", "field"), [
    ("pictures", [{"array": 0}], [np.zeros((2, 2, 4), "u1")], "result[0]: is u8 [2, 2, 4]; expected u8 [H, W, 3]"),
    ("pictures", [{"array": 0}], [np.zeros((2, 2, 3), "<f4")], "result[0]: is f32 [2, 2, 3]; expected u8"),
    ("mtp_step", {"logits": {"array": 0}}, [np.zeros((1, 2), "<f4")], "result.state: missing"),
    ("mtp_generation", {"tokens": [1], "greedy": [1], "forwards": "2"}, [], "result.forwards"),
    ("decision_inputs", {"trunk": [1], "branches": [[2]], "vision": [["x", 3]]}, [], "result.vision[0] (x)"),
    ("f32s", [{"array": 0}], [np.zeros(2, "<i4")], "result[0]: is i32 [2]"),
    ("id_groups", [[1], 2], [], "result[1]"),
])
def test_a_systems_value_that_breaks_its_kind_names_its_field(kind: str, value: Any, arrays: list[np.ndarray],
                                                              field: str) -> None:
    with pytest.raises(codec.FieldError, match=re.escape(field)):
        codec.decode_value(kind, value, arrays, "result", lambda i, f: i)


@pytest.mark.parametrize(("kind", "value", "arrays", "field"), [
    ("step", {"logits": {"array": 0}, "hidden": {"array": 0}}, [np.zeros((2, 3), "<i4")], "result.logits: is i32 [2, 3]"),
    ("step", {"logits": {"array": 0}, "hidden": {"array": 1}}, [np.zeros(3, "<f4")],
     "result.logits: is f32 [3]; expected f32 of rank 2"),
    ("step", {"logits": {"array": 5}}, [], "result.hidden: missing"),
    ("step", {"logits": 3, "hidden": 3}, [], "result.logits: got int 3"),
    ("generation", {"tokens": [1], "text": "", "finish_reason": "eos", "step_logits": {"array": 0}},
     [np.zeros((1, 2), "<f4")], "result.finish_reason"),
    ("ids", [1, "2"], [], "result[1]"),
    ("int", True, [], "expected an integer"),
    ("buffers", [["a"]], [], "result[0]"),
])
def test_a_value_that_breaks_its_kind_names_its_field(kind: str, value: Any, arrays: list[np.ndarray], field: str) -> None:
    with pytest.raises(codec.FieldError, match=re.escape(field)):
        codec.decode_value(kind, value, arrays, "result", lambda i, f: i)


def test_ini_lines_make_targets(tmp_path: Path) -> None:
    lines = ["# a comment", "c = harness/build/x --flag 'a b'", "c.pins = p1, p2", "c.families = port, mtplx",
             "c.same-as = llamacpp", "c.timeout = 30", "box = tcp://10.0.0.7:7070  # the GPU box"]
    found = parse_lines(lines, tmp_path, "p.ini")
    c, box = found["wire:c"], found["wire:box"]
    assert c.argv() == [str(tmp_path / "harness/build/x"), "--flag", "a b"] and c.pins == ("p1", "p2")
    assert (c.families, c.same_as, c.timeout, c.hello_timeout) == (("port", "mtplx"), "llamacpp", 30.0, 30.0)
    assert box.tcp == ("10.0.0.7", 7070) and c.tcp is None
    assert "not an executable file here" in str(c.unavailable_reason())


@pytest.mark.parametrize(("lines", "message"), [
    (["c harness"], "expected NAME = COMMAND"),
    (["c = x", "c.pin = p"], "unknown setting 'pin'"),
    (["c.pins = p"], "settings without a line c = COMMAND"),
    (["c = x", "c.timeout = soon"], "c.timeout: 'soon' is not a number"),
    (["c = tcp://host"], "is not tcp://HOST:PORT"),
    (["c/d = x"], "NAME of letters"),
])
def test_a_bad_ini_line_names_file_and_line(tmp_path: Path, lines: list[str], message: str) -> None:
    with pytest.raises(OracleError, match=message) as err:
        parse_lines(lines, tmp_path, "p.ini")
    assert str(err.value).startswith("p.ini: oracles_wire")


def test_the_registry_resolves_wire_ids_from_the_ini(tmp_path: Path) -> None:
    from oracles.engines import Registry
    from oracles.pins.pin import load_pin

    ini = tmp_path / "pytest.ini"
    ini.write_text("[pytest]\noracles_wire =\n    mine = ./absent-harness\n    mine.pins = smollm2-gguf-f32\n"
                   "    mine.families = port\n")
    assert set(read_ini(ini)) == {"wire:mine"}
    registry = Registry(ini=ini)
    assert "wire:mine" in registry.table
    cls = registry.engine_class("wire:mine")
    assert cls.id == "wire:mine" and getattr(cls, "families", None) == ("port",)
    assert "absent-harness is not an executable file here" in str(registry.unavailable_reason("wire:mine"))
    assert cls.unsupported_pin(load_pin("smollm2-gguf-f32")) is None
    assert "runs wire:mine on smollm2-gguf-f32 only, not smollm2-135m-instruct" in str(
        cls.unsupported_pin(load_pin("smollm2-135m-instruct")))
    assert "wire:mine" not in registry.resolve_ports("auto", "torch")  # a far side that cannot run here


def test_the_spec_page_names_every_call() -> None:
    """docs/wire.md, the page a harness author implements from, lists every call of the table."""
    text = (Path(__file__).resolve().parents[2] / "docs" / "wire.md").read_text(encoding="utf-8")
    assert not [c for c in CALLS if f"`{c}`" not in text], [c for c in CALLS if f"`{c}`" not in text]


def test_a_line_written_before_the_answer_is_in_the_quoted_tail(monkeypatch: pytest.MonkeyPatch) -> None:
    """The far side writes a stderr line, then its answer: once the answer is read, the quoted tail has the
    line even when the stderr thread never ran (CI's loaded scheduler once left it out)."""
    import select

    from oracles.engines.wire.transport import Subprocess

    monkeypatch.setattr(Subprocess, "_read_stderr", lambda self: None)
    far = Subprocess(["sh", "-c", "echo 'far: injecting fault' >&2; echo answer; sleep 5"])
    try:
        poller = select.poll()
        poller.register(far.read_fd, select.POLLIN)
        assert poller.poll(10_000), "the far side never answered"
        assert far.stderr_tail() == ["far: injecting fault"]
    finally:
        far.kill()
        far.close()
