"""``oracles bisect --port llamacpp`` on the draft twin's F32 GGUF (smollm2-draft-twin-gguf-f32, llama.cpp's
own converter) against the twin in transformers: the faithful file passes every stage; each faulty copy
written with the ``gguf`` package (oracles/faults/gguf.py: layer 1's k rows unpermuted, rope base 10,000,
RMS epsilon x0.1), pinned as a user pins a GGUF (source ``local:DIR``), is localised to the layer and the
block it was injected in. The taps themselves: the tapped decode's logits and hidden states are the plain
forward's bit for bit (the graph callback changes nothing it computes), and each layer's attention and MLP
outputs add up to its stream step. Slow: llama.cpp and transformers load the twin (~3 s a command here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from oracles.faults.gguf import GGUF_FAULTS

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("unit-llamacpp-bisect")]  # one worker builds the fault pins

TWIN, GGUF = "smollm2-draft-twin", "smollm2-draft-twin-gguf-f32"
Cli = Callable[..., tuple[int, str, str]]


def _built(name: str) -> tuple[Path, Any]:
    from oracles.pins.materialize import materialize
    from oracles.pins.pin import load_pin, snapshot_dir

    pin = load_pin(name)
    materialize(pin)
    return snapshot_dir(pin), pin


@pytest.fixture(scope="module")
def fault_pins(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, dict[str, Any]]]:
    """(the pins folder, {fault: its record}): each fault's copy of the twin's GGUF, pinned there."""
    from oracles.faults.gguf import write_fault_pin

    _built(TWIN)
    root, artifact = _built(GGUF)
    base = tmp_path_factory.mktemp("gguf-faults")
    records = {}
    for name in GGUF_FAULTS:
        pin_file = write_fault_pin(artifact, root, name, base / "pins", base / "snapshots")
        records[name] = json.loads(pin_file.read_text())["fault"]
    return base / "pins", records


def _bisect(cli: Cli, pins: Path, out: Path, port_pin: str) -> tuple[int, list[str], dict[str, Any]]:
    status, text, err = cli("--pins-dir", str(pins), "bisect", "--pin", TWIN, "--port", "llamacpp", "--port-pin", port_pin,
                            "--record", "ping", "--out", str(out))
    assert status in (0, 1), err
    (report_file,) = out.glob(f"{port_pin}-llamacpp-ping-*.json")
    return status, text.splitlines(), json.loads(report_file.read_text())


def test_the_faithful_gguf_passes_every_stage(fault_pins: tuple[Path, dict[str, Any]], oracles_cli: Cli,
                                              tmp_path: Path) -> None:
    """The control: llama.cpp on the faithful file names no stage, and every block of every layer (the
    norms included) is within its budget too, so a fault's verdict below is the fault's."""
    status, lines, report = _bisect(oracles_cli, fault_pins[0], tmp_path, GGUF)
    assert status == 0 and "verdict: every stage within its budget" in lines, lines
    assert report["divergent"] is None and not any(s["over"] for s in report["stages"])
    assert report["translations"] == []  # llama.cpp loads the file as it is
    assert len(report["stages"]) == 2 + 3  # embedding, 2 layers, final norm, head


@pytest.mark.parametrize("fault", list(GGUF_FAULTS))
def test_bisect_names_the_faults_layer_and_block(fault_pins: tuple[Path, dict[str, Any]], oracles_cli: Cli,
                                                 tmp_path: Path, fault: str) -> None:
    record = fault_pins[1][fault]
    status, lines, report = _bisect(oracles_cli, fault_pins[0], tmp_path, f"{GGUF}-{fault}")
    over = [s["name"] for s in report["stages"] if s["over"]]
    assert status == 1 and report["divergent"] == record["stage"], (f"{fault}: named {report['divergent']}, injected at "
                                                                    f"{record['stage']}; over: {over}")
    assert report["inside"]["verdict"] == record["block"], report["inside"]
    assert f"verdict: the port first diverges at {record['stage']}" in lines
    assert lines[-2].endswith(f": {record['block']}"), lines[-2]  # the inside line, before the files written


def test_taps_are_the_forward_and_add_up() -> None:
    from oracles.checks.exact import assert_bits_equal
    from oracles.engines.llamacpp.engine import LlamaCppPort

    engine = LlamaCppPort(*_built(GGUF), threads=1)
    ids = engine.chat_ids([{"role": "user", "content": "ping"}])
    t, plain = engine.taps(ids), engine.forward(ids)
    n, d = engine.num_layers, engine.hidden_size
    assert t.stream.shape == (n + 1, len(ids), d) and t.attn_norm is not None and t.mlp_norm is not None
    assert_bits_equal(t.logits, plain.logits, "tapped vs plain decode: logits [position, vocab]")
    assert_bits_equal(t.hidden, plain.hidden, "tapped vs plain decode: final-norm hidden [position, dim]")
    assert_bits_equal((t.stream[:-1] + t.attn) + t.mlp, t.stream[1:], "stream[l] + attn[l] + mlp[l] vs stream[l + 1]")
    assert np.abs(t.attn_norm).max() > 0 and np.abs(t.mlp_norm).max() > 0
    again = engine.taps(ids)  # a second capture, after the plain forward: the same arrays
    assert_bits_equal(again.stream, t.stream, "taps twice: stream [depth, position, dim]")
