"""Receipts holding comparable units, written through the one writer (``attach_unit``) as a run writes them."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from oracles.receipts.files import pack_arrays
from oracles.receipts.table import SCHEMA_VERSION, Receipt
from oracles.receipts.units import attach_unit

V = 64
PIN = "smollm2-135m-instruct"
TWIN = "smollm2-hybrid-twin"
SHA = "c" * 64
KEYS = ["true", "false"]
GROUPS = [[3, 7], [4]]


def logits(seed: int = 0) -> np.ndarray:
    """``[V]`` float32 logits, normal(0, 3), seeded."""
    return np.random.default_rng(seed).normal(0, 3, V).astype("<f4")


def slot(seed: int = 1, gap: float = 2.0) -> np.ndarray:
    """``[1, V]`` logits whose answer tokens 3 ("true") and 4 ("false") lead by ``gap`` ("true" wins)."""
    x = np.random.default_rng(seed).normal(0, 1, (1, V)).astype("<f4")
    x[0, 3], x[0, 4] = 10 + gap, 10
    return x


def probs(x: np.ndarray) -> list[float]:
    """The read-out of slot logits ``x`` ``[1, V]`` over :data:`GROUPS`."""
    from oracles.checks.readout import group_probabilities, log_softmax

    return group_probabilities(log_softmax(x[0]), GROUPS)


def steps(last: np.ndarray, n: int) -> np.ndarray:
    """``[n, V]`` step logits: ``last`` ``[V]`` as step n - 1 after n - 1 seeded rows (the same for every
    engine, so two units built from one ``last`` agree on every earlier step); ``[S, V]`` passes through."""
    if last.ndim == 2:
        return last
    return np.stack([*(logits(100 + i) for i in range(n - 1)), last]).astype("<f4")


def decode(engine: str, last: np.ndarray, tokens: list[int], sha: str = "a" * 64, pin: str = PIN,
           kind: str = "decode", record: str = "arith") -> dict[str, Any]:
    """A decode (or generation) unit's attach_unit arguments, with its test's nodeid under ``test``: its
    ``step_logits`` are :func:`steps` of ``last`` (``[V]``, the last step, or every step ``[S, V]``),
    one row per token; none when no token was generated."""
    return {"test": f"t.py::test_decode_to_stop[{pin}-{record}-{engine}]", "kind": kind, "request_sha256": sha,
            "pin": pin, "engine": engine, "record": record, "ids": [1, 2, 3], "tokens": tokens, "argmax": tokens,
            "arrays": {"step_logits": steps(last, len(tokens))} if tokens else {}}


def readout(engine: str, qid: str, x: np.ndarray, sha: str = SHA, kind: str = "d1-row", pin: str = PIN,
            prefix: str = "tests/oracles") -> dict[str, Any]:
    """A read-out unit's attach_unit arguments for question ``qid`` with slot logits ``x`` ``[1, V]``."""
    return {"test": f"{prefix}/test_d1.py::test_readout[{pin}-fact_water/{qid}-{engine}]", "kind": kind,
            "request_sha256": sha, "pin": pin, "engine": engine, "record": "fact_water", "unit": qid,
            "ids": [1, 2, 3, 5], "keys": KEYS, "probs": probs(x), "arrays": {"slot_logits": x}}


def prompt_rows(x: np.ndarray, n: int) -> np.ndarray:
    """``[n, V]`` logits of every prompt position: n - 1 seeded rows (the same for every engine), then
    the answer slot ``x`` ``[1, V]`` as the last."""
    return np.concatenate([np.stack([logits(200 + i) for i in range(n - 1)]), x]).astype("<f4")


def clef(engine: str, qid: str, rows: np.ndarray, sha: str = SHA) -> dict[str, Any]:
    """A clef-row unit's attach_unit arguments for question ``qid``: every prompt position's logits
    ``rows`` ``[T, V]`` (one id and argmax per row), the read-out of the last row (the answer slot)."""
    return {"test": f"oracles/suite/test_clef.py::test_readout[qwen35-vl-twin-img_circle/native/{qid}-{engine}]",
            "kind": "clef-row", "request_sha256": sha, "pin": "qwen35-vl-twin", "engine": engine,
            "record": "img_circle/native", "unit": qid, "ids": list(range(1, rows.shape[0] + 1)),
            "argmax": rows.argmax(-1), "keys": KEYS, "probs": probs(rows[-1:]), "arrays": {"logits": rows}}


def write(folder: Path, name: str, units: list[dict[str, Any]], *, run_id: str | None = None,
          others: list[dict[str, Any]] | None = None) -> Path:
    """``folder/name.json`` (+ ``name.npz``): one test record per distinct ``test`` of ``units``, each unit
    attached with attach_unit; ``others`` are appended as given (test records without units)."""
    folder.mkdir(parents=True, exist_ok=True)
    staging = folder / f".{name}.arrays"
    tests: dict[str, dict[str, Any]] = {}
    for spec in units:
        spec = dict(spec)
        nodeid = spec.pop("test")
        attach_unit(Receipt(tests.setdefault(nodeid, {}), staging, nodeid), spec.pop("kind"), **spec)
    packed = pack_arrays(staging, folder / f"{name}.npz")
    receipt = {"schema_version": SCHEMA_VERSION, "run_id": run_id or name, "invocation": {"reference": "torch"},
               "tests": [{"nodeid": n, "outcome": "passed", "data": d} for n, d in tests.items()] + (others or [])}
    if packed:
        receipt["arrays"] = f"{name}.npz"
    path = folder / f"{name}.json"
    path.write_text(json.dumps(receipt))
    return path


def edit(path: Path, fn: Any) -> None:
    """Rewrite the receipt at ``path`` after ``fn(doc)`` changed it in place."""
    doc = json.loads(path.read_text())
    fn(doc)
    path.write_text(json.dumps(doc))


def near(row: dict[str, Any], name: str, attached: float, rel: float = 0.05) -> bool:
    """Whether comparison row ``row``'s figure ``name`` is ``attached`` (the figure of the attached float32
    rows) to ``rel``, widened by the stored rows' error where they were stored to one (``stored_error``)."""
    return bool(abs(row[name] - attached) <= rel * abs(attached) + row.get("stored_error", 0.0))


def replace_array(npz: Path, key: str, value: np.ndarray) -> None:
    """Rewrite sidecar ``npz`` with ``value`` stored as attached under ``key`` (its coded members, if
    any, dropped): a hand-edited sidecar, as another writer might leave one."""
    from oracles.receipts.logit_store import SEP

    with np.load(npz) as packed:
        arrays = {k: packed[k] for k in packed.files if not k.startswith(f"{key}{SEP}")}
    np.savez(npz, **{**arrays, key: value})


def unit_key(npz: Path) -> str:
    """The one array key of sidecar ``npz`` (coded or not)."""
    from oracles.receipts.logit_store import array_keys

    with np.load(npz) as packed:
        (key,) = array_keys(packed.files)
    return key
