"""The fp16 absmax survey: the same residual-stream taps on the real SmolLM2 pin (text only), and the
``oracles survey`` command on a receipt of known figures.

The SmolLM2 runs are the reference's ``forward(layers=True)`` (embedding output, then each of the 30
decoder layers' outputs) on the clef text rows through SmolLM2's chat template and on d1 rows of two
lengths (the 64 and 512-token buckets); their per-layer absmax records feed ``oracles survey``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.checks.absmax import FP16_MAX, headroom, row_stats
from oracles.cli import main as cli_main
from oracles.engines.base import Engine
from oracles.families import DEFAULT_PIN, clef
from oracles.families.clef_run import absmax_record
from oracles.families.d1_rows import rows_view
from oracles.fixtures import Engines
from oracles.receipts import Receipt

pytestmark = pytest.mark.clef

TEXT_ROWS = [(r, q) for r in clef.load_records() if not r.media for q in r.request.questions]
_D1 = rows_view(DEFAULT_PIN)  # SmolLM2's d1 token ids (oracles/builtin/records/d1/tokens)
#: The first d1 row of each of these buckets (state lengths in tokens): a short and a long context (the
#: 1,024 bucket took 3 to 7 s more here and moved no maximum: the largest is at position 0).
D1_BUCKETS = (64, 512)
D1_ROWS = [next(r for (rid, _), r in _D1.rows.items() if _D1.meta[rid]["bucket"] == b) for b in D1_BUCKETS]
SURVEY_RUNS = [*(f"clef:{r.id}/{q.qid}" for r, q in TEXT_ROWS), *(f"d1:{r['id']}/{r['qid']}" for r in D1_ROWS)]


def _ids(engine: Engine, run: str) -> list[int]:
    family, _, label = run.partition(":")
    if family == "d1":
        return next(list(r["ids"]) for r in D1_ROWS if f"{r['id']}/{r['qid']}" == label)
    record, question = next((r, q) for r, q in TEXT_ROWS if f"{r.id}/{q.qid}" == label)
    return engine.chat_ids(clef.row_messages(record, question, ""))


@pytest.mark.slow
@pytest.mark.parametrize("run", SURVEY_RUNS, scope="module")
def test_smollm2_absmax(engines: Engines, pytestconfig: pytest.Config, run: str, receipt: Receipt) -> None:
    """Per layer absmax of SmolLM2-135M's residual stream (the real pin), for ``oracles survey``."""
    engine = engines(pytestconfig.getoption("reference"), DEFAULT_PIN)
    ids = _ids(engine, run)
    step = engine.forward(ids, layers=True)
    assert step.layers is not None and step.layers.shape == (engine.num_layers + 1, len(ids), engine.hidden_size)
    figures = absmax_record(step, run)
    receipt.update(kind="absmax", pin=DEFAULT_PIN, engine=engine.id, **figures)
    top = max(figures["layers"], key=lambda s: s["overall"])
    assert top["overall"] < FP16_MAX, f"{run}: residual |x| {top['overall']} passes float16's {FP16_MAX}"


# -- the command on known figures (no weights; matplotlib) -----------------------------------------
def _record(pin: str, engine: str, run: str, overall: list[float], down: list[float] | None) -> dict[str, Any]:
    layers = [{"pos0": v, "rest": v / 2, "overall": v, "argmax_pos": 0, "argmax_ch": i} for i, v in enumerate(overall)]
    stats = {"pos0": 1.0, "rest": 0.5, "overall": 1.0, "argmax_pos": 0, "argmax_ch": 0}
    return {"nodeid": f"x::test_absmax[{run}]", "outcome": "passed",
            "data": {"kind": "absmax", "pin": pin, "engine": engine, "run": run, "tokens": 4, "layers": layers,
                     "layer_input": stats, "final_norm": stats, "mlp_down_in": down}}


def test_survey_command_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Per layer the largest value over runs, the run that holds it, and 65504 / value as headroom; the
    PNG is written; a second survey of the same receipt is refused (never overwritten)."""
    receipt = {"tests": [_record("p", "torch", "a", [1.0, 300.0], [2.0, 5.0]), _record("p", "torch", "b", [4.0, 100.0], None),
                         _record("q", "mlx", "c", [8.0], None), {"nodeid": "x::other", "outcome": "passed", "data": {}}]}
    path = tmp_path / "r.json"
    path.write_text(json.dumps(receipt))
    assert cli_main(["survey", str(path)]) == 0
    out = json.loads((tmp_path / "r.absmax.json").read_text())
    assert (tmp_path / "r.absmax.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    g = out["groups"]["p/torch"]
    assert [(la["overall"]["max"], la["overall"]["run"]) for la in g["layers"]] == [(4.0, "b"), (300.0, "a")]
    assert g["layers"][1]["mlp_down_in"]["max"] == 5.0 and g["residual_max"]["max"] == 300.0
    assert g["layers"][1]["overall"]["headroom_ratio"] == pytest.approx(FP16_MAX / 300.0)
    assert out["groups"]["q/mlx"]["layers"][0]["mlp_down_in"] is None
    assert "p/torch: 2 runs; residual max 300" in capsys.readouterr().out
    assert cli_main(["survey", str(path)]) == 2


def test_survey_command_refuses_malformed_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = _record("p", "torch", "a", [1.0], None)
    del bad["data"]["layers"][0]["overall"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"tests": [bad]}))
    assert cli_main(["survey", str(path)]) == 2
    err = capsys.readouterr().err
    assert "x::test_absmax[a]" in err and "layers[0]" in err, err
    assert not list(tmp_path.glob("r.absmax.*"))


@pytest.mark.dry
def test_absmax_figures_by_hand() -> None:
    x = np.array([[1.0, -7.0], [3.0, 2.0], [-0.5, 6.0]], dtype=np.float32)
    assert row_stats(x) == {"pos0": 7.0, "rest": 6.0, "overall": 7.0, "argmax_pos": 0, "argmax_ch": 1}
    assert row_stats(x[:1])["rest"] is None
    assert headroom(65504.0 / 8) == {"ratio": 8.0, "bits": 3.0}
    assert headroom(0.0) == {"ratio": None, "bits": None}
    with pytest.raises(ValueError, match="non-finite values, first at position 1, channel 0"):
        row_stats(np.array([[1.0], [np.inf]], dtype=np.float32))
