"""The q8_1 band's activation rounding (oracles.engines.torch.activations), worked by hand from ggml's format."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.engines.torch.activations import install_q8_activations, quantize_q8_blocks


@pytest.fixture
def torch() -> Any:
    """torch, imported by the test that runs (``pytest -m dry`` collects this module without it)."""
    return pytest.importorskip("torch")


def test_a_constant_block_keeps_127_steps_of_a_float16_scale(torch: Any) -> None:
    # amax 1.0: q = 127 for every value; d = float16(1/127) = 0.0078735... (float16 rounds 0.00787402 down)
    got = quantize_q8_blocks(torch.ones(1, 32)).numpy()
    d16 = float(np.float16(1.0 / 127.0))
    assert d16 == pytest.approx(0.00787353515625)
    assert np.all(got == np.float32(127 * d16)), got[0, :4]


def test_each_block_has_its_own_scale_and_rounds_to_nearest_even(torch: Any) -> None:
    x = torch.zeros(1, 64)
    x[0, 0], x[0, 1], x[0, 2] = 127.0, 0.5, 1.5   # block 0: amax 127 -> id 1, 0.5 -> 0 and 1.5 -> 2 (half to even)
    x[0, 32], x[0, 33] = -2.0, 1.0                  # block 1: amax 2 -> id 63.5; 1.0 -> 63.5 -> 64 (even)
    got = quantize_q8_blocks(x).numpy()[0]
    assert got[0] == 127.0 and got[1] == 0.0 and got[2] == 2.0
    d1 = float(np.float16(2.0 / 127.0))
    assert got[32] == np.float32(-127 * d1) and got[33] == np.float32(64 * d1)
    assert np.count_nonzero(got[3:32]) == 0 and np.count_nonzero(got[34:]) == 0


def test_a_row_that_is_not_whole_blocks_is_refused(torch: Any) -> None:
    with pytest.raises(ValueError, match="not a multiple of 32"):
        quantize_q8_blocks(torch.ones(2, 48))


def test_every_linear_input_is_rounded_and_a_model_without_one_is_refused(torch: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 32, bias=False), torch.nn.ReLU(), torch.nn.Linear(32, 4, bias=False))
    x = torch.randn(3, 32)
    plain = model(x)
    assert install_q8_activations(model) == 2
    rounded = model(x)
    # positive control: the rounding moves the output (the band is not zero), by about 1/254 of a block's range
    assert 0 < float((rounded - plain).abs().max().detach()) < 0.1
    expected = model[2](quantize_q8_blocks(torch.relu(model[0](quantize_q8_blocks(x)))))
    # the hooked layers compute the same: expected re-applies the hooks' rounding (idempotent on rounded input)
    assert torch.equal(rounded, expected)
    with pytest.raises(ValueError, match="no torch.nn.Linear"):
        install_q8_activations(torch.nn.ReLU())
