"""The cohort family's compressed-cache span (DeepSeek-V4): the spec that crosses compression
boundaries, the entry counting and its positive control (a span in which no entry closes is named),
and the spec chosen by model class. No weights, no torch."""

from __future__ import annotations

import numpy as np
import pytest

from oracles.families.cohort import run as fam

pytestmark = pytest.mark.dry


def test_compressed_spec_crosses_both_rates() -> None:
    """The DeepSeek-V4 proof's shape: 4 lanes of 148, 132 steps, so the span's positions cross multiples
    of 4 (CSA) and 256 = 2 x 128 (HCA), and the anchor 384 = 3 x 128 is past the span."""
    spec = fam.COMPRESSED
    spec.check(49152)
    first, last = spec.prefix[0], spec.prefix[0] + spec.steps  # lengths after prefill and after the span
    assert spec.prefix == (148,) * fam.LANES and spec.steps == 132
    assert last // 4 - first // 4 == 33, "CSA entries closed in the span"
    assert last // 128 - first // 128 == 1, "an HCA entry must close in the span"
    assert spec.anchor % 128 == 0 and spec.anchor > last


def test_entry_counts_read_compressed_buffers_only() -> None:
    views = {"layers.0.window_kv": np.zeros((1, 1, 127, 32)), "layers.1.compressor.compressed_kv": np.zeros((1, 37, 32)),
             "layers.1.compressor.buffer_kv": np.zeros((1, 0, 64)), "layers.2.compressor.compressed_kv": np.zeros((1, 1, 32))}
    assert fam.entry_counts(views) == {"layers.1.compressor.compressed_kv": 37, "layers.2.compressor.compressed_kv": 1}
    assert fam.entry_counts({"layers.0.keys": np.zeros((1, 2, 5, 16))}) == {}


def test_uncrossed_names_a_span_that_closes_nothing() -> None:
    """Positive control: a buffer that gained no entry (the HCA layer of a span short of 256) is named."""
    before = [{"csa": 37, "hca": 1}] * 2
    assert fam.uncrossed(before, [{"csa": 70, "hca": 2}] * 2) == []
    assert fam.uncrossed(before, [{"csa": 70, "hca": 1}, {"csa": 70, "hca": 2}]) == ["lane 0 hca: 1 -> 1"]


def test_spec_follows_the_model_class() -> None:
    class Scope:
        def selects(self, *_: object) -> bool:
            return False

    assert fam.choose_spec(True, Scope(), 1 << 40, "DeepseekV4ForCausalLM") is fam.COMPRESSED
    assert fam.choose_spec(False, Scope(), 1 << 40, "LlamaForCausalLM") is fam.FULL
    assert fam.choose_spec(True, Scope(), 1 << 40, "LlamaForCausalLM") is fam.SAMPLE
