"""The one writer of comparable units (``attach_unit``): what it stores, and what it refuses at once,
in the test that attached it, naming the field, before anything is attached; the reader gives back
what the writer stored."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import KEYS, PIN, V, logits, probs, slot

from oracles.receipts.files import pack_arrays
from oracles.receipts.sidecar import load_npz
from oracles.receipts.table import SCHEMA_VERSION, Receipt
from oracles.receipts.units import KINDS, attach_unit
from oracles.receipts.units_reader import unit_array, unit_rows, units_of

pytestmark = [pytest.mark.dry]

NODE = "t.py::test_chat[ping-torch]"
SHA = "e" * 64
#: A two-step decode's logits ``[S, V]``, one row per argmax entry.
STEPS = np.stack([logits(3), logits(4)])


def _receipt(tmp_path: Path, data: dict[str, Any] | None = None) -> Receipt:
    return Receipt({} if data is None else data, tmp_path / "staging", NODE)


def _decode(**over: Any) -> dict[str, Any]:
    return {"request_sha256": SHA, "pin": PIN, "engine": "torch", "record": "ping", "ids": [1, 2], "tokens": [3, 4],
            "argmax": [3, 4], "arrays": {"step_logits": STEPS}} | over


def test_units_round_trip(tmp_path: Path) -> None:
    """A chat test's turns and a decode, attached; the receipt's reader gives back the same units and arrays."""
    data: dict[str, Any] = {}
    receipt = _receipt(tmp_path, data)
    turns = [logits(1), logits(2)]
    for n, warm in enumerate(turns, 1):
        attach_unit(receipt, "chat", request_sha256=SHA, pin=PIN, engine="torch", record="story", unit=f"turn{n}",
                    ids=np.array([7, n], dtype=np.int64), tokens=(np.int32(5), 2), arrays={"warm_logits": warm})
    receipt.update(max_new_tokens=16)  # the test's own figures beside its units
    assert [u["unit"] for u in data["units"]] == ["turn1", "turn2"] and data["units"][0]["ids"] == [7, 1]
    assert data["max_new_tokens"] == 16 and set(data["arrays"]) == {"units[0].warm_logits", "units[1].warm_logits"}
    assert pack_arrays(tmp_path / "staging", tmp_path / "r.npz") == 2
    doc = {"schema_version": SCHEMA_VERSION, "tests": [{"nodeid": NODE, "outcome": "passed", "data": data}]}
    units = units_of(json.loads(json.dumps(doc)), tmp_path / "r.json")
    assert [(u.key, u.label, u.test) for u in units] == [
        (("chat", SHA, "turn1", PIN), "story/turn1", NODE), (("chat", SHA, "turn2", PIN), "story/turn2", NODE)]
    npz = load_npz(tmp_path / "r.npz", tmp_path / "r.json")
    for u, warm in zip(units, turns):
        stored = unit_rows(u, npz, tmp_path / "r.json")
        assert stored is not None and stored.values.shape == warm.shape and 0 < stored.error < 1e-3
        assert np.abs(stored.values.astype(np.float64) - warm).max() <= stored.error  # within its stated error
        assert stored.stats.argmax.tolist() == [int(warm.argmax())]  # exact, from the attached row
        again = unit_array(u, npz, tmp_path / "r.json")
        assert again is not None and np.array_equal(again, stored.values)
        assert u.to_json() == data["units"][units.index(u)]


def test_readout_answer_is_derived(tmp_path: Path) -> None:
    x = slot(1, gap=-1.0)
    u = attach_unit(_receipt(tmp_path), "d1-row", request_sha256=SHA, pin=PIN, engine="mlx", record="r", unit="q1",
                    ids=[1], keys=KEYS, probs=np.asarray(probs(x)), arrays={"slot_logits": x})
    assert u.argmax_key == "false" and u.probs == tuple(probs(x)) and u.spec is KINDS["d1-row"]


BAD: dict[str, tuple[str | int, dict[str, Any], type[Exception], str]] = {  # kind: an int to refuse, too
    "unknown-kind": ("word_flip", {}, ValueError, "field 'kind' is 'word_flip', not one of the declared kinds"),
    "kind-int": (5, {}, TypeError, "field 'kind' is 5, not one of the declared kinds"),
    "sha": ("decode", {"request_sha256": "ABC"}, ValueError, "field 'request_sha256' is 'ABC', not 64 lowercase hex"),
    "pin-empty": ("decode", {"pin": ""}, TypeError, "field 'pin' is '', not a non-empty string"),
    "engine-none": ("decode", {"engine": None}, TypeError, "field 'engine' is None, not a non-empty string"),
    "ids-float": ("decode", {"ids": [1.0, 2.0]}, TypeError, "field 'ids' is list, not a sequence of ints"),
    "ids-bool": ("decode", {"ids": [True]}, TypeError, "field 'ids' is list, not a sequence of ints"),
    "ids-empty": ("decode", {"ids": []}, ValueError, "field 'ids' is empty"),
    "tokens-text": ("decode", {"tokens": "34"}, TypeError, "field 'tokens' is str, not a sequence of ints"),
    "tokens-missing": ("decode", {"tokens": None}, TypeError, "field 'tokens' is missing or not a list of ints"),
    "prefill-tokens": ("prefill", {}, TypeError, "field 'tokens' is given, but a prefill unit holds no tokens"),
    "no-array": ("decode", {"arrays": {}}, ValueError,
                 "field 'arrays.step_logits' is missing: a decode unit carries its step_logits [S, V]"),
    "array-role": ("decode", {"arrays": {"last_logits": logits()}}, ValueError,
                   "field 'arrays.last_logits' is not an array of a decode unit (it carries step_logits)"),
    "array-last-row": ("decode", {"arrays": {"step_logits": logits()}}, ValueError,
                       "field 'arrays.step_logits' has shape [64], not [S, V] with S = 2, one row per entry of the "
                       "unit's argmax"),
    "array-rows": ("decode", {"arrays": {"step_logits": np.stack([logits()] * 3)}}, ValueError,
                   "field 'arrays.step_logits' has shape [3, 64], not [S, V] with S = 2"),
    "array-int": ("decode", {"arrays": {"step_logits": np.zeros((2, V), np.int64)}}, TypeError,
                  "field 'arrays.step_logits' has dtype int64, not a float array"),
    "readout-on-decode": ("decode", {"keys": KEYS, "probs": [0.5, 0.5]}, TypeError,
                          "field 'keys' is given, but a decode unit holds no read-out"),
    "chat-no-turn": ("chat", {"argmax": None, "arrays": {"warm_logits": logits()}}, TypeError,
                     "field 'unit' is '', not a non-empty string (turn<n>)"),
}


@pytest.mark.parametrize(("kind", "over", "error", "message"), BAD.values(), ids=BAD.keys())
def test_attach_refuses_naming_the_field(tmp_path: Path, kind: Any, over: dict[str, Any], error: type[Exception],
                                         message: str) -> None:
    """A wrong unit raises in the attaching test, naming the unit and the field; nothing is attached."""
    data: dict[str, Any] = {}
    fields = _decode(**over)
    if kind == "prefill":
        fields["argmax"], fields["arrays"] = [3, 4], {"logits": STEPS}
    with pytest.raises(error) as err:
        attach_unit(_receipt(tmp_path, data), kind, **{k: v for k, v in fields.items() if v is not None or k == "engine"})
    assert str(err.value).startswith(f"attach_unit({kind!r}, record 'ping', unit ") and message in str(err.value), err.value
    assert data == {} and not (tmp_path / "staging").exists()


@pytest.mark.parametrize(("over", "message"), [
    ({"probs": [0.5]}, "field 'probs' is missing or not 2 finite numbers (one per key)"),
    ({"probs": ["0.5", "0.5"]}, "field 'probs' is list, not a sequence of numbers"),
    ({"keys": ["a", "a"]}, "field 'keys' is missing or not a non-empty list of distinct strings"),
    ({"keys": "ab"}, "field 'keys' is a string, not a sequence of strings"),
    ({"arrays": {"slot_logits": np.zeros((2, V), np.float32)}}, "field 'arrays.slot_logits' has shape [2, 64], not [1, V]"),
], ids=["probs-short", "probs-text", "keys-twice", "keys-text", "slot-rows"])
def test_attach_refuses_a_bad_readout(tmp_path: Path, over: dict[str, Any], message: str) -> None:
    x = slot(1)
    fields = {"request_sha256": SHA, "pin": PIN, "engine": "torch", "record": "r", "unit": "q1", "ids": [1],
              "keys": KEYS, "probs": probs(x), "arrays": {"slot_logits": x}} | over
    with pytest.raises((TypeError, ValueError), match=None) as err:
        attach_unit(_receipt(tmp_path), "d1-row", **fields)
    assert message in str(err.value), err.value


def test_attach_refuses_a_unit_twice_and_the_units_key(tmp_path: Path) -> None:
    """One key once a test; the ``units`` data key is the writer's alone."""
    receipt = _receipt(tmp_path)
    attach_unit(receipt, "decode", **_decode())
    attach_unit(receipt, "decode", **_decode(pin="smollm2-hybrid-twin"))  # the same request on another pin: another unit
    with pytest.raises(ValueError, match="this test already attached a decode unit of request eeeeeeeeeeee on pin"):
        attach_unit(receipt, "decode", **_decode())
    assert len(receipt["units"]) == 2
    with pytest.raises(TypeError, match="receipt data 'units': comparable units are attached with oracles.units.attach_unit"):
        receipt["units"] = []


def test_a_generation_without_steps_carries_no_array(tmp_path: Path) -> None:
    """generate-* may have no array (no step ran); decode may not."""
    u = attach_unit(_receipt(tmp_path), "generate-greedy", **_decode(tokens=[], argmax=np.array([], dtype=np.int64),
                                                                      arrays={}))
    assert u.arrays == {} and u.tokens == () and unit_array(u, None, tmp_path / "r.json") is None
