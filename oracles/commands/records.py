"""``oracles records FAMILY``: regenerate a family's committed ids from the tokenizer alone (no weights).

For ``mtplx`` it re-hashes each prompt record's messages and re-tokenises them with transformers'
``apply_chat_template`` from the verified snapshot's tokenizer, then rewrites
``fixtures/records/mtplx/prompts.json``. Review the diff: a change of ids means the tokenizer or
template changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("family", choices=["mtplx", "d1"], help="which family's records to regenerate")
    parser.add_argument("--snapshot", type=Path, default=None, help="snapshot folder; default the pin's under $ORACLES_HOME")


def run(args: argparse.Namespace) -> int:
    from oracles.pins import load_pin, snapshot_dir, verify_snapshot

    if args.family == "d1":
        from oracles.families.d1_rows import regenerate

        return regenerate(args)
    from transformers import AutoTokenizer

    from oracles.families.mtplx import PROMPTS, rebuild_prompts
    from oracles.records import load_record_list

    top, records = load_record_list(PROMPTS)
    pin = load_pin(top["pin"])
    root = args.snapshot or snapshot_dir(pin)
    verify_snapshot(pin, root)
    tok = AutoTokenizer.from_pretrained(root)

    def chat_ids(messages: list[dict[str, str]]) -> list[int]:
        return [int(i) for i in tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)]

    new = rebuild_prompts(records, pin.name, chat_ids)
    PROMPTS.write_text(json.dumps(new, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {PROMPTS}: {len(new['records'])} records")
    return 0
