"""``oracles compare`` holds every row the port family holds, so its verdict on a unit is the family's.

The defect this guards: decode, generation and prefill units carried their last row alone, so a port
whose earlier decode steps were off (test_decode_vs_reference: NMSE over 64 steps above 1e-6) passed
``oracles compare`` on its last step (NMSE 5e-7 there). Numpy fakes, no weights.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import V, decode, replace_array, unit_key, write

from oracles.checks.port import compared_rows, port_figures, threshold_failures
from oracles.checks.tolerance import FLOAT32
from oracles.cli import main
from oracles.receipts.compare import held_rows
from oracles.receipts.units import KINDS, Unit

MAX_ABS_LOGIT, MAX_NMSE = FLOAT32.max_abs_logit, FLOAT32.max_nmse

pytestmark = [pytest.mark.dry]

#: A 64-step greedy decode (the last token a stop token), the argmax of each step.
TOKENS = [*range(5, 68), 2]
S = len(TOKENS)
#: The first step whose logits the port gets wrong (in the family's numbering).
OFF_FROM = 12


def _reference() -> np.ndarray:
    """``[S, V]`` float32 step logits, normal(0, 3)."""
    return np.random.default_rng(7).normal(0, 3, (S, V)).astype("<f4")


def _early_steps_off(ref: np.ndarray) -> np.ndarray:
    """The port's ``[S, V]``: steps 0-11 equal, steps 12-62 each logit moved by +-4e-3 (below max
    |Δlogit| 5e-3, but NMSE over the steps above 1e-6), the last step within 1e-4 of the reference's."""
    port = ref.copy()
    signs = np.random.default_rng(8).choice([-1.0, 1.0], (S, V))
    port[OFF_FROM:-1] += (4e-3 * signs[OFF_FROM:-1]).astype("<f4")
    port[-1] += np.float32(1e-4)
    return port


def _compare(tmp_path: Path, ref_rows: np.ndarray, port_rows: np.ndarray) -> tuple[int, dict[str, Any], str]:
    ref = write(tmp_path / "a", "ref", [decode("torch", ref_rows, TOKENS)])
    port = write(tmp_path / "b", "port", [decode("mlx", port_rows, TOKENS)])
    out = tmp_path / "c.json"
    code = main(["compare", str(ref), str(port), "--out", str(out)])
    return code, json.loads(out.read_text()), str(out)


def test_earlier_steps_over_nmse_fail_though_the_last_step_agrees(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """The user's case: the last step alone is within every threshold, every step together is not
    (as test_decode_vs_reference holds them): the unit fails, exit 1, naming NMSE and step 12."""
    ref, port = _reference(), _early_steps_off(_reference())
    assert threshold_failures(port_figures(ref[-1], port[-1])) == []  # what compare used to hold: passes
    family = threshold_failures(port_figures(ref[:compared_rows(TOKENS, TOKENS)], port[:compared_rows(TOKENS, TOKENS)]))
    assert [f.split(" ")[0] for f in family] == ["NMSE"]  # what test_decode_vs_reference holds: fails
    code, result, _ = _compare(tmp_path, ref, port)
    assert code == 1 and result["all_ok"] is False
    row = result["rows"][0]
    assert row["status"] == "FAIL" and row["logits_rows"] == S and row["nmse"] > MAX_NMSE
    assert row["max_abs"] < MAX_ABS_LOGIT
    first = row["failures"][0]
    assert first.startswith(f"step_logits of steps 0-{S - 1}: NMSE ") and f"> {MAX_NMSE:g}" in first
    assert f"first step over a threshold on its own: step {OFF_FROM} (NMSE " in first
    assert "its largest |Δlogit| at token " in first and " vs port " in first
    assert "FAIL: step_logits of steps 0-63: NMSE" in capsys.readouterr().out


def test_identical_steps_pass(tmp_path: Path) -> None:
    """Positive control: the same ``[S, V]`` on both sides is within every threshold, exit 0."""
    ref = _reference()
    code, result, _ = _compare(tmp_path, ref, ref.copy())
    row = result["rows"][0]
    assert code == 0 and result["all_ok"] is True
    assert row["status"] == "ok" and row["held"] == ["tokens", "logits"] and row["bit_equal"] is True
    assert row["logits_at"] == f"steps 0-{S - 1}" and row["logits_rows"] == S


def test_greedy_rows_held_through_the_first_divergent_token(tmp_path: Path) -> None:
    """After the tokens diverge the rows condition on different prefixes: held through the divergent
    token's row (as test_decode_vs_reference and the fault matrix), not after it."""
    ref = _reference()
    port = ref.copy()
    port[3:] += np.float32(1.0)  # steps 3.. off by a whole logit: not held once the tokens diverge at 2
    tokens = [*TOKENS[:2], 99, *TOKENS[3:]]
    a = write(tmp_path / "a", "ref", [decode("torch", ref, TOKENS)])
    b = write(tmp_path / "b", "port", [decode("mlx", port, tokens)])
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c.json")]) == 1
    row = json.loads((tmp_path / "c.json").read_text())["rows"][0]
    assert row["failures"] == ["greedy tokens diverge at 2"] and row["logits_rows"] == 3 == compared_rows(TOKENS, tokens)
    assert row["logits_at"] == "steps 0-2" and row["max_abs"] == 0.0


def _unit(kind: str, tokens: list[int]) -> Unit:
    return Unit(kind, "a" * 64, "", "pin", "e", "arith", (1, 2), tuple(tokens), tuple(tokens))


@pytest.mark.parametrize(("kind", "port_tokens", "rows"), [
    ("decode", [5, 6, 7, 2], 4), ("decode", [5, 9, 7, 2], 2), ("decode", [5, 6], 2),
    ("generate-greedy", [5, 6, 8, 2], 3), ("generate-sampled", [9, 2], 1), ("generate-sampled", [5, 6, 7, 2], 1),
], ids=["same", "diverged", "stopped-early", "greedy-gen", "sampled-diverged", "sampled-same"])
def test_held_rows_follow_the_kind(kind: str, port_tokens: list[int], rows: int) -> None:
    """Which rows each kind holds is its declaration (:attr:`Kind.held`): the greedy kinds the rows of a
    shared prefix, a sampled generation its first step, a prefill every position."""
    ref_tokens = [5, 6, 7, 2]
    a, b = np.zeros((4, V), "<f4"), np.zeros((len(port_tokens), V), "<f4")
    held = held_rows(_unit(kind, ref_tokens), _unit(kind, port_tokens), a, b)
    assert not isinstance(held, str) and held[0].shape == held[1].shape == (rows, V)
    prefill = Unit("prefill", "a" * 64, "", "pin", "e", "ping", (1, 2, 3), None, (4, 4, 4))
    whole = held_rows(prefill, prefill, np.zeros((3, V), "<f4"), np.zeros((3, V), "<f4"))
    assert not isinstance(whole, str) and whole[0].shape == (3, V)
    assert {k: v.held for k, v in KINDS.items() if v.held != "all"} == {
        "decode": "prefix", "generate-greedy": "prefix", "generate-sampled": "first"}
    assert {k: v.shape for k, v in KINDS.items()} == {
        "prefill": "[T, V]", "decode": "[S, V]", "generate-greedy": "[S, V]", "generate-sampled": "[S, V]",
        "chat": "[V]", "d1-row": "[1, V]", "d1-tree": "[1, V]", "clef-row": "[T, V]"}


def test_a_receipt_with_the_last_row_alone_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A unit whose array holds fewer rows than its argmax (the old last row) is a bad input, exit 2,
    naming the file, record and field; never compared on what it holds."""
    ref = _reference()
    a = write(tmp_path / "a", "ref", [decode("torch", ref, TOKENS)])
    npz = a.with_suffix(".npz")
    replace_array(npz, unit_key(npz), ref[-1])
    b = write(tmp_path / "b", "port", [decode("mlx", ref, TOKENS)])
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oracles compare: error: {a}: record t.py::test_decode_to_stop[") and err.count("\n") == 1
    assert f"field 'arrays.step_logits' has shape [{V}], not [S, V] with S = {S}, one row per entry" in err
    assert not (tmp_path / "c.json").exists()
