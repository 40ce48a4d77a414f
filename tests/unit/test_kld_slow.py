"""The graded figures on SmolLM2: the torch reference against itself (exactly 0), against the same
model run in bfloat16 by transformers (the positive control: a nonzero figure of the order the issue
measured by hand, KL mean 1.1e-3 on 224 positions), and against its own --kl-divergence-base file.

Slow: loads SmolLM2 twice (float32 and bfloat16) and runs ten forwards of 512 tokens (110 s on this
loaded 2-core machine).
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, Sequence

import pytest

from oracles.families import DEFAULT_PIN
from oracles.families.graded.corpus import corpus_for, sample_chunks
from oracles.families.graded.kld_file import read_base
from oracles.families.graded.run import against_base, export_base, figures, graded

pytestmark = pytest.mark.slow

#: Two chunks of the 15: the first and the last (510 scored positions).
CHUNKS = 2


class TorchBf16:
    """SmolLM2 loaded by transformers in bfloat16: ``forward(ids).logits`` as float32 ``[T, V]``."""

    def __init__(self, root: Path, tokenizer: Any) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch, self.tokenizer = torch, tokenizer
        self.model = AutoModelForCausalLM.from_pretrained(root, dtype=torch.bfloat16).eval()

    def forward(self, ids: Sequence[int]) -> Any:
        with self.torch.no_grad():
            logits = self.model(self.torch.tensor([list(ids)])).logits[0]
        return SimpleNamespace(logits=logits.float().numpy())


@pytest.fixture(scope="module")
def reference(engines: Any) -> Any:
    return engines("torch", DEFAULT_PIN)


def test_reference_against_itself_and_bfloat16(reference: Any, verified_snapshot: Any) -> None:
    corpus = corpus_for(reference.tokenizer)
    chunks = sample_chunks(corpus.n_chunk, CHUNKS)
    same = graded(reference, reference, corpus, chunks)["pooled"]
    assert same["kld"]["max"] == 0.0 and same["same_top_p"]["value"] == 1.0 and same["delta_p"]["rms"] == 0.0
    bf16 = graded(reference, TorchBf16(verified_snapshot(DEFAULT_PIN), reference.tokenizer), corpus, chunks)["pooled"]
    # the issue measured KL mean 1.1e-3 and top-1 96.9 % for torch bf16 by hand; a tenth and ten times
    # that bracket it with room for another text, and exclude both 0 and a broken model (KL ~ 1)
    assert 1e-4 < bf16["kld"]["mean"] < 1e-2, bf16["kld"]
    assert 0.8 < bf16["same_top_p"]["value"] < 1.0 and bf16["delta_p"]["rms"] > 1e-3
    assert bf16["count"] == CHUNKS * corpus.scored


def test_reference_against_its_own_base_file(reference: Any, tmp_path: Path) -> None:
    corpus = corpus_for(reference.tokenizer)
    path = tmp_path / "smollm2.kld"
    facts = export_base(reference, corpus, path, chunks=1)
    base = read_base(path, n_vocab=49152, n_ctx=512)
    assert facts["bytes"] == path.stat().st_size == 20 + 4 * 512 + 2 * 255 * (49152 + 4)
    own = figures(against_base(reference, base))["pooled"]
    # only the 2-byte quantisation separates them: |KL| <= half a step, (16/65535)/2 = 1.22e-4 nats,
    # times e^1.22e-4, plus float32 rounding of the dequantised values (1e-6): 1.3e-4
    assert max(own["kld"]["max"], -own["kld"]["min"]) < 1.3e-4, own["kld"]
    assert own["same_top_p"]["value"] > 0.99  # a near tie may flip within one quantisation step
