"""Red-arm candidates of the d1 family, measured on the reference before any is adopted.

    ORACLES_HOME=... python -m oracles.families.d1.arms      # writes oracles/builtin/records/d1/red_arms.json

A candidate perturbs one question of a base record: a *word flip* changes one word of the state, a
*state swap* puts the question over another record's state. Each candidate's row and its base's row
run on the reference engine (torch, default pin); the move is ``max_g |p_arm - p_base|``. A candidate
that moves some option by more than the engine's ``red_arm_min`` (0.02 in float32:
:mod:`oracles.checks.tolerance`) is adopted as a control (``arms``); one
that moves less is not a control: it is listed under ``not_adopted`` with its figure, and added to
``requests.json`` as a plain record with its own gold answer (then run ``oracles records d1``).
The file is refused if it exists (a measurement is evidence, never overwritten).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from typing import Any

from oracles.checks.readout import argmax, max_abs_dp
from oracles.engines.base import Engine
from oracles.families.d1 import records as d1
from oracles.families.records import canonical_sha256

#: (arm id, kind, base id, question, change, gold of the arm's question were it a plain record)
CANDIDATES: tuple[tuple[str, str, str, str, dict[str, str], str], ...] = (
    ("flip_sent_film", "word_flip", "sent_film", "sentiment", {"from": "loved", "to": "hated"}, "negative"),
    ("flip_ent_cats", "word_flip", "ent_cats", "black", {"from": "black.", "to": "white."}, "false"),
    ("flip_ent_shop", "word_flip", "ent_shop", "open", {"from": "eight", "to": "five"}, "true"),
    ("flip_arith_apples", "word_flip", "arith_apples", "total", {"from": "4", "to": "5"}, "8"),
    ("swap_sent_film_hotel", "state_swap", "sent_film", "sentiment", {"state_of": "sent_hotel"}, "negative"),
    ("swap_sent_hotel_film", "state_swap", "sent_hotel", "sentiment", {"state_of": "sent_film"}, "positive"),
)


def arm_request(base: d1.Request, qid: str, kind: str, change: dict[str, str], by_id: dict[str, d1.Request]) -> dict[str, Any]:
    """The arm's request JSON: the base's question ``qid`` alone, over the perturbed state.

    Raises:
        ValueError: the word to flip does not occur exactly once in the base state.
    """
    state = base.state
    if kind == "word_flip":
        words = state.split(" ")
        hits = [i for i, w in enumerate(words) if w == change["from"]]
        if len(hits) != 1:
            raise ValueError(f"{base.id}: word {change['from']!r} occurs {len(hits)} times in the state")
        words[hits[0]] = change["to"]
        state = " ".join(words)
    else:
        state = by_id[change["state_of"]].state
    return {"state": state, "questions": {qid: base.raw["request"]["questions"][qid]}}


def measure(engine: Engine) -> dict[str, Any]:
    """Run every candidate and its base on ``engine``; the red_arms.json document."""
    from oracles.families.d1.run import row_pass

    by_id = {r.id: r for r in d1.load_requests()}
    rows = {(r["id"], r["qid"]): r for r in d1.rows_doc(engine.pin)["rows"]}
    least = engine.tolerance().red_arm_min
    adopted: list[dict[str, Any]] = []
    not_adopted: list[dict[str, Any]] = []
    for arm_id, kind, base_id, qid, change, gold in CANDIDATES:
        base = by_id[base_id]
        req = arm_request(base, qid, kind, change, by_id)
        q = next(x for x in base.questions if x.qid == qid)
        groups = rows[(base_id, qid)]["readout_ids"]
        p_base = row_pass(engine, engine.chat_ids(d1.row_messages(base.state, q)), groups).probs
        p_arm = row_pass(engine, engine.chat_ids(d1.row_messages(req["state"], q)), groups).probs
        dp = max_abs_dp(p_arm, p_base)
        entry = {"id": arm_id, "kind": kind, "base_id": base_id, "question": qid, "change": change, "request": req,
                 "sha256": canonical_sha256(req), "base_sha256": base.sha256, "adopted": dp > least,
                 "measured": {"max_abs_dp": dp, "probs_base": p_base, "probs_arm": p_arm, "keys": list(q.keys),
                              "argmax_base": q.keys[argmax(p_base)], "argmax_arm": q.keys[argmax(p_arm)],
                              "engine": engine.id, "pin": engine.pin, "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}}
        (adopted if entry["adopted"] else not_adopted).append(entry | ({} if entry["adopted"] else {"plain_record_gold": gold}))
        print(json.dumps({"arm": arm_id, "max_abs_dp": round(dp, 6), "adopted": entry["adopted"]}), flush=True)
    return {"family": "d1", "rule": f"adopted as a control when max_g |p_arm - p_base| > {least} on the reference "
                                    "(row path, default pin); a smaller move stays a plain record in requests.json",
            "threshold": least, "measured_with": {"engine": engine.id, "pin": engine.pin,
                                                           "python": platform.python_version(),
                                                           "describe": engine.describe() if hasattr(engine, "describe") else {}},
            "arms": adopted, "not_adopted": not_adopted}


def main() -> int:
    from oracles.engines.torch.reference import TorchReference
    from oracles.families import DEFAULT_PIN
    from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot

    if d1.RED_ARMS.exists():
        print(f"{d1.RED_ARMS} exists: measurements are never overwritten", file=sys.stderr)
        return 2
    pin = load_pin(DEFAULT_PIN)
    root = snapshot_dir(pin)
    verify_snapshot(pin, root)
    doc = measure(TorchReference(root, pin))
    d1.RED_ARMS.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {d1.RED_ARMS}: {len(doc['arms'])} adopted, {len(doc['not_adopted'])} not adopted")
    return 0


if __name__ == "__main__":
    sys.exit(main())
