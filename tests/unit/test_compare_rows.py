"""A unit's logits rows are numbered as its family's own test numbers them: a decode's rows are its steps,
a prefill's its positions, a chat turn's one row its turn, a read-out's its slot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import PIN, SHA, decode, logits, readout, slot, write

from oracles.checks.tolerance import FLOAT32
from oracles.cli import main
from oracles.receipts.units import KINDS, Unit

MAX_ABS_LOGIT = FLOAT32.max_abs_logit

pytestmark = [pytest.mark.dry]


def _spiked(x: np.ndarray, token: int) -> np.ndarray:
    out = x.copy()
    out[..., token] += np.float32(10 * MAX_ABS_LOGIT)
    return out


def _row(tmp_path: Path, ref_unit: dict[str, Any], port_unit: dict[str, Any]) -> dict[str, Any]:
    ref, port = write(tmp_path / "a", "ref", [ref_unit]), write(tmp_path / "b", "port", [port_unit])
    out = tmp_path / "c.json"
    assert main(["compare", str(ref), str(port), "--out", str(out)]) == 1
    row: dict[str, Any] = json.loads(out.read_text())["rows"][0]
    return row


def test_decode_mismatch_names_the_last_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Four steps decoded, the last one off: steps 0-3 are held and step 3 is named, as
    test_decode_vs_reference numbers it, with both values at its worst token."""
    base, tokens = logits(), [5, 6, 7, 2]
    row = _row(tmp_path, decode("torch", base, tokens), decode("mlx", _spiked(base, 9), tokens))
    assert row["logits_at"] == "steps 0-3" and row["logits_rows"] == 4 and row["max_abs_at"] == [3, 9]
    first = row["failures"][0]
    assert first.startswith("step_logits of steps 0-3: max |Δlogit|") and "at (row, token) [3, 9];" in first
    assert "first step over a threshold on its own: step 3 (max |Δlogit|" in first
    shown = first.split("its largest |Δlogit| at token 9: reference ")[1].split(" vs port ")
    stored = row.get("stored_error", 0.0)  # the values shown are the stored rows', within their error
    assert abs(float(shown[0]) - base[9]) <= 2 * stored + 1e-6 and abs(float(shown[1]) - _spiked(base, 9)[9]) <= 2 * stored + 1e-6
    assert first.count("undecided") == 0  # the spike is 10x the threshold: every threshold is decided
    assert not any("row 0" in f for f in row["failures"])
    assert "[3, 9]" in capsys.readouterr().out


def test_prefill_mismatch_names_the_position(tmp_path: Path) -> None:
    """Every position is held; the one off is named as test_prefill_vs_reference numbers it."""
    base = np.stack([logits(i) for i in range(5)])

    def prefill(engine: str, x: np.ndarray) -> dict[str, Any]:
        return {"test": f"t.py::test_prefill_comparable[{PIN}-ping-{engine}]", "kind": "prefill", "request_sha256": SHA,
                "pin": PIN, "engine": engine, "record": "ping", "ids": [1, 2, 3, 4, 5], "argmax": [1, 1, 1, 1, 9],
                "arrays": {"logits": x}}

    off = base.copy()
    off[2] = _spiked(base[2], 11)
    row = _row(tmp_path, prefill("torch", base), prefill("mlx", off))
    assert row["logits_at"] == "positions 0-4" and row["max_abs_at"] == [2, 11]
    assert "first position over a threshold on its own: position 2" in row["failures"][0]


def test_chat_mismatch_names_the_turn(tmp_path: Path) -> None:
    base = logits()

    def turn(engine: str, x: np.ndarray) -> dict[str, Any]:
        return {"test": f"t.py::test_turns_finish_with_stop[brief-{engine}]", "kind": "chat", "request_sha256": SHA,
                "pin": PIN, "engine": engine, "record": "brief", "unit": "turn2", "ids": [1, 2], "tokens": [5, 2],
                "arrays": {"warm_logits": x}}

    row = _row(tmp_path, turn("torch", base), turn("mlx", _spiked(base, 7)))
    assert row["logits_at"] == "turn 1" and row["max_abs_at"] == [1, 7]  # test_chat_vs_reference stacks turns from 0


def test_readout_row_is_its_slot(tmp_path: Path) -> None:
    """A read-out's one row is its slot: row 0, and no prefix (nothing is renumbered)."""
    x = slot(1)
    row = _row(tmp_path, readout("torch", "q1", x), readout("mlx", "q1", _spiked(x, 20)))
    assert row["logits_at"] == "slot 0" and row["max_abs_at"] == [0, 20]
    assert row["failures"][0].startswith("max |Δlogit|")


def test_array_rows_need_nothing_stored() -> None:
    """Every kind's row comes from what a unit already held, so receipts written before read the same; a
    generation without steps has no array and no row index to take."""
    assert {k.row for k in KINDS.values()} == {"position", "step", "turn", "slot"}
    gen = Unit("generate-greedy", SHA, "", PIN, "e", "arith", (1, 2), (5, 6, 2), (5, 6, 2))
    assert gen.array_rows == (0, 1, 2) and "row" not in gen.to_json()
    assert Unit("generate-greedy", SHA, "", PIN, "e", "arith", (1,), (), ()).array_rows == ()
