"""The DeepSeek-V4 twin: a rebuild is byte-identical to the pin, a reload is bit-exact, the seeded hash
tables route each token to distinct experts, and the issue's figures re-measured (parameters, a
148-token prefill and a decode step on one thread; recorded, never asserted as times).

Slow: one build (~3 s) and one load of the 28 MB twin in transformers.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Callable

import pytest

from oracles.pins.pin import load_pin
from oracles.receipts.table import Receipt
from oracles.twins import deepseek_v4

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("unit-deepseek-v4-twin")]
PIN = "deepseek-v4-twin"


def test_rebuild_is_byte_identical(tmp_path: Path, verified_snapshot: Callable[[str], Path]) -> None:
    """``build(0, ...)`` again gives every file of the pin with its pinned sha256 (the session verified
    its own snapshot against the same digests)."""
    pin = load_pin(PIN)
    lender = verified_snapshot("smollm2-135m-instruct")
    verified_snapshot(PIN)
    assert deepseek_v4.build(0, tmp_path, lender) == "DeepseekV4ForCausalLM"
    built = sorted(p.name for p in tmp_path.iterdir())
    assert built == sorted(pin.files), f"built {built}, the pin lists {sorted(pin.files)}"
    for name, f in pin.files.items():
        got = hashlib.sha256((tmp_path / name).read_bytes()).hexdigest()
        assert got == f.sha256, f"{name}: rebuilt sha256 {got}, pinned {f.sha256}"


def test_reload_is_bit_exact(verified_snapshot: Callable[[str], Path], receipt: Receipt) -> None:
    """transformers loads the snapshot with every tensor bit-equal to the file (nothing re-initialised,
    the tid2eid tables kept), each token's hash experts distinct; the issue's figures recorded."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    root = verified_snapshot(PIN)
    saved = load_file(str(root / "model.safetensors"))
    model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.float32).eval()
    state = model.state_dict()
    assert sorted(state) == sorted(saved), f"loaded {len(state)} tensors, the file holds {len(saved)}"
    differ = [k for k, v in saved.items() if not torch.equal(state[k], v)]
    assert not differ, f"reloaded tensors differ from the file: {differ[:5]}"
    tables = [v for k, v in saved.items() if k.endswith("tid2eid")]
    assert len(tables) == deepseek_v4.MLP_LAYER_TYPES.count("hash_moe")
    for t in tables:
        assert bool((t[:, 0] != t[:, 1]).all()) and int(t.max()) < 4, "a token routed twice to one expert"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.inference_mode():
            ids = torch.tensor([[(r * 97 + 11) % model.config.vocab_size for r in range(148)]])
            t0 = time.perf_counter()
            out = model(input_ids=ids, use_cache=True)
            prefill = time.perf_counter() - t0
            t0 = time.perf_counter()
            model(input_ids=ids[:, :1], cache=out.past_key_values, use_cache=True)
            step = time.perf_counter() - t0
    finally:
        torch.set_num_threads(threads)
    receipt.update(parameters=sum(p.numel() for p in model.parameters()), prefill_148_s=prefill, decode_step_s=step,
                   layer_types=model.config.layer_types, index_n_heads=model.config.index_n_heads)
