"""The MTP twin: a tiny seeded Inkling (``InklingForConditionalGeneration``) with one multi-token-
prediction layer, sharing SmolLM2's tokenizer (``mtp-twin``, source ``twin:inkling-mtp#SEED``).

Why Inkling. It is the architecture whose MTP layer both libraries run (probed on transformers 5.24
and mlx-vlm 0.7.10): transformers' generic ``MtpModel`` / ``MtpCache`` / ``generate(use_mtp=True)``
and mlx-vlm's ``inkling_mtp`` drafter with ``mlx_vlm/speculative/mtp.py``. transformers refuses
``use_mtp`` for stateful models (Qwen3.5, DeepSeek-V4), and Inkling's caches, though they hold short
convolution states, are croppable under the MTP cache's past recording.

The checkpoint is written in Inkling's own layout (``model.llm.*``, ``model.visual.*``,
``model.audio.*``, ``model.mtp.layers.0.*``): the layout both libraries read. transformers' own
``revert_weight_conversion`` names the trunk's tensors; the MTP layer's decoder block is named by
the same reversal (its parameters are a trunk decoder layer's), its per-depth extras as Inkling
names them (``embed_norm``, ``hidden_norm``, ``input_proj``). The config uses Inkling's naming
(``intermediate_size`` = expert width, ``dense_intermediate_size`` = dense width), which
transformers' ``InklingTextConfig`` converts and mlx-vlm's ``TextConfig`` reads as is: the same
shapes in both libraries. A vision and an audio tower, as tiny as the classes allow, are built
because mlx-vlm's ``Model`` builds both and loads strictly (transformers' vision tower needs scipy).

Initialised by Inkling's own ``_init_weights`` on the MTP layer too: ``MtpModel``'s generic one leaves
``rel_logits_proj.proj`` and the MLP's ``global_scale`` uninitialised memory (measured: two builds of one
seed differed in that one tensor, values ~1e-43).

Built to accept drafts. With seeded random weights an MTP layer never agrees with the trunk (measured
here: 0 of 45 drafts accepted in the written-out rounds and in mlx-vlm, 0 of 23 in transformers).
The twin is pulled toward a bigram model: every residual write of the trunk and of the MTP block
(attention and MLP output projections, experts' down projections) is scaled by
:data:`RESIDUAL_SCALE`, and the MTP layer's input projection passes the next token's normed
embedding through (identity on the embedding half, the hidden half scaled by :data:`RESIDUAL_SCALE`).
The trunk then predicts mostly from the current token and the MTP layer from the next one, so a
draft is often, not always, the trunk's token (the identity pass does most of it; the scale decides
how often a draft is still rejected: figures at :data:`RESIDUAL_SCALE`). Untrained: its pin says
``"trained": false``.

torch and transformers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from oracles.twins import VOLATILE, copy_tokenizer, write_json

#: Residual-write scale (module docstring). Measured on "arith", 24 new tokens, seed 0: accepted of
#: drafted in the written-out rounds (2 drafts a round; the same on transformers and mlx-vlm), then
#: transformers' ``generate(use_mtp=True)`` (1 draft a round) and mlx-vlm's MTP path (2 a round):
#:
#:     identity pass off, scale 1.0 (the seeded weights as drawn)   0/45, 0/23, 0/45
#:     scale 1.0    12/23 rounds,  8/15 transformers, 12/23 mlx-vlm
#:     scale 0.6    14/19,        11/12,             14/19
#:     scale 0.3    15/17,        11/12,             15/17   <- chosen: accepts, and still rejects twice
#:     scale 0.2    15/16,        11/12,             15/16
#:     scale 0.1    16/16,        11/12,             16/16   (never rejects: the correction untested)
RESIDUAL_SCALE = 0.3
#: Whether the MTP input projection passes the next token's embedding through (module docstring).
IDENTITY_PASS = True

#: The text model. vocab and special ids follow SmolLM2-135M-Instruct's so every record's ids run;
#: one sliding-window and one global layer (Inkling's two attention kinds), the first MLP dense and
#: the second a 4-expert top-2 MoE with a shared expert; one MTP layer.
TEXT: dict[str, Any] = {
    "vocab_size": 49152, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 16, "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2,
    "swa_head_dim": 16, "sliding_window_size": 32, "d_rel": 4, "rel_extent": 64,
    "layer_types": ["hybrid_sliding", "hybrid"], "mlp_layer_types": ["dense", "sparse"],
    "intermediate_size": 128, "moe_intermediate_size": 32, "n_routed_experts": 4, "num_experts_per_tok": 2,
    "n_shared_experts": 1, "logits_mup_width_multiplier": 2.0, "max_position_embeddings": 8192,
    "num_mtp_layers": 1, "chain_hidden_post_norm": False, "bos_token_id": 1, "eos_token_id": 2,
    "pad_token_id": 2,
}
VISION: dict[str, Any] = {"hidden_size": 32, "num_hidden_layers": 1, "num_attention_heads": 2, "patch_size": 4}
AUDIO: dict[str, Any] = {"n_mel_bins": 8, "mel_vocab_size": 16}
#: Multimodal special ids inside the shared vocabulary (never in a text record's ids).
SPECIAL: dict[str, Any] = {"image_token_id": 49100, "audio_token_id": 49101, "image_bos_token_id": 49102,
                           "audio_bos_token_id": 49103}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
#: Residual-write projections (checkpoint-independent transformers names) scaled toward the bigram.
RESIDUAL_WRITES = ("self_attn.o_proj.weight", "mlp.down_proj.weight", "mlp.experts.down_proj")


def _config() -> Any:
    from transformers.models.inkling.configuration_inkling import InklingConfig

    hidden = TEXT["hidden_size"]
    return InklingConfig(text_config=TEXT, vision_config={**VISION, "text_hidden_size": hidden},
                         audio_config={**AUDIO, "text_hidden_size": hidden}, **SPECIAL)


def _scale_residuals(module: Any, scale: float) -> None:
    """Multiply every residual-write projection of ``module`` by ``scale`` in place."""
    for name, param in module.named_parameters():
        if name.endswith(RESIDUAL_WRITES) or ".shared_experts.down_proj" in name:
            param.data.mul_(scale)


def _mtp_tensors(model: Any, mtp: Any) -> dict[str, Any]:
    """The MTP layer's tensors under Inkling's checkpoint names (``model.mtp.layers.0.*``)."""
    from transformers.core_model_loading import revert_weight_conversion

    state = mtp.state_dict()
    block = {"model.language_model.layers.0." + k.split(".mtp_block.", 1)[1]: v
             for k, v in state.items() if k.startswith("layers.0.mtp_block.")}
    named = {k.replace("model.llm.layers.0.", "model.mtp.layers.0.transformer_block."): v
             for k, v in revert_weight_conversion(model, block).items()}
    for ours, theirs in (("enorm", "embed_norm"), ("hnorm", "hidden_norm"), ("eh_proj", "input_proj")):
        named[f"model.mtp.layers.0.{theirs}.weight"] = state[f"layers.0.{ours}.weight"]
    return named


def _config_json(model: Any) -> dict[str, Any]:
    """The config in Inkling's naming (expert width as ``intermediate_size``), volatile fields dropped."""
    cfg = model.config.to_dict()
    for sub in [cfg, *(v for k, v in cfg.items() if k.endswith("_config") and isinstance(v, dict))]:
        for volatile in VOLATILE:
            sub.pop(volatile, None)
    text = cfg["text_config"]
    text["dense_intermediate_size"] = text.pop("intermediate_size")
    text["intermediate_size"] = text.pop("moe_intermediate_size")
    text.pop("number_of_conv_states", None)  # derived by transformers, not a checkpoint field
    cfg.update({"dtype": "float32", "architectures": [type(model).__name__]})
    return cfg


def build(seed: int, out: Path, tokenizer_root: Path) -> str:
    """Write the twin's snapshot (config, generation config, float32 safetensors, tokenizer) into ``out``.

    Deterministic: the same torch and transformers versions and ``seed`` give byte-identical files.
    Returns the model class name (``InklingForConditionalGeneration``).

    Raises:
        FileNotFoundError: a tokenizer file is missing from ``tokenizer_root``.
    """
    import torch
    from safetensors.torch import save_file
    from transformers.core_model_loading import revert_weight_conversion
    from transformers.modeling_layers import MtpModel
    from transformers.models.inkling.modeling_inkling import InklingForConditionalGeneration

    torch.manual_seed(seed)
    model = InklingForConditionalGeneration(_config()).float().eval()
    mtp = MtpModel(model, TEXT["num_mtp_layers"]).float().eval()
    with torch.no_grad():
        # MtpModel's generic initialiser leaves Inkling's own parameters (the relative-logits bank,
        # the MLP's global scale) as torch.empty left them: the trunk's initialiser draws them, seeded.
        mtp.layers.apply(model._init_weights)
        _scale_residuals(model.model.language_model, RESIDUAL_SCALE)
        _scale_residuals(mtp, RESIDUAL_SCALE)
        hidden = TEXT["hidden_size"]
        proj = mtp.layers[0].eh_proj.weight  # [H, 2H]: input [hnorm(hidden), enorm(embed)] (hidden first)
        if IDENTITY_PASS:
            proj[:, :hidden].mul_(RESIDUAL_SCALE)
            proj[:, hidden:].copy_(torch.eye(hidden))
    tensors = {**revert_weight_conversion(model, dict(model.state_dict())), **_mtp_tensors(model, mtp)}
    tensors = {k: v.detach().contiguous().clone() for k, v in sorted(tensors.items())}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    write_json(out / "config.json", _config_json(model))
    write_json(out / "generation_config.json", {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2})
    copy_tokenizer(tokenizer_root, out, TOKENIZER_FILES)
    return type(model).__name__


def rebuild_to(seed: int, out: Path, tokenizer_root: Path) -> str:
    """:func:`build` into a fresh ``out`` (removed first): the byte-identical rebuild check's helper."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return build(seed, out, tokenizer_root)
