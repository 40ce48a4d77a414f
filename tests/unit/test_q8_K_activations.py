"""The K-quants' activation rounding (``block_q8_K``) and the per-Linear plan of a mixed GGUF
(oracles.engines.torch.activations), against ggml-quants.c's ``quantize_row_q8_K_ref`` transcribed loop by loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from oracles.engines.torch.activations import install_q8_activations, quantize_q8_K_blocks


@pytest.fixture
def torch() -> Any:
    """torch, imported by the test that runs (``pytest -m dry`` collects this module without it)."""
    return pytest.importorskip("torch")


def ggml_q8_K(x: np.ndarray) -> np.ndarray:
    """``quantize_row_q8_K_ref`` then the value each int8 stands for (``q * d``), one block of 256 at a time,
    in float32 as the C code computes it (``nearest_int``: round half to even)."""
    out = np.empty_like(x, dtype=np.float32)
    for b in range(0, x.size, 256):
        block = x[b:b + 256].astype(np.float32)
        amax, peak = np.float32(0), np.float32(0)
        for v in block:  # the first value of the largest magnitude (a strict ">")
            if abs(v) > amax:
                amax, peak = np.float32(abs(v)), v
        if amax == 0:
            out[b:b + 256] = 0
            continue
        iscale = np.float32(-127.0) / peak
        q = np.minimum(np.rint(iscale * block), 127).astype(np.float32)
        out[b:b + 256] = q * (np.float32(1) / iscale)
    return out


def test_q8_K_rounds_as_ggml_does_block_by_block(torch: Any) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(1024).astype(np.float32) * np.repeat(np.array([1, 1e-3, 30, 0.5], dtype=np.float32), 256)
    x[300], x[301] = -7.0, 7.0   # equal extremes of opposite signs: the first one sets the scale's sign
    x[512:768] = 0.0             # an all-zero block stays zero
    got = quantize_q8_K_blocks(torch.from_numpy(x.reshape(2, 512))).numpy().reshape(-1)
    want = ggml_q8_K(x)
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:5]
    assert not np.array_equal(got, x)  # positive control: the rounding moves values
    with pytest.raises(ValueError, match="not a multiple of 256"):
        quantize_q8_K_blocks(torch.ones(1, 288))


def test_a_plan_rounds_each_linear_its_own_way(torch: Any) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False), torch.nn.Linear(256, 4, bias=False))
    x = torch.randn(2, 256)
    plain = model(x)
    assert install_q8_activations(model, plan={"0": "float32", "1": "q8_K"}) == 1
    got = model(x)
    want = torch.nn.functional.linear(quantize_q8_K_blocks(model[0].forward(x)), model[1].weight)
    assert torch.equal(got, want)  # the hook: the second Linear's input only
    assert not torch.equal(got, plain)  # positive control: the plan's rounding moves the output
    with pytest.raises(ValueError, match=r"Linear '0' has rounding None"):
        install_q8_activations(torch.nn.Sequential(torch.nn.Linear(256, 4, bias=False)), plan={"1": "q8_K"})
