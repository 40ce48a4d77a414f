"""Settings shared by the unit tests that run an inner pytest session under ``--deadline``."""

from __future__ import annotations

#: Seconds; a deadline the inner session's first test always starts within. Under a loaded CI (two
#: workers running torch) an in-process session once took 0.44 s to reach its first test, so a 0.3 s
#: deadline cut it before anything ran. A test meant to outlast it sleeps ``DEADLINE`` plus a margin.
DEADLINE = 3.0


#: Source of a tokenizer with the members of :class:`oracles.engines.types.Tokenizer` over a pin's dry
#: tokenizer, for the fake engines the inner runs plug in: the start of such an engine module's source.
DRY_TOKENIZER = """
from oracles.pins.tokenizer import load_tokenizer


class Tokenizer:  # the members of oracles.engines.types.Tokenizer, over the pin's dry tokenizer
    chat_template = None

    def __init__(self, root):
        self.light = load_tokenizer(root)

    def encode(self, text, add_special_tokens=True):
        return self.light.encode(text)

    def apply_chat_template(self, conversation, **kwargs):
        return self.light.chat_ids(conversation)

    def decode(self, token_ids, skip_special_tokens=False):
        return self.light.tokenizer.decode(list(token_ids))
"""
