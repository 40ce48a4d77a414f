"""Dry checks of the mtplx prompt records: no weights, no torch or transformers.

The committed ids came from transformers' ``apply_chat_template`` (``oracles records mtplx``; the
slow ``test_chat_template_ids`` re-checks that); here the template rendered with jinja2 and encoded
by ``tokenizers`` without extra special tokens must give the same ids, with exactly one BOS at the
start when the template emits one.
"""

from __future__ import annotations

import pytest

from oracles.chat import LightTokenizer
from oracles.checks.exact import assert_ids_equal
from oracles.families.mtplx import load_prompts
from oracles.records import FIXTURES

pytestmark = [pytest.mark.dry, pytest.mark.mtplx]

PROMPTS = load_prompts()


@pytest.fixture(scope="session")  # session: grouped per record, modules interleave on a worker
def tokenizer() -> LightTokenizer:
    return LightTokenizer(FIXTURES / "tokenizers" / PROMPTS[0].pin)


@pytest.mark.parametrize("record", PROMPTS, ids=[p.id for p in PROMPTS])
def test_dry_chat_ids(tokenizer: LightTokenizer, record, receipt) -> None:
    ids = tokenizer.chat_ids(record.message_list)
    receipt.update(request_sha256=record.sha256, token_count=len(ids))
    assert_ids_equal(ids, list(record.ids), f"{record.id}: rendered+encoded ids vs committed ids")


@pytest.mark.parametrize("record", PROMPTS, ids=[p.id for p in PROMPTS])
def test_dry_single_bos(tokenizer: LightTokenizer, record) -> None:
    bos = tokenizer.token_id(tokenizer.bos_token)
    text = tokenizer.render(record.message_list)
    ids = list(record.ids)
    if bos is not None and text.startswith(tokenizer.bos_token or "\0"):
        assert ids[0] == bos, f"{record.id}: the template starts with BOS {tokenizer.bos_token!r} but ids[0] = {ids[0]}"
    assert ids[:2] != [bos, bos], f"{record.id}: doubled BOS {bos} at the start: {ids[:4]}"
