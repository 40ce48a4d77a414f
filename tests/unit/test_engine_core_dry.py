"""The engine's core members are abstract, and engines are built with the loaded Pin (dry: no torch, no mlx).

An engine that set only the model facts used to pass the contract and skip every check (a run whose
port ran nothing said ``all_ok``); it is now refused at load in one line, before it is built.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from cohort_fake import DryTokenizer, FakeEngine, fake_pin

import oracles.engines as registry
from oracles.engines import BUILTIN, engine_class
from oracles.engines.base import CORE_METHODS, Engine, Step
from oracles.engines.contract import abstract_refusal
from oracles.faults.port import FaultPort
from oracles.pins.pin import Pin, load_pin
from oracles.plugin.fixtures import EngineLoader, PinCache

pytestmark = pytest.mark.dry

SMOL = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
PIN = "smollm2-135m-instruct"


class Facts(Engine):
    """The vacuous port: the model facts and a tokenizer, nothing it could run."""

    id = "facts"
    loads = 0

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        type(self).loads += 1
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = 49152, 576, 30, 8192
        self.eos_token_ids, self.tokenizer = frozenset({2}), DryTokenizer(root)


class ForwardOnly(Facts):
    id = "forward-only"

    def forward(self, prompt: Any, cache: Any | None = None, keep: int = 0, layers: bool = False) -> Step:
        raise NotImplementedError


class Whole(ForwardOnly):
    """Positive control: the facts and every core method."""

    id = "whole"

    def make_cache(self) -> Any:
        return []

    def cache_length(self, cache: Any) -> int:
        return 0


def _loader(monkeypatch: pytest.MonkeyPatch, cls: Any, pins: PinCache | None = None) -> EngineLoader:
    monkeypatch.setattr(registry, "unavailable_reason", lambda _e: None)
    monkeypatch.setattr(registry, "engine_class", lambda _e: cls)
    return EngineLoader(lambda _pin: SMOL, 0, lambda _e: {}, lambda *_a, **_k: None, pins)


def _refusal(loader: EngineLoader, engine_id: str) -> str:
    with pytest.raises(pytest.fail.Exception) as info:
        loader.get(engine_id, PIN)
    assert info.value.pytrace is False
    return str(info.value)


def test_engine_with_only_model_facts_is_refused_at_load_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    Facts.loads = 0
    loader = _loader(monkeypatch, Facts)
    line = _refusal(loader, "facts")
    assert line == (f"engine facts cannot load pin {PIN}: test_engine_core_dry.Facts breaks the engine contract: "
                    "forward, make_cache, cache_length not implemented (oracles.engines.base.Engine requires the "
                    "methods forward, make_cache, cache_length of every engine); tried once per run")
    assert _refusal(loader, "facts") == line and Facts.loads == 0  # refused before it is built, once


def test_each_missing_core_method_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    line = _refusal(_loader(monkeypatch, ForwardOnly), "forward-only")
    assert "ForwardOnly breaks the engine contract: make_cache, cache_length not implemented (" in line


def test_engine_with_every_core_method_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _loader(monkeypatch, Whole).get("whole", PIN)
    assert type(engine) is Whole and abstract_refusal(Whole) is None


def test_core_methods_are_the_abstract_ones() -> None:
    assert set(CORE_METHODS) == set(Engine.__abstractmethods__)
    with pytest.raises(TypeError):
        Facts(SMOL, load_pin(PIN))  # type: ignore[abstract]  # what the loader's refusal stands in front of


def test_every_builtin_and_fault_engine_implements_the_core() -> None:
    """Every built-in adapter (its module imported, its framework not) and the fault port can be built."""
    before = {m: m in sys.modules for m in ("torch", "mlx.core", "transformers")}
    for engine_id in BUILTIN:
        assert abstract_refusal(engine_class(engine_id)) is None, engine_id
    assert abstract_refusal(FaultPort) is None and abstract_refusal(FakeEngine) is None
    assert {m: m in sys.modules for m in before} == before


# -- engines receive the loaded Pin ---------------------------------------------------------------------------

def test_engine_keeps_the_pin_and_its_name() -> None:
    pin = fake_pin("tiny")
    engine = Whole(SMOL, pin)
    assert engine.pin_file is pin and engine.pin == "tiny" and engine.root == SMOL


def test_engine_built_with_a_pin_name_is_refused_naming_the_class() -> None:
    with pytest.raises(TypeError) as err:
        Whole(SMOL, PIN)  # type: ignore[arg-type]  # the old signature, under test
    assert str(err.value) == ("test_engine_core_dry.Whole(root, pin, threads): pin is a str 'smollm2-135m-instruct'; "
                              "an engine is built with the loaded oracles.pins.pin.Pin (oracles.pins.pin.load_pin(name))")


def test_loader_reads_a_pin_once_for_every_engine_on_it(monkeypatch: pytest.MonkeyPatch) -> None:
    reads: list[str] = []

    def load(name: str) -> Pin:
        reads.append(name)
        return load_pin(name)

    pins = PinCache(load)
    loader = _loader(monkeypatch, Whole, pins)
    first = loader.get("whole", PIN)
    monkeypatch.setattr(registry, "engine_class", lambda _e: type("Other", (Whole,), {"id": "other"}))
    second = loader.get("other", PIN)
    assert first is not second and first.pin_file is second.pin_file is pins(PIN)
    assert reads == [PIN]


def test_pin_cache_keeps_nothing_of_a_pin_that_did_not_load() -> None:
    from oracles.errors import PinError

    pins = PinCache()
    for _ in range(2):
        with pytest.raises(PinError, match="unknown pin 'no-such-pin'"):
            pins("no-such-pin")
    assert pins.loaded == {}
