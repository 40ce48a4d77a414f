"""``oracles survey``'s PNGs (matplotlib, Agg): one per pin, named by it. Not dry: drawing them takes about a
second (the JSON and the table are test_survey_dry.py's)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_survey_dry import record

from oracles.cli import main as cli_main
from oracles.families import DEFAULT_PIN


def test_survey_draws_one_png_per_pin(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tests": [record("mymodel", "a", 2.0), record(DEFAULT_PIN, "a", 25000.0),
                                          record("mymodel", "b", 8.0)]}))
    assert cli_main(["survey", str(path), "--out", str(tmp_path / "out")]) == 0
    for pin in ("mymodel", DEFAULT_PIN):
        assert (tmp_path / "out" / f"r.{pin}.absmax.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", pin
    out = capsys.readouterr().out
    assert "mymodel/torch: 2 runs; residual max 8" in out and "plot:" in out, out
