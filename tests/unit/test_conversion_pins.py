"""The built-in conversion pins as ``make materialize`` made them: a rebuild gives the pinned bytes (the
converter and the dequantisation are deterministic), and the dequantized reference is a float32 snapshot
transformers' ``LlamaForCausalLM`` loads whole, holding the 4-bit pin's own weights.

Slow: one rebuild of ``smollm2-mlx-q4`` (mlx_lm.convert, ~5 s) and of ``smollm2-mlx-q4-dequant``
(mx.dequantize, ~3 s), each after verifying its source (hashing the 538 MB default snapshot); the bf16 and
8-bit conversions were each rebuilt once by hand to the same digests (stated in docs/pins.md), not here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from oracles.pins.pin import load_pin

BUILD = """
import json, sys
from pathlib import Path
from oracles.pins.materialize import materialize
from oracles.pins.pin import load_pin
print(json.dumps(materialize(load_pin(sys.argv[1]), Path(sys.argv[2]))))
"""


@pytest.mark.slow
@pytest.mark.parametrize("name", ["smollm2-mlx-q4", "smollm2-mlx-q4-dequant"])
def test_conversion_rebuilds_to_the_pinned_digests(tmp_path: Path, name: str,
                                                   verified_snapshot: Callable[[str], Path]) -> None:
    pytest.importorskip("mlx_lm")
    verified_snapshot(name)  # the first build: make materialize's
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # as the Makefile builds
    done = subprocess.run([sys.executable, "-c", BUILD, name, str(tmp_path / "two")], env=env, text=True,
                          capture_output=True, timeout=600)
    # materialize verifies the build against the pin: a differing file is a PinError naming both digests
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "no output"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["built"] and result["digest"] == load_pin(name).digest, result


def _unpack4(words: np.ndarray) -> np.ndarray:
    """uint32 [out, in/8] -> [out, in]: ``mlx.core.quantize``'s 4-bit layout, least significant nibble first."""
    shifts = np.arange(8, dtype=np.uint32) * 4
    return ((words[..., None] >> shifts) & 0xF).reshape(words.shape[0], -1)


@pytest.mark.slow
def test_dequantized_reference_loads_in_transformers_with_the_quantized_weights(
        verified_snapshot: Callable[[str], Path]) -> None:
    """No key missing or unexpected, float32, the head tied to the embedding, and the embedding the 4-bit
    pin's packed one dequantized by hand (scale * q + bias per group of 64, to 1 ulp: mlx's rounding)."""
    pytest.importorskip("transformers")
    import torch
    from safetensors.numpy import load_file
    from transformers import LlamaForCausalLM

    deq, q4 = verified_snapshot("smollm2-mlx-q4-dequant"), verified_snapshot("smollm2-mlx-q4")
    loaded: Any = LlamaForCausalLM.from_pretrained(deq, dtype=torch.float32, output_loading_info=True)
    model, info = loaded  # (model, {"missing_keys": [...], "unexpected_keys": [...], ...})
    assert {k: v for k, v in info.items() if v} == {}, info
    embed = model.model.embed_tokens.weight.detach().numpy()
    assert embed.dtype == np.float32 and model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    packed = load_file(str(q4 / "model.safetensors"))
    groups = np.arange(embed.shape[1]) // 64
    scaled = packed["model.embed_tokens.scales"][:, groups] * _unpack4(packed["model.embed_tokens.weight"]).astype(np.float32)
    bias = packed["model.embed_tokens.biases"][:, groups]
    want = scaled + bias
    # mlx may fuse scale * q + bias into one rounding where numpy rounds twice: 1 ulp of the larger addend
    bound = np.spacing(np.maximum(np.abs(scaled), np.abs(bias)))
    assert want.dtype == np.float32 and (np.abs(embed - want) <= bound).all(), float(np.abs(embed - want).max())
    with torch.no_grad():
        logits = model(torch.tensor([[1, 2, 3, 4]])).logits
    assert torch.isfinite(logits).all()
