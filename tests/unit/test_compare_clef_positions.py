"""``oracles compare`` holds a clef row's every prompt position, as test_port_logits does.

The defect this guards: a ``clef-row`` unit carried the answer slot's row alone ``[1, V]``, while the
clef port test holds every position's logits (text and picture tokens) of the row. A port wrong before
the slot but right at it passed compare and failed the suite. Numpy fakes, no weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import V, clef, prompt_rows, replace_array, slot, unit_key, write

from oracles.checks.port import held_figures, port_figures, threshold_failures
from oracles.checks.tolerance import FLOAT32
from oracles.cli import main

MAX_ABS_LOGIT, MAX_NMSE = FLOAT32.max_abs_logit, FLOAT32.max_nmse

pytestmark = [pytest.mark.dry]

#: Prompt positions of the row (the slot is the last, T - 1).
T = 40
#: The first position whose logits the port gets wrong.
OFF_AT = 9


def _early_positions_off(ref: np.ndarray) -> np.ndarray:
    """The port's ``[T, V]``: positions 9-38 each logit moved by +-4e-3 (below max |Δlogit| 5e-3, NMSE over
    the positions above 1e-6), the answer slot (position 39) and so the read-out bit for bit the reference's."""
    port = ref.copy()
    signs = np.random.default_rng(3).choice([-1.0, 1.0], (T, V))
    port[OFF_AT:-1] += (4e-3 * signs[OFF_AT:-1]).astype("<f4")
    return port


def _compare(tmp_path: Path, ref_rows: np.ndarray, port_rows: np.ndarray) -> tuple[int, dict[str, Any]]:
    ref = write(tmp_path / "a", "ref", [clef("torch", "red", ref_rows)])
    port = write(tmp_path / "b", "port", [clef("mlx-vlm", "red", port_rows)])
    out = tmp_path / "c.json"
    code = main(["compare", str(ref), str(port), "--out", str(out)])
    return code, json.loads(out.read_text())


def test_positions_before_the_slot_over_nmse_fail(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The slot rows agree bit for bit and so do the read-outs; earlier positions are over NMSE as
    test_port_logits holds them: the unit fails, exit 1, naming NMSE and position 9."""
    ref = prompt_rows(slot(), T)
    port = _early_positions_off(ref)
    assert threshold_failures(port_figures(ref[-1:], port[-1:])) == []  # what compare used to hold: passes
    assert [f.split(" ")[0] for f in threshold_failures(held_figures("row", ref, port))] == ["NMSE"]  # the suite: fails
    code, result = _compare(tmp_path, ref, port)
    assert code == 1 and result["all_ok"] is False
    row = result["rows"][0]
    assert row["kind"] == "clef-row" and row["status"] == "FAIL" and row["logits_rows"] == T
    assert row["nmse"] > MAX_NMSE and row["max_abs"] < MAX_ABS_LOGIT
    assert row["key_equal"] is True and row["max_abs_dp"] == 0.0 and row["held"] == ["logits", "read-out"]
    first = row["failures"][0]
    assert first.startswith(f"logits of positions 0-{T - 1}: NMSE ") and f"> {MAX_NMSE:g}" in first
    assert f"first position over a threshold on its own: position {OFF_AT} (NMSE " in first
    assert len(row["failures"]) == 1
    assert f"FAIL: logits of positions 0-{T - 1}: NMSE" in capsys.readouterr().out


def test_identical_positions_pass(tmp_path: Path) -> None:
    """Positive control: the same ``[T, V]`` on both sides is within every threshold, exit 0, every
    position held beside the read-out."""
    ref = prompt_rows(slot(), T)
    code, result = _compare(tmp_path, ref, ref.copy())
    row = result["rows"][0]
    assert code == 0 and result["all_ok"] is True
    assert row["status"] == "ok" and row["held"] == ["logits", "read-out"] and row["bit_equal"] is True
    assert row["logits_at"] == f"positions 0-{T - 1}" and row["logits_rows"] == T and row["argmax_agreement"] == 1.0


def test_a_slot_only_clef_row_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A clef-row unit whose array is the slot alone (as units were before) is a bad input, exit 2:
    compare never holds a clef row on fewer positions than its port test does."""
    ref = prompt_rows(slot(), T)
    a = write(tmp_path / "a", "ref", [clef("torch", "red", ref)])
    npz = a.with_suffix(".npz")
    replace_array(npz, unit_key(npz), ref[-1:])
    b = write(tmp_path / "b", "port", [clef("mlx-vlm", "red", ref)])
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c.json")]) == 2
    assert f"field 'arrays.logits' has shape [1, {V}], not [T, V] with T = {T}" in capsys.readouterr().err
