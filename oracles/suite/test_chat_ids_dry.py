"""Dry checks of the mtplx prompt records: no weights, no torch or transformers.

The committed ids of each pin's tokenizer (``oracles records mtplx --pin PIN``; the slow
``test_chat_template_ids`` holds the engines' own templates to them) must equal the template rendered
with jinja2 and encoded by ``tokenizers`` without extra special tokens, with exactly one BOS at the
start when the template emits one.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from oracles.checks.exact import assert_ids_equal
from oracles.families.execution.prompts import GENERATION, PROMPTS, load_prompts, source_digests
from oracles.families.records import family_tokens
from oracles.pins.pin import Pin
from oracles.pins.tokenizer import LightTokenizer, load_tokenizer, tokenizer_folder
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.dry, pytest.mark.mtplx]

RECORDS = load_prompts(PROMPTS) + load_prompts(GENERATION)


@pytest.fixture(scope="session")  # session: grouped per record, modules interleave on a worker
def tokenizers(pins: Callable[[str], Pin]) -> Callable[[str], LightTokenizer]:
    """``tokenizers(pin)``: the pin's tokenizer without transformers (skips when no copy is at hand)."""
    made: dict[str, LightTokenizer] = {}

    def get(pin: str) -> LightTokenizer:
        if pin not in made:
            folder = tokenizer_folder(pins(pin))
            if folder is None:
                pytest.skip(f"pin {pin}: no tokenizer copy in oracles/builtin/tokenizers and no materialised snapshot "
                            f"(run `oracles materialize {pin}`)")
            made[pin] = load_tokenizer(folder)
        return made[pin]

    return get


def test_dry_tokens_current(pin: str, receipt: Receipt) -> None:
    """The pin's tokens file was made from the committed prompt files."""
    doc = family_tokens("mtplx", pin)
    receipt.update(sources=doc.get("sources"))
    assert doc.get("sources") == source_digests(), (f"pin {pin}: mtplx token ids are stale against the prompt files: "
                                                    f"run `oracles records mtplx --pin {pin}`")


@pytest.mark.parametrize("record", RECORDS, ids=[p.id for p in RECORDS])
def test_dry_chat_ids(tokenizers: Callable[[str], LightTokenizer], pin: str, record: Any, receipt: Receipt) -> None:
    bound = record.bind(pin)
    ids = tokenizers(pin).chat_ids(record.message_list)
    receipt.update(request_sha256=record.sha256, token_count=len(ids))
    assert_ids_equal(ids, list(bound.ids), f"{record.id}: rendered+encoded ids vs the committed ids of pin {pin}")


@pytest.mark.parametrize("record", RECORDS, ids=[p.id for p in RECORDS])
def test_dry_single_bos(tokenizers: Callable[[str], LightTokenizer], pin: str, record: Any) -> None:
    tokenizer = tokenizers(pin)
    bos = tokenizer.token_id(tokenizer.bos_token)
    text = tokenizer.render(record.message_list)
    ids = list(record.bind(pin).ids)
    if bos is not None and text.startswith(tokenizer.bos_token or "\0"):
        assert ids[0] == bos, f"{record.id}: the template starts with BOS {tokenizer.bos_token!r} but ids[0] = {ids[0]}"
    assert ids[:2] != [bos, bos], f"{record.id}: doubled BOS {bos} at the start: {ids[:4]}"
