"""Chat-template rendering and tokenisation without transformers (for ``-m dry``).

Renders the template the way transformers' ``apply_chat_template`` does (a sandboxed jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` available; see
transformers ``utils/chat_template_utils.py``) and encodes with the ``tokenizers`` library, adding no
special tokens: the ids must then equal transformers' own, which the slow suite checks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from oracles.errors import FixtureError


@dataclass
class LightTokenizer:
    """A snapshot's tokenizer.json, tokenizer_config.json and chat_template.jinja, without transformers."""

    root: Path

    def __post_init__(self) -> None:
        """Raises FixtureError naming the folder and the file when a tokenizer file is missing (a pin
        whose tokenizer copy is not under fixtures/tokenizers, for one)."""
        from tokenizers import Tokenizer

        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (self.root / name).is_file():
                raise FixtureError(f"{self.root / name}: missing; the dry tokenizer of pin {self.root.name!r} "
                                   f"needs a copy of the snapshot's tokenizer files in {self.root}")
        self.tokenizer = Tokenizer.from_file(str(self.root / "tokenizer.json"))
        self.config: dict[str, Any] = json.loads((self.root / "tokenizer_config.json").read_text())
        template = self.root / "chat_template.jinja"
        self.template = template.read_text() if template.is_file() else self.config.get("chat_template")
        if not self.template:
            raise ValueError(f"{self.root}: no chat_template.jinja and no chat_template in tokenizer_config.json")

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tokenizer.token_to_id(text)

    @property
    def bos_token(self) -> str | None:
        return self.config.get("bos_token")

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        special = {k: self.config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return env.from_string(self.template).render(messages=list(messages),
                                                     add_generation_prompt=add_generation_prompt, **special)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt))

    def template_uses_bos(self) -> bool:
        return "bos_token" in (self.template or "")
