"""The torch reference on decoders whose final norm is not named ``norm``: a Phi decoder
(``final_layernorm``) gets every hook the reference promises, checked against the model's own plain
forward; an OPT decoder (learned positions after ``embed_tokens``, ``final_layer_norm``) is refused in
one line naming pin, class and why. Seeded random tiny models with SmolLM2's tokenizer files.

Slow: imports torch and transformers (a few seconds); each model has two 64-wide layers.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cohort_fake import fake_pin

from oracles.errors import OracleError

pytestmark = pytest.mark.slow

SMOL = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
IDS = [1, 9690, 198, 19556, 905, 17, 2, 198, 216, 33, 34]


def _save(tmp: Path, model: Any) -> Path:
    model.eval().save_pretrained(tmp)
    for f in SMOL.iterdir():
        shutil.copy(f, tmp)
    return tmp


@pytest.fixture(scope="module")
def phi(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import torch
    from transformers import PhiConfig, PhiForCausalLM

    from oracles.engines.torch.reference import TorchReference

    torch.manual_seed(0)
    cfg = PhiConfig(vocab_size=49152, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    return TorchReference(_save(tmp_path_factory.mktemp("tiny-phi"), PhiForCausalLM(cfg)), fake_pin("tiny-phi"), threads=1)


def test_phi_final_layernorm_is_hooked(phi: Any) -> None:
    """The head re-run of the captured hidden states gives the logits; the final norm of the last layer's
    stream gives the hidden states; a hooked run equals the plain forward; the stream has L + 1 rows."""
    step = phi.forward(IDS, layers=True)
    assert step.layers is not None and step.layers.shape == (phi.num_layers + 1, len(IDS), phi.hidden_size)
    assert np.array_equal(phi.lm_head(step.hidden), step.logits)
    assert np.array_equal(phi.final_norm(step.layers[-1]), step.hidden)
    assert np.array_equal(phi.plain_logits(IDS), step.logits)
    embed = phi._decoder.embed_tokens.weight.detach().numpy()[IDS]
    assert np.array_equal(step.layers[0], embed)  # the stream entering layer 0 is the token embedding


def test_phi_cache_continues_the_prefill(phi: Any) -> None:
    cache = phi.make_cache()
    phi.forward(IDS[:-3], cache)
    tail = phi.forward(IDS[-3:], cache)
    np.testing.assert_allclose(tail.logits, phi.forward(IDS).logits[-3:], atol=1e-4)


def test_opt_is_refused_in_one_line(tmp_path: Path) -> None:
    import torch
    from transformers import OPTConfig, OPTForCausalLM

    from oracles.engines.torch.reference import TorchReference

    torch.manual_seed(0)
    cfg = OPTConfig(vocab_size=49152, hidden_size=64, ffn_dim=128, num_hidden_layers=2, word_embed_proj_dim=64,
                    num_attention_heads=4, max_position_embeddings=512, bos_token_id=1, eos_token_id=2)
    with pytest.raises(OracleError) as info:
        TorchReference(_save(tmp_path, OPTForCausalLM(cfg)), fake_pin("tiny-opt"), threads=1)
    assert str(info.value) == ("the torch reference cannot hook pin tiny-opt (OPTForCausalLM, decoder OPTDecoder): it "
                               "adds learned position embeddings (embed_positions) after embed_tokens, so the "
                               "embedding tap would not be the residual stream entering layer 0")
