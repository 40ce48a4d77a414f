"""A receipt of this schema built as a run builds one (:meth:`RunReceipt.build` over test records, units
through ``attach_unit``, the sidecar packed), holding each figure ``oracles report`` draws: a failed port
test with its bisect and a record id and message that hold markup, MTP rounds, decode steps, a
graded port's chunks, cohort lanes, a clef port's stream, absmax layers, and a prefill unit pair."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from oracles.receipts.files import dump_json, pack_arrays
from oracles.receipts.schema import RunFacts, RunReceipt
from oracles.receipts.table import Receipt, TestRecord
from oracles.receipts.units import attach_unit

PIN = "smollm2-135m-instruct"
#: A record id and a message a page must show as text: markup, an entity, both quotes.
NASTY_ID = "<b>x</b>&amp;'y\"$1$"
NASTY_MESSAGE = "<script>alert(1)</script> max |Δlogit| 0.5 > 1e-4 at <row 3>"
V = 32


def _stages(divergent: str | None) -> list[dict[str, Any]]:
    names = ["embedding", "layer 0", "layer 1", "final norm", "head"]
    nmse = [0.0, 1e-14, 3e-3 if divergent else 2e-14, 4e-3 if divergent else 2e-14, 5e-3 if divergent else 3e-14]
    return [{"name": n, "nmse": v, "budget": 1e-10, "over": v > 1e-10} for n, v in zip(names, nmse)]


def _chunks(scale: float) -> list[dict[str, Any]]:
    return [{"chunk": c, "kld": {"mean": scale * (1 + c), "p99": 10 * scale * (1 + c)}} for c in range(4)]


def records(ok: bool = False) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(nodeid, family, outcome, data) of every record but the units' (``ok``: the failed one passed)."""
    bad = f"oracles/suite/test_port.py::test_prefill_vs_reference[{NASTY_ID}]"
    return [
        (bad, "port", "passed" if ok else "failed", {"max_abs": 0.5, "nmse": 1e-3, "port": "mlx", "port_pin": PIN,
                                 "translations": ["rope_theta 100000.0 from rope_parameters.rope_theta (mlx-lm reads 10000)"],
                                 "bisect": {"stages": _stages("layer 1"), "divergent": "layer 1"}}),
        ("oracles/suite/test_port.py::test_prefill_vs_reference[ok-ping]", "port", "passed", {"max_abs": 1e-5, "nmse": 1e-12}),
        ("oracles/suite/test_graded.py::test_port_within_band[q4]", "graded", "passed",
         {"kind": "port-graded", "port": "llamacpp", "chunks": _chunks(1e-3), "band": {"chunks": _chunks(1e-4)}}),
        ("oracles/suite/test_mtp.py::test_mtp_rounds_equal_greedy[arith-torch]", "mtplx", "passed",
         {"acceptance": 0.5, "rounds": [{"accepted": a, "drafts": [1, 2]} for a in (1, 2, 0, 2, 1)]}),
        ("oracles/suite/test_decode.py::test_decode_matches_recompute[arith-torch]", "mtplx", "passed",
         {"steps": [{"step": s, "max_abs": 1e-6 * s, "nmse": 0.0} for s in (0, 6, 12)]}),
        *((f"oracles/suite/test_cohort.py::test_cohort_close_to_serial[lane{lane}-{PIN}-torch]", "cohort", "passed",
           {"pin": PIN, "engine": "torch", "lane": lane, "atol": 1e-3, "max_abs": 1e-5 * (lane + 1), "worst_step": 3})
          for lane in range(4)),
        ("oracles/suite/test_clef_port.py::test_port_logits[row-mlx-vlm]", "clef", "passed",
         {"stream_max_abs": [0.0, 1e-5, 2e-5, 4e-5]}),
        ("oracles/suite/test_clef.py::test_absmax[row-torch]", "clef", "passed",
         {"kind": "absmax", "pin": "qwen35-vl-twin", "engine": "torch", "run": "row",
          "layers": [{"overall": v} for v in (2.0, 3.5, 5.0)]}),
        ("oracles/suite/test_layer_taps.py::test_bisect_faithful_port[mlx]", "faults", "passed",
         {"kind": "bisect", "pin": PIN, "stages": _stages(None), "divergent": None}),
        ("oracles/suite/test_d1.py::test_readout[skipped-one]", "d1", "skipped", {}),
    ]


def _units(staging: Path) -> list[TestRecord]:
    """A prefill unit of the reference and of the port (the port a seeded 1e-3 from it), each its test's."""
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, (6, V)).astype("<f4")
    port = (ref + rng.normal(0, 1e-3, ref.shape)).astype("<f4")
    out = []
    for engine, rows in (("torch", ref), ("mlx", port)):
        nodeid = f"oracles/suite/test_decode.py::test_prefill_comparable[ping-{PIN}-{engine}]"
        data: dict[str, Any] = {}
        attach_unit(Receipt(data, staging, nodeid), "prefill", request_sha256="a" * 64, pin=PIN, engine=engine,
                    record="ping", ids=list(range(1, 7)), argmax=rows.argmax(-1), arrays={"logits": rows})
        out.append(TestRecord(nodeid=nodeid, family="mtplx", check="test_prefill_comparable",
                              record_id=f"ping-{PIN}-{engine}", outcome="passed", duration=0.1, data=data))
    return out


def write(folder: Path, name: str = "20260101T000000Z-0a1b2c3d", ok: bool = False) -> Path:
    """``folder/<name>.json`` and its sidecar, a receipt of this schema with every figure the page draws;
    one port test failed, unless ``ok``."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".{name}.arrays"
    recs = _units(staging)
    for nodeid, family, outcome, data in records(ok):
        check, _, rest = nodeid.rpartition("::")[2].partition("[")
        recs.append(TestRecord(nodeid=nodeid, family=family, check=check, record_id=rest.removesuffix("]"),
                               outcome=outcome, duration=0.2, data=data,
                               summary=f"AssertionError: {NASTY_MESSAGE}\nsecond line" if outcome == "failed" else None))
    packed = pack_arrays(staging, folder / f"{name}.npz")
    facts = RunFacts(invocation={"args": ["--port", "mlx"], "reference": "torch"},
                     environment={"versions": {"python": "3.11.7"}, "git": {"commit": "abc", "dirty": False}},
                     events=[{"event": "pin_verified", "name": PIN, "worker": "main", "digest": "d" * 64, "bytes": 1},
                             {"event": "engine_loaded", "name": "mlx", "pin": PIN, "worker": "main", "seconds": 1.5,
                              "class": "oracles.engines.mlx.lm.MlxPort", "mlx": "0.32.4"}])
    receipt = RunReceipt.build(name.rsplit("-", 1)[-1], "2026-01-01T00:00:00.000000Z", time.time() - 5, 0 if ok else 1,
                               recs, [], facts, f"{name}.npz" if packed else None)
    path = folder / f"{name}.json"
    path.write_bytes(dump_json(receipt.to_json()))
    return path
