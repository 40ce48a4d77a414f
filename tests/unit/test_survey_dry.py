"""The fp16 absmax survey runs on the run's text pins, and ``oracles survey`` writes one survey per pin.

No weights: the pin selection is the plugin's (collection only), the command reads a receipt of known
figures.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from oracles.cli import main as cli_main
from oracles.families import BY_NAME, DEFAULT_PIN, family_of
from oracles.families.port_scope import PortScope
from oracles.plugin.settings import Settings

TEXT_PIN, VISION_PIN = "smollm2-hybrid-twin", "qwen35-vl-twin"


def _settings(pins: list[str]) -> Settings:
    return Settings(enabled=True, reference="torch", ports=(), pins=tuple(pins), port_scope=PortScope.parse("sample"))


@pytest.mark.dry
def test_survey_test_belongs_to_the_text_survey_family() -> None:
    """The survey test carries clef (so ``-m clef`` runs it) and survey; it is attributed to survey,
    whose pins are text pins. Control: clef alone is the vision family."""
    assert family_of({"clef", "survey", "slow"}) is BY_NAME["survey"]
    assert family_of({"clef"}) is BY_NAME["clef"] and BY_NAME["clef"].modality == "vision"


@pytest.mark.dry
def test_survey_pins_are_the_pin_selection_or_smollm2() -> None:
    """``--pin`` selects the surveyed text pins (a vision pin is left out, saying why); without it,
    SmolLM2 alone (what ``make test`` has always surveyed)."""
    survey = BY_NAME["survey"]
    assert _settings([]).pins_for(survey) == [DEFAULT_PIN]
    chosen = _settings([TEXT_PIN, VISION_PIN])
    assert chosen.pins_for(survey) == [TEXT_PIN]
    [left] = chosen.left_out_json()
    assert left["pin"] == VISION_PIN and left["engine"] is None, left
    assert "family survey needs a text model" in str(left["reason"]), left


def test_survey_test_ids_carry_the_selected_pin(pytester: pytest.Pytester) -> None:
    """Collected through the plugin: one ``test_text_absmax`` per (pin, run), the vision pin left out. Not dry:
    an inner pytest session."""
    result = pytester.runpytest("--pyargs", "oracles.suite.test_clef_survey", "--collect-only", "-q", "-o",
                                "oracles=true", "--no-receipt", "-p", "no:cacheprovider", "--pin",
                                f"{TEXT_PIN},{VISION_PIN}")
    ids = [line for line in result.outlines if "test_text_absmax[" in line]
    assert len(ids) == 5 and all(f"test_text_absmax[{TEXT_PIN}-" in i for i in ids), result.outlines
    assert any(f"test_text_absmax[{TEXT_PIN}-d1:fact_water/boils]" in i for i in ids), ids
    assert any(f"left out pin {VISION_PIN}" in line for line in result.outlines), result.outlines


def record(pin: str, run: str, top: float) -> dict[str, Any]:
    stats = {"pos0": top, "rest": 1.0, "overall": top, "argmax_pos": 0, "argmax_ch": 3}
    return {"nodeid": f"x::test_text_absmax[{pin}-{run}]", "outcome": "passed",
            "data": {"kind": "absmax", "pin": pin, "engine": "torch", "run": run, "tokens": 4, "layers": [stats],
                     "layer_input": stats, "final_norm": stats, "mlp_down_in": None}}


@pytest.mark.dry
def test_survey_writes_one_survey_per_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Two pins in one receipt: each gets its own JSON named by it, holding only its runs (without matplotlib:
    drawing the PNGs costs a second, test_survey_plot.py draws them)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tests": [record("mymodel", "a", 2.0), record(DEFAULT_PIN, "a", 25000.0),
                                          record("mymodel", "b", 8.0)]}))
    assert cli_main(["survey", str(path), "--out", str(tmp_path / "out")]) == 0
    mine = json.loads((tmp_path / "out" / "r.mymodel.absmax.json").read_text())
    assert mine["pin"] == "mymodel" and list(mine["groups"]) == ["mymodel/torch"]
    assert mine["groups"]["mymodel/torch"]["residual_max"]["max"] == 8.0
    assert mine["groups"]["mymodel/torch"]["residual_max"]["headroom_ratio"] == pytest.approx(65504.0 / 8.0)
    smol = json.loads((tmp_path / "out" / f"r.{DEFAULT_PIN}.absmax.json").read_text())
    assert smol["groups"][f"{DEFAULT_PIN}/torch"]["runs"] == 1
    assert not list((tmp_path / "out").glob("*.png"))
    out = capsys.readouterr().out
    assert "mymodel/torch: 2 runs; residual max 8" in out and f"{DEFAULT_PIN}/torch: 1 runs" in out, out


@pytest.mark.dry
def test_survey_without_matplotlib_writes_the_json_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """No matplotlib (an install without the plots, torch or dev extra): each pin's JSON and table, no PNG,
    one line naming the extra that brings it, exit 0 (before: ModuleNotFoundError, exit 1, nothing written)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tests": [record("mymodel", "a", 2.0), record(DEFAULT_PIN, "a", 25000.0)]}))
    assert cli_main(["survey", str(path)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["r.json", f"r.{DEFAULT_PIN}.absmax.json",
                                                                 "r.mymodel.absmax.json"])
    out, err = capsys.readouterr()
    assert err == "PNG not written: matplotlib is not installed (pip install 'pytest-oracles[plots]')\n"
    assert "mymodel/torch: 1 runs" in out and "plot:" not in out, out


@pytest.mark.dry
def test_survey_refuses_a_pin_that_is_not_a_file_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The pin names output files: a receipt's ``../x`` is refused naming record and field; nothing written."""
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tests": [record("../x", "a", 2.0)]}))
    assert cli_main(["survey", str(path)]) == 2
    err = capsys.readouterr().err
    assert "x::test_text_absmax[../x-a]" in err and "field 'pin'" in err, err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["r.json"]


@pytest.mark.dry
def test_survey_with_no_absmax_record_names_the_family_to_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tests": [{"nodeid": "x::t", "outcome": "passed", "data": {}}]}))
    assert cli_main(["survey", str(path)]) == 2
    assert "-m survey --runslow" in capsys.readouterr().err
