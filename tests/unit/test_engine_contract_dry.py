"""The engine contract where the plugin builds an engine (oracles/engines/contract.py, EngineLoader.build):
a member the base class requires missing (the engine's or its tokenizer's) fails the load in one line
naming the class and every member; a wrong Step, array or Generation coming back from a call is one
EngineContractError naming engine, method, field, what came back and what was expected. The engine is
the numpy fake of tests/unit/cohort_fake.py with a pin's dry tokenizer; no framework is imported."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pytest
from cohort_fake import D, DryTokenizer, FakeEngine, NoForward, V

from oracles.engines.base import (
    DEFAULTED_MEMBERS,
    REQUIRED_MEMBERS,
    Engine,
    EngineContractError,
    Generation,
    Sampler,
    Step,
    Tokenizer,
)
from oracles.engines.contract import install_checks
from oracles.engines.types import TOKENIZER_MEMBERS, VISION_TOKENIZER_MEMBERS
from oracles.pins.pin import Pin, load_pin
from oracles.pins.tokenizer import canary_disagreement
from oracles.plugin.fixtures import EngineLoader

pytestmark = pytest.mark.dry

SMOL = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
PIN = "smollm2-135m-instruct"


class Port(FakeEngine):
    """A port of one's own built as the plugin builds engines; ``bug`` plants a broken return."""

    id = "my-port"
    loads = 0

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__()
        type(self).loads += 1
        self.root, self.pin, self.pin_file, self.eos_token_ids = root, pin.name, pin, frozenset({2})
        self.tokenizer = DryTokenizer(root)
        self.shape_bug = ""

    def forward(self, prompt: Any, cache: Any | None = None, keep: int = 0, layers: bool = False) -> Step:
        step = super().forward(prompt, cache, keep, layers)
        if self.shape_bug == "flat" and keep == 1:
            return Step(logits=step.logits[0], hidden=step.hidden[0])
        if self.shape_bug == "f64":
            return Step(logits=step.logits.astype(np.float64), hidden=step.hidden)
        return step

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        out = super().lm_head(hidden)
        return out.astype(np.float64) if self.shape_bug == "head64" else out

    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        step = super().decode_cohort(tokens, caches)
        return Step(logits=step.logits[:1], hidden=step.hidden[:1]) if self.shape_bug == "one_row" else step

    def generate(self, prompt: Any, sampler: Sampler, max_new_tokens: int, max_kv_size: int | None = None) -> Generation:
        step = self.forward(list(prompt), keep=1)
        rows = step.logits.astype(np.float64) if self.shape_bug == "gen64" else step.logits
        return Generation([int(rows[-1].argmax())], "", "length", rows, 0.0, 0.0)


def _loader(monkeypatch: pytest.MonkeyPatch, cls: type[Engine], events: list[Any] | None = None) -> EngineLoader:
    import oracles.engines as registry

    monkeypatch.setattr(registry, "unavailable_reason", lambda _e: None)
    monkeypatch.setattr(registry, "engine_class", lambda _e: cls)
    sink = events if events is not None else []
    return EngineLoader(lambda _pin: SMOL, 0, lambda _e: {}, lambda event, **f: sink.append((event, f)))


def _fails_once(loader: EngineLoader, engine_id: str, pin: str = PIN) -> str:
    """The one line every test of the pair fails with (asked twice: the same line, no traceback)."""
    lines = []
    for _ in range(2):
        with pytest.raises(pytest.fail.Exception) as info:
            loader.get(engine_id, pin)
        assert info.value.pytrace is False
        lines.append(str(info.value))
    assert lines[0] == lines[1] and "\n" not in lines[0]
    return lines[0]


# -- the declared contract -----------------------------------------------------------------------------

def test_required_members_are_the_base_class_annotations() -> None:
    """REQUIRED_MEMBERS is what Engine declares less what it gives a default (DEFAULTED_MEMBERS, each set on
    the class), so the check and the declaration cannot drift apart: a member declared anew is one or the other."""
    assert set(REQUIRED_MEMBERS) == set(Engine.__annotations__) - set(DEFAULTED_MEMBERS)
    assert not set(REQUIRED_MEMBERS) & set(DEFAULTED_MEMBERS)
    assert all(name in Engine.__annotations__ and name in vars(Engine) for name in DEFAULTED_MEMBERS)


def test_tokenizer_members_are_the_protocols() -> None:
    declared = {n for n in vars(Tokenizer) if not n.startswith("_")} | set(Tokenizer.__annotations__)
    assert set(TOKENIZER_MEMBERS) | set(VISION_TOKENIZER_MEMBERS) == declared
    assert all(vars(Tokenizer)[n].__doc__ for n in declared if n in vars(Tokenizer))  # each says what it is for


def test_dry_tokenizer_keeps_the_protocol_and_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: the fake port with every member loads, once, and is the object families get."""
    events: list[Any] = []
    loader = _loader(monkeypatch, Port, events)
    engine = loader.get("my-port", PIN)
    assert type(engine) is Port and loader.get("my-port", PIN) is engine
    assert [e for e, _ in events] == ["engine_loaded"]


# -- item 3 and 1: a missing member fails the load once, in one line --------------------------------------

class NoMaxContext(Port):
    """The trial's port: it never sets max_context (23 tests each failed with AttributeError)."""

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        del self.max_context


class TwoMethodTokenizer:
    """A tokenizer with what the Engine docstring used to promise: apply_chat_template and decode."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> list[int]:
        return [1]

    def decode(self, token_ids: list[int], **kwargs: Any) -> str:
        return ""


class Bare(NoForward, Engine):
    """Has the core methods and sets nothing else but a tokenizer with the two documented methods, and a
    str for vocab_size."""

    id = "bare"
    loads = 0

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        type(self).loads += 1
        self.tokenizer = TwoMethodTokenizer()  # type: ignore[assignment]  # the broken port under test
        self.vocab_size = "49152"  # type: ignore[assignment]


def test_missing_max_context_fails_the_load_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[Any] = []
    NoMaxContext.loads = 0
    line = _fails_once(_loader(monkeypatch, NoMaxContext, events), "my-port")
    assert line.startswith(f"engine my-port cannot load pin {PIN}: test_engine_contract_dry.NoMaxContext breaks "
                           "the engine contract: max_context (oracles.engines.base.Engine requires id, pin, root, ")
    assert line.endswith("; tried once per run")
    assert NoMaxContext.loads == 1 and events == []


def test_every_missing_member_and_tokenizer_member_named_together(monkeypatch: pytest.MonkeyPatch) -> None:
    line = _fails_once(_loader(monkeypatch, Bare), "bare")
    assert ("test_engine_contract_dry.Bare breaks the engine contract: hidden_size, num_layers, eos_token_ids, "
            "max_context, vocab_size (a str), tokenizer.encode, tokenizer.chat_template (") in line
    assert "a tokenizer has apply_chat_template, encode, decode, chat_template: oracles.engines.types.Tokenizer)" in line
    assert Bare.loads == 1


def test_vision_pin_asks_the_tokenizer_for_convert_ids_to_tokens(monkeypatch: pytest.MonkeyPatch) -> None:
    class NoConvert(Port):
        def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
            super().__init__(root, pin, threads)
            self.tokenizer = TwoMethodTokenizer()  # type: ignore[assignment]

    line = _fails_once(_loader(monkeypatch, NoConvert), "my-port", "qwen35-vl-twin")
    assert "tokenizer.encode, tokenizer.chat_template, tokenizer.convert_ids_to_tokens (" in line


def test_tokenizer_encode_that_raises_is_one_line_tried_once(monkeypatch: pytest.MonkeyPatch) -> None:
    class OldEncode(DryTokenizer):
        def encode(self, text: str) -> list[int]:  # type: ignore[override]  # no add_special_tokens
            return self.light.encode(text)

    class OldPort(Port):
        def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
            super().__init__(root, pin, threads)
            self.tokenizer = OldEncode(root)  # type: ignore[assignment]  # the broken tokenizer under test

    line = _fails_once(_loader(monkeypatch, OldPort), "my-port")
    assert line.startswith(f"engine my-port cannot load pin {PIN}: its tokenizer's encode(text, add_special_tokens="
                           "False) raised TypeError: ")


# -- item 2: a bad return is one line at the boundary ---------------------------------------------------

def _built(monkeypatch: pytest.MonkeyPatch, bug: str) -> Port:
    engine = _loader(monkeypatch, Port).get("my-port", PIN)
    assert isinstance(engine, Port)
    engine.shape_bug = bug
    return engine


def test_flat_logits_for_keep_1_named(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _built(monkeypatch, "flat")
    with pytest.raises(EngineContractError) as info:
        engine.forward([5, 6, 7], engine.make_cache(), keep=1)
    assert str(info.value) == (f"engine my-port forward(): Step.logits is float32 [{V}]; expected float32 [T, V] = "
                               f"[1, {V}] with T = 1 (3 prompt ids, keep=1), V = vocab_size, D = hidden_size")


def test_float64_logits_named(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _built(monkeypatch, "f64")
    with pytest.raises(EngineContractError, match=rf"^engine my-port forward\(\): Step.logits is float64 \[12, {V}\]; "
                       rf"expected float32 \[T, V\] = \[12, {V}\] with T = 12 \(12 prompt ids, keep=0\)"):
        engine.forward(list(range(12)))


def test_engine_own_call_of_forward_is_checked_too(monkeypatch: pytest.MonkeyPatch) -> None:
    """The port's generate reads its own forward: the bad Step is named there, not as an IndexError."""
    engine = _built(monkeypatch, "flat")
    with pytest.raises(EngineContractError, match=r"forward\(\): Step.logits is float32 \[2003\]"):
        engine.generate([5, 6], Sampler(), 1)


@pytest.mark.parametrize(("bug", "call", "expected"), [
    ("one_row", lambda e: e.decode_cohort([3, 4], [e.make_cache(), e.make_cache()]),
     f"engine my-port decode_cohort(): Step.logits is float32 [1, {V}]; expected float32 [T, V] = [2, {V}] with B = 2"),
    ("head64", lambda e: e.lm_head(np.zeros((4, D), "<f4")),
     f"engine my-port lm_head(): the return value is float64 [4, {V}]; expected float32 [T, V] = [4, {V}] for hidden [4, {D}]"),
    ("gen64", lambda e: e.generate([5, 6], Sampler(), 1),
     f"engine my-port generate(): Generation.step_logits is float64 [1, {V}]; expected float32 [N, V] = [*, {V}]"),
])
def test_other_returns_named(monkeypatch: pytest.MonkeyPatch, bug: str, call: Any, expected: str) -> None:
    engine = _built(monkeypatch, bug)
    with pytest.raises(EngineContractError) as info:
        call(engine)
    assert str(info.value).startswith(expected) and "\n" not in str(info.value)


def test_wrong_type_named(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _built(monkeypatch, "")
    vars(engine)["forward"] = None  # the checks are installed once: a second install leaves them
    install_checks(engine)
    assert vars(engine)["forward"] is None

    class TupleStep(Port):
        def forward(self, prompt: Any, cache: Any | None = None, keep: int = 0, layers: bool = False) -> Step:
            step = super().forward(prompt, cache, keep, layers)
            return (step.logits, step.hidden)  # type: ignore[return-value]  # the broken port under test

    bad = _loader(monkeypatch, TupleStep).get("my-port", PIN)
    with pytest.raises(EngineContractError, match=r"^engine my-port forward\(\): returned a tuple; expected "
                       r"oracles.engines.types.Step$"):
        bad.forward([1])


def test_good_returns_pass_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Positive control: the checked calls give the very objects the engine's own give, every method."""
    engine = _built(monkeypatch, "")
    plain = Port(SMOL, load_pin(PIN))
    step = engine.forward([5, 6, 7], keep=2)
    want = plain.forward([5, 6, 7], keep=2)
    assert step.logits.shape == (2, V) and np.array_equal(step.logits, want.logits)
    caches = [engine.make_cache(), engine.make_cache()]
    for lane, cache in enumerate(caches):
        engine.forward([lane + 1], cache, keep=1)
    assert engine.decode_cohort([3, 4], caches).logits.shape == (2, V)
    assert engine.lm_head(step.hidden).shape == (2, V) and engine.generate([5], Sampler(), 1).tokens
    assert type(engine) is Port and "forward" not in vars(plain)


# -- item 4: a canary refusal names the engine's own tokenizer where it is not a library one ---------------

class MergingTokenizer(DryTokenizer):
    """Encodes "\\n\\n" as one "\\n": the trial's badtok switch."""

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.light.encode(text.replace("\n\n", "\n"))


def test_canary_blames_the_engines_own_tokenizer() -> None:
    line = canary_disagreement(MergingTokenizer(SMOL), SMOL, "my-port", PIN)
    assert line is not None and "\n" not in line
    assert line.endswith("so the recorded token ids are not what this engine would feed its model; the engine's own "
                         "tokenizer (test_engine_contract_dry.MergingTokenizer, not a transformers or mlx-lm one) is "
                         "the likely fault: compare its encode(text, add_special_tokens=False) with "
                         "tokenizers.Tokenizer.from_file over that tokenizer.json; else the pin's tokenizer files are "
                         "not its model's own")
    assert "config.json's model_type" not in line


def test_canary_keeps_the_transformers_hint_for_a_library_tokenizer() -> None:
    library = type("Qwen2Tokenizer", (MergingTokenizer,), {"__module__": "transformers.models.qwen2.tokenization_qwen2"})
    line = canary_disagreement(library(SMOL), SMOL, "torch", PIN)
    assert line is not None and "its tokenizer (transformers Qwen2Tokenizer)" in line
    assert line.endswith("the tokenizer class the engine picks (from config.json's model_type and "
                         "tokenizer_config.json's tokenizer_class) does not match these tokenizer files: pin a "
                         "snapshot whose tokenizer files are its model's own")
