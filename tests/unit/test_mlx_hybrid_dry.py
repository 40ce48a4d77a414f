"""The MLX port's reading of a text-only Qwen3.5 config (oracles/engines/mlx/hybrid.py), without mlx:
the layer placement mlx-lm can express, the overrides recorded, and the refusal of one it cannot."""

from __future__ import annotations

import json

import pytest

from oracles.engines.mlx import hybrid as mlx_hybrid
from oracles.pins.pin import load_pin
from oracles.twins import hybrid

pytestmark = pytest.mark.dry

LIN, FULL = "linear_attention", "full_attention"


@pytest.mark.parametrize(("types", "interval"), [
    ([LIN, LIN, LIN, FULL], 4),
    ([LIN, FULL, LIN, FULL], 2),
    ([FULL, FULL], 1),
    ([LIN, LIN, LIN, FULL, LIN, LIN, LIN, FULL], 4),
    ([LIN, LIN, LIN, FULL, LIN, LIN], 4),        # a trailing partial period: mlx-lm places it the same way
    ([LIN, FULL, LIN, LIN, FULL], None),         # irregular
    ([FULL, LIN, LIN, LIN], None),               # full attention first, then none: no interval gives it
    ([LIN, LIN], None),                          # no full attention at all
])
def test_interval_of(types: list[str], interval: int | None) -> None:
    assert mlx_hybrid.interval_of(types) == interval


def test_twin_config_translates() -> None:
    """The twin's own layer types give the interval mlx-lm places full attention by."""
    config = {"model_type": "qwen3_5_text", "layer_types": hybrid.LAYER_TYPES}
    assert mlx_hybrid.overrides(config) == {"model_type": "qwen3_5", "full_attention_interval": 4}
    assert hybrid.FULL_ATTENTION_INTERVAL == 4 and hybrid.LAYER_TYPES.index(FULL) == 3


def test_irregular_placement_refused() -> None:
    config = {"model_type": "qwen3_5_text", "layer_types": [LIN, FULL, LIN, LIN, FULL]}
    why = mlx_hybrid.unsupported_reason(config)
    assert why is not None and "places full attention by full_attention_interval only" in why
    with pytest.raises(ValueError, match="is not such a placement"):
        mlx_hybrid.overrides(config)


def test_other_model_types_untouched() -> None:
    assert mlx_hybrid.overrides({"model_type": "llama"}) is None
    assert mlx_hybrid.unsupported_reason({"model_type": "llama"}) is None


def test_pin_declares_untrained() -> None:
    """The hybrid twin's pin says it is untrained (its stop-token checks skip with that reason)."""
    pin = load_pin("smollm2-hybrid-twin")
    assert pin.source == "twin:qwen35-hybrid#0" and pin.model_class == "Qwen3_5ForCausalLM"
    why = pin.untrained_reason("ending a generation with a stop token")
    assert why is not None and why.startswith("pin smollm2-hybrid-twin is untrained"), why
    assert json.loads(pin.path.read_text())["trained"] is False
