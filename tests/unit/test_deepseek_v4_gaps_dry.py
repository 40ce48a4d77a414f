"""The DeepSeek-V4 port's measured mlx-vlm gaps (:mod:`oracles.engines.mlx.deepseek_v4_gaps`) and what
neither DeepSeek-V4 engine can give (a per-layer residual row), without building an engine: the table
names real suite tests on the twin only, and the refusals name the capability and the reason. No torch,
transformers or mlx."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from oracles.engines.mlx import deepseek_v4_gaps as gaps
from oracles.engines.mlx.deepseek_v4 import MlxDeepseekV4Port
from oracles.engines.torch.cohort_dsv4 import NO_RESIDUAL_ROW, stream_refusal
from oracles.engines.types import Unsupported

pytestmark = pytest.mark.dry

SUITE = Path(__file__).resolve().parents[2] / "oracles" / "suite"


def _suite_tests() -> set[str]:
    names: set[str] = set()
    for path in SUITE.glob("test_*.py"):
        tree = ast.parse(path.read_text())
        names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")}
    return names


def test_every_entry_names_a_suite_test_on_the_twin_and_the_port() -> None:
    tests = _suite_tests()
    for name in gaps.KNOWN_GAPS:
        m = re.fullmatch(r"(test_\w+)\[(.+)\]", name)
        assert m and m.group(1) in tests, f"{name}: no such suite test"
        params = m.group(2)
        assert gaps.PIN in params and gaps.PORT in params, f"{name}: not a test of {gaps.PORT} on {gaps.PIN}"


def test_every_note_quotes_a_figure_and_a_cause() -> None:
    for name, note in gaps.KNOWN_GAPS.items():
        assert re.search(r"\d\.\de-\d|\b0\.\d+", note), f"{name}: no measured figure in {note!r}"
        assert note.startswith(gaps.CAUSES), f"{name}: the cause is not named"


def _gap(pin: str, oracle: str, any_pin: bool = False, engine: str = "mlx-vlm-dsv4") -> str | None:
    # known_gap reads only the engine's pin and id: no model is loaded for it
    return MlxDeepseekV4Port.known_gap(SimpleNamespace(pin=pin, id=engine), oracle, any_pin)  # type: ignore[arg-type]


def test_the_port_expects_a_gap_on_the_twin_only() -> None:
    name = f"test_decode_vs_reference[{gaps.PIN}-{gaps.PORT}-arith]"
    asked = name.replace(gaps.PORT, "mlx-vlm-dsv4")
    assert _gap(gaps.PIN, asked) == gaps.KNOWN_GAPS[name]
    assert _gap("my-deepseek-v4", asked) is None
    assert _gap("my-deepseek-v4", asked, any_pin=True) == gaps.KNOWN_GAPS[name]


def test_an_adapter_built_on_it_expects_its_gaps_under_its_own_id() -> None:
    """A subclass registered under another id is mlx-vlm's code: the same notes, asked with its own id."""
    name = f"test_dsv4_port_decode_within_float32[{gaps.PIN}-{gaps.PORT}]"
    assert _gap(gaps.PIN, name.replace(gaps.PORT, "my-dsv4"), engine="my-dsv4") == gaps.DECODE_OVERLAP_GAP
    assert _gap(gaps.PIN, name.replace(gaps.PORT, "my-dsv4")) is None  # another engine's test: not this one's


def test_the_decode_note_quotes_where_the_gap_starts() -> None:
    """The suite's explanation test reads the first failing position from the note ("from position N ")."""
    assert "from position 151 " in gaps.DECODE_OVERLAP_GAP


def test_another_record_is_not_expected_to_fail() -> None:
    """The positive control: a name the table does not hold (another record) gets no note."""
    assert _gap(gaps.PIN, f"test_decode_vs_reference[{gaps.PIN}-mlx-vlm-dsv4-ping]") is None
    assert _gap(gaps.PIN, f"test_prefill_vs_reference[{gaps.PIN}-mlx-vlm-dsv4-readme]") is None


def test_a_deepseek_v4_decoder_has_no_residual_row() -> None:
    assert stream_refusal(SimpleNamespace(hc_head=object(), layers=[])) == NO_RESIDUAL_ROW
    assert stream_refusal(SimpleNamespace(norm=object(), layers=[])) is None  # a plain decoder: one [T, D] stream


def test_the_port_refuses_layers_and_taps_naming_why() -> None:
    port = object.__new__(MlxDeepseekV4Port)  # the refusals come before any mlx call
    with pytest.raises(Unsupported) as rows:
        port.forward([1, 2, 3], layers=True)
    with pytest.raises(Unsupported) as taps:
        port.taps([1, 2, 3])
    assert (rows.value.capability, rows.value.why) == ("return per-layer rows", NO_RESIDUAL_ROW)
    assert (taps.value.capability, taps.value.why) == ("tap inside its layers", NO_RESIDUAL_ROW)
    assert "hc_mult" in NO_RESIDUAL_ROW and "mlx-vlm-dsv4" in str(rows.value)
