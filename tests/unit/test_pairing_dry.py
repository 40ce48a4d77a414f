"""``--port-pin``: pairs parsed, refused in one line, and each pair's judgment, on the built-in pins and
on pin files written here (oracles.pins.pairing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracles.errors import PinError
from oracles.families import CONVERSION_PINS, DEFAULT_PIN
from oracles.pins.pairing import PortPair, judgment_of, parse_port_pins
from oracles.pins.pin import BUILTIN_PINS, BUILTIN_STORE, PinStore

pytestmark = [pytest.mark.dry]

Q4, Q4_DEQUANT, BF16 = "smollm2-mlx-q4", "smollm2-mlx-q4-dequant", "smollm2-mlx-bf16"


def test_a_pair_and_an_artifact_that_names_its_reference() -> None:
    assert parse_port_pins(f"{Q4_DEQUANT}={Q4}, {BF16}", BUILTIN_STORE) == (
        PortPair(Q4_DEQUANT, Q4), PortPair(DEFAULT_PIN, BF16))
    assert parse_port_pins(f"{Q4},{Q4_DEQUANT}={Q4}", BUILTIN_STORE) == (PortPair(Q4_DEQUANT, Q4),)  # once each


def test_default_none_and_blank() -> None:
    assert [p.artifact for p in parse_port_pins(None, BUILTIN_STORE, CONVERSION_PINS)] == list(CONVERSION_PINS)
    assert parse_port_pins(None, BUILTIN_STORE) == ()
    assert parse_port_pins("none", BUILTIN_STORE, CONVERSION_PINS) == ()


@pytest.mark.parametrize(("value", "message"), [
    ("no-such-pin", "--port-pin no-such-pin: unknown pin 'no-such-pin'"),
    (f"no-such-ref={Q4}", f"--port-pin no-such-ref={Q4}: unknown pin 'no-such-ref'"),
    (DEFAULT_PIN, f"--port-pin {DEFAULT_PIN}: pin {DEFAULT_PIN} names no reference"),
    (f"{Q4}={Q4}", f"--port-pin {Q4}={Q4}: the artifact is its own reference"),
    (f"{DEFAULT_PIN}={Q4}", f"--port-pin {DEFAULT_PIN}={Q4}: pin {Q4} holds affine weights"),
    (f"qwen35-vl-twin={BF16}", f"--port-pin qwen35-vl-twin={BF16}: pin {BF16}'s tokenizer files differ from pin "
                               "qwen35-vl-twin's"),
])
def test_refused_in_one_line(value: str, message: str) -> None:
    with pytest.raises(PinError) as err:
        parse_port_pins(value, BUILTIN_STORE)
    assert str(err.value).startswith(message) and "\n" not in str(err.value), str(err.value)


def test_the_built_in_pairs_are_judged_as_their_precision_says() -> None:
    load = BUILTIN_STORE.load
    assert judgment_of(load(Q4_DEQUANT), load(Q4)).kind == "exact"
    assert judgment_of(load("smollm2-mlx-q8-dequant"), load("smollm2-mlx-q8")).kind == "exact"
    band = judgment_of(load(DEFAULT_PIN), load(BF16))
    assert (band.kind, band.dtype) == ("band", "bfloat16")
    assert judgment_of(load(DEFAULT_PIN), load(DEFAULT_PIN)).kind == "exact"
    assert judgment_of(load(BF16), load(BF16)).kind == "band"  # bfloat16 compute against its own upcast weights


def _pin_file(folder: Path, name: str, **fields: object) -> None:
    """A copy of a built-in pin under another name, with ``fields`` replaced."""
    doc = {**json.loads((BUILTIN_PINS / f"{DEFAULT_PIN}.json").read_text()), "name": name, **fields}
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.json").write_text(json.dumps(doc))


def test_a_float16_cast_is_banded_in_float16_and_an_unrelated_one_refused(tmp_path: Path) -> None:
    fp16 = {"weights": "float16", "compute": "float16"}
    _pin_file(tmp_path, "cast", precision=fp16, converted_from=DEFAULT_PIN)
    _pin_file(tmp_path, "stranger", precision=fp16)
    where = PinStore.with_project(tmp_path)
    assert judgment_of(where.load(DEFAULT_PIN), where.load("cast")).dtype == "float16"
    with pytest.raises(PinError, match="holds float16 weights"):
        judgment_of(where.load(DEFAULT_PIN), where.load("stranger"))
