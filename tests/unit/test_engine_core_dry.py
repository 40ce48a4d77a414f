"""Engines are built with the loaded Pin, and a pin is read once for every engine on it (dry: no torch,
no mlx)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cohort_fake import DryTokenizer, fake_pin

import oracles.engines as registry
from oracles.engines.base import Engine, Step
from oracles.pins.pin import Pin, load_pin
from oracles.plugin.fixtures import EngineLoader, PinCache

pytestmark = pytest.mark.dry

SMOL = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
PIN = "smollm2-135m-instruct"


class Whole(Engine):
    """The model facts, a tokenizer and the core methods."""

    id = "whole"

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = 49152, 576, 30, 8192
        self.eos_token_ids, self.tokenizer = frozenset({2}), DryTokenizer(root)

    def forward(self, prompt: Any, cache: Any | None = None, keep: int = 0, layers: bool = False) -> Step:
        raise NotImplementedError

    def make_cache(self) -> Any:
        return []

    def cache_length(self, cache: Any) -> int:
        return 0


def _loader(monkeypatch: pytest.MonkeyPatch, cls: Any, pins: PinCache | None = None) -> EngineLoader:
    monkeypatch.setattr(registry, "unavailable_reason", lambda _e: None)
    monkeypatch.setattr(registry, "engine_class", lambda _e: cls)
    return EngineLoader(lambda _pin: SMOL, 0, lambda _e: {}, lambda *_a, **_k: None, pins)


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
