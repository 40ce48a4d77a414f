"""Every ``oracles bisect`` verdict names what the port's adapter translated to load the artifact
(``Engine.translation_notes()``), in the verdict line and the JSON, as the port checks' verdicts do: mlx-lm
on the draft twin reads its RoPE base only through the adapter's translation (the twin's config keeps it in
``rope_parameters``, mlx-lm 0.32 reads ``rope_theta`` and would fall back to 10,000), and the verdict that
every stage is within its budget needed that translation. Slow: transformers and mlx-lm load the twin."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

import pytest

pytestmark = pytest.mark.slow


def test_the_verdict_names_the_mlx_ports_rope_translation(oracles_cli: Callable[..., tuple[int, str, str]],
                                                          tmp_path: Path) -> None:
    from oracles.engines.mlx.lm import MlxPort
    from oracles.pins.materialize import materialize
    from oracles.pins.pin import load_pin

    if (why := MlxPort.unavailable_reason()) is not None:
        pytest.skip(why)
    materialize(load_pin("smollm2-draft-twin"))
    status, out, err = oracles_cli("bisect", "--pin", "smollm2-draft-twin", "--port", "mlx", "--record", "ping",
                                   "--out", str(tmp_path))
    assert status == 0, err
    verdict = next(line for line in out.splitlines() if line.startswith("verdict: "))
    # the twin's config.json: "rope_parameters": {"rope_theta": 100000.0, ...}
    assert verdict.startswith("verdict: every stage within its budget [port loaded with rope_theta 100000.0"), verdict
    (report,) = tmp_path.glob("smollm2-draft-twin-mlx-ping-*.json")
    notes = json.loads(report.read_text())["translations"]
    assert len(notes) == 1 and notes[0].startswith("rope_theta 100000.0") and notes[0] in verdict
