"""Chat-template rendering and tokenisation without transformers (for ``-m dry`` and ``oracles records``).

Renders the template the way transformers' ``apply_chat_template`` does (a sandboxed jinja2
environment with ``trim_blocks`` and ``lstrip_blocks``, ``raise_exception`` available; see
transformers ``utils/chat_template_utils.py``) and encodes with the ``tokenizers`` library, adding no
special tokens: the ids must then equal transformers' own, which the slow suite checks.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cached_property, lru_cache
from pathlib import Path
from typing import Any, Sequence

from oracles.errors import FixtureError


class NoChatTemplate(FixtureError):
    """A tokenizer without a chat template: the families that render chats cannot run on its pin."""


@dataclass
class LightTokenizer:
    """A snapshot's tokenizer.json, tokenizer_config.json and chat_template.jinja, without transformers."""

    root: Path

    def __post_init__(self) -> None:
        """Raises FixtureError naming the folder and the file when a tokenizer file is missing (a pin
        whose tokenizer files are not in the folder given, for one)."""
        for name in ("tokenizer.json", "tokenizer_config.json"):
            if not (self.root / name).is_file():
                raise FixtureError(f"{self.root / name}: missing; the dry tokenizer of pin {self.root.name!r} "
                                   f"needs a copy of the snapshot's tokenizer files in {self.root}")
        self.tokenizer = parsed_tokenizer((self.root / "tokenizer.json").read_bytes())
        self.config: dict[str, Any] = json.loads((self.root / "tokenizer_config.json").read_text())
        template = self.root / "chat_template.jinja"
        self.template = template.read_text() if template.is_file() else self.config.get("chat_template")
        if not self.template:
            raise NoChatTemplate(f"{self.root}: no chat_template.jinja and no chat_template in tokenizer_config.json")

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.tokenizer.token_to_id(text)

    @property
    def bos_token(self) -> str | None:
        return self.config.get("bos_token")

    @cached_property
    def _compiled(self) -> Any:
        """The chat template compiled once per tokenizer, as transformers caches it (measured here on
        SmolLM2's template: compiling 2.3 ms, rendering 0.02 ms; the d1 rows render it ~300 times)."""
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        return env.from_string(self.template)

    def render(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        special = {k: self.config.get(k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")}
        return str(self._compiled.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                         **special))

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.render(messages, add_generation_prompt))

    def template_uses_bos(self) -> bool:
        return "bos_token" in (self.template or "")


#: Parsed tokenizer.json files by their sha256: copies of one tokenizer (a pin's snapshot, the committed
#: copy, a test's temporary folder) share one parse (SmolLM2's: ~100 ms; hashing its 3.5 MB: ~5 ms).
#: ``encode`` leaves a ``tokenizers.Tokenizer`` unchanged (no padding or truncation is set on it here).
_PARSED: dict[str, Any] = {}


def parsed_tokenizer(data: bytes) -> Any:
    """The ``tokenizers.Tokenizer`` of a tokenizer.json's bytes, parsed once per process per content."""
    from tokenizers import Tokenizer

    key = hashlib.sha256(data).hexdigest()
    if key not in _PARSED:
        _PARSED[key] = Tokenizer.from_str(data.decode("utf-8"))
    return _PARSED[key]


def load_tokenizer(root: Path) -> LightTokenizer:
    """The :class:`LightTokenizer` of ``root``, loaded once per process while its files are unchanged.

    Pins that share a tokenizer share a folder (:func:`tokenizer_folder`), and parsing SmolLM2's
    tokenizer.json takes ~80 ms here: the dry suite and ``oracles records`` would pay it per pin and per
    family. The cache key holds each file's size and mtime, so a file rewritten in place is read again.

    Raises:
        FixtureError: as :class:`LightTokenizer`.
    """
    stats = []
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        try:
            st = (root / name).stat()
            stats.append((name, st.st_size, st.st_mtime_ns))
        except OSError:
            stats.append((name, -1, -1))
    return _load_cached(Path(root).resolve(), tuple(stats))


@lru_cache(maxsize=16)
def _load_cached(root: Path, stats: tuple[tuple[str, int, int], ...]) -> LightTokenizer:
    return LightTokenizer(root)


def tokenizer_folder(pin: Any) -> Path | None:
    """A folder holding ``pin``'s tokenizer files, each equal to the pinned digest: a committed copy
    under ``oracles/builtin/tokenizers`` (any whose files match, so pins sharing a tokenizer share a
    copy), else the pin's materialised snapshot; None when neither has them. Reads no weights."""
    from oracles.families.records import TOKENIZER_COPIES
    from oracles.pins.pin import TOKENIZER_FILES, sha256_file, snapshot_dir

    wanted = {name: d.sha256 for name, d in pin.files.items() if Path(name).name in TOKENIZER_FILES}
    candidates = sorted(p for p in TOKENIZER_COPIES.iterdir() if p.is_dir()) if TOKENIZER_COPIES.is_dir() else []
    for folder in [*candidates, snapshot_dir(pin)]:
        if all((folder / n).is_file() and sha256_file(folder / n) == sha for n, sha in wanted.items()):
            return folder
    return None


#: Text the engines' tokenizers must encode as the dry tokenizer does: a blank line ("\n\n" is one token
#: for some pre-tokenizers and two for others), runs of spaces, digits, punctuation and non-ASCII text
#: are where tokenizer classes built over the same tokenizer.json have been seen to split differently.
CANARY = "Hello world!\n\nTwo  spaces,\tdigits 12345 and 3.14159; café naïve 日本語 🙂\n"


def engine_tokenizer_name(tokenizer: Any) -> str:
    """``transformers Qwen2Tokenizer`` or ``mlx-lm TokenizerWrapper(Qwen2Tokenizer)``: what encodes for an engine."""
    inner = getattr(tokenizer, "_tokenizer", None)
    name = type(tokenizer).__name__
    if inner is not None and type(tokenizer).__module__.startswith("mlx_lm"):
        return f"mlx-lm {name}({type(inner).__name__})"
    return f"{type(tokenizer).__module__.split('.')[0]} {name}"


def canary_disagreement(tokenizer: Any, root: Path, engine_id: str, pin: str) -> str | None:
    """One line when an engine's ``tokenizer`` encodes :data:`CANARY` differently from the dry
    tokenizer of the snapshot in ``root`` (the ``tokenizers`` library over its tokenizer.json, which
    wrote the pin's recorded token ids), else None. Every recorded id list would then be another
    input to that engine, and its tests would fail as mismatches or as nondeterminism; None too when
    the snapshot has no dry tokenizer to compare with (nothing was recorded from it)."""
    try:
        light = load_tokenizer(root)
    except FixtureError:
        return None
    want = light.encode(CANARY)
    got = [int(i) for i in tokenizer.encode(CANARY, add_special_tokens=False)]
    if got == want:
        return None
    return (f"engine {engine_id} refuses pin {pin}: its tokenizer ({engine_tokenizer_name(tokenizer)}) encodes "
            f"the canary {CANARY!r} as {got}, the pin's dry tokenizer (tokenizers, {root / 'tokenizer.json'}) as "
            f"{want}, so the recorded token ids are not what this engine would feed its model; {_culprit(tokenizer)}")


#: The top-level packages whose tokenizer classes are picked from the snapshot's own files.
LIBRARY_TOKENIZERS = ("transformers", "mlx_lm", "mlx_vlm", "tokenizers")


def _culprit(tokenizer: Any) -> str:
    """Where a canary disagreement likely comes from: a library tokenizer's class picked from the
    snapshot's config (transformers, mlx-lm), or else the engine's own tokenizer code."""
    if type(tokenizer).__module__.split(".")[0] in LIBRARY_TOKENIZERS:
        return ("the tokenizer class the engine picks (from config.json's model_type and tokenizer_config.json's "
                "tokenizer_class) does not match these tokenizer files: pin a snapshot whose tokenizer files are "
                "its model's own")
    cls = type(tokenizer)
    return (f"the engine's own tokenizer ({cls.__module__}.{cls.__qualname__}, not a transformers or mlx-lm one) is "
            f"the likely fault: compare its encode(text, add_special_tokens=False) with tokenizers.Tokenizer.from_file "
            f"over that tokenizer.json; else the pin's tokenizer files are not its model's own")
