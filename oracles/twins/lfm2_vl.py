"""The d1 twin: a tiny seeded LFM2-VL model that mlx-vlm loads as its d1 decision model (pin
``lfm2-vl-d1-twin``, source ``twin:lfm2-vl-d1#SEED``).

Built from transformers' own ``Lfm2VlConfig`` and ``Lfm2VlForConditionalGeneration``:

* text (``Lfm2Config``): hidden 64 with ``block_dim`` 64 (mlx-vlm sizes its feed-forward from
  ``block_dim``, default 1024, which transformers does not write unless given), ``intermediate_size``
  192 with ``block_multiple_of`` 32 (both libraries adjust it to 2/3, rounded up to a multiple: 128),
  layers ``[conv, full_attention, conv, full_attention]``, 4 heads / 2 KV heads, ``conv_L_cache`` 3,
  tied embeddings, SmolLM2's vocabulary plus the LFM2-VL special tokens;
* vision (``Siglip2VisionConfig``): hidden 32, 2 layers, 2 heads, patch 16, ``num_patches`` 64 (an
  8 x 8 position grid resampled to each image), ``vision_use_head=False``;
* projector: ``projector_hidden_size`` 64, ``downsample_factor`` 2 (a pixel-unshuffle of 2 x 2 patches:
  one image token covers 32 x 32 pixels).

Weights: the class's own initialiser under ``torch.manual_seed(SEED)`` with the text
``initializer_range`` raised to :data:`INITIALIZER_RANGE` (the hybrid twin's reason, measured there:
at 0.02 a 4-layer model's read-outs are all near ties and an answer says nothing).

Tokenizer: SmolLM2-135M-Instruct's ``tokenizer.json`` (the default pin's, copied byte for byte and
extended with the ``tokenizers`` library) with :data:`ADDED_TOKENS` appended as special tokens
(``<|startoftext|>`` the BOS; ``<image>``, ``<|image_start|>``, ``<|image_end|>``,
``<|img_thumbnail|>`` and ``<|img_row_R_col_C|>`` for R, C in 1..10, LFM2-VL's tile marks), and an
LFM2-VL style chat template (:data:`CHAT_TEMPLATE`: BOS, ChatML turns, ``<image>`` where a content item
is an image).

``config.json`` keeps ``model_type`` ``lfm2_vl`` (transformers' class) and carries
``"auto_map": {"AutoModel": "modeling_d1.D1Model"}`` as LiquidAI's d1 checkpoints do: that key is
what mlx-vlm 0.7.10 reads to load the weights as its d1 model (``mlx_vlm.utils``: an ``lfm2_vl``
config whose ``AutoModel`` ends in ``D1Model``). No ``modeling_d1.py`` ships: transformers never reads
``auto_map`` unless asked for remote code, which the reference never is (it builds
``Lfm2VlForConditionalGeneration`` itself). The other key mlx-vlm reads, ``model_type`` ``d1``, is not
transformers' (measured: ``AutoConfig`` refuses an unknown architecture, the explicit class loads it
with a type-mismatch warning), so the twin carries ``auto_map`` and neither library needs a translation
(:mod:`oracles.engines.mlx.d1` records none; the suite checks that without ``auto_map`` mlx-vlm's
decision API refuses).

``preprocessor_config.json``: transformers' ``Lfm2VlImageProcessor`` defaults (tiles 2..10 of 512,
64..256 image tokens, thumbnail), mean = std = 0.5 and ``resample`` 3 (bicubic) as LFM2-VL-450M ships.

torch, transformers and tokenizers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.twins import save_snapshot, write_json

INITIALIZER_RANGE = 0.1
#: SmolLM2's vocabulary (ids 0..49151); the added tokens follow in this order.
BASE_VOCAB = 49152
TILE_MARKS = tuple(f"<|img_row_{r}_col_{c}|>" for r in range(1, 11) for c in range(1, 11))
ADDED_TOKENS = ("<|startoftext|>", "<image>", "<|image_start|>", "<|image_end|>", "<|img_thumbnail|>", *TILE_MARKS)
BOS_ID, IMAGE_ID = BASE_VOCAB, BASE_VOCAB + 1
VOCAB_SIZE = BASE_VOCAB + len(ADDED_TOKENS)
#: SmolLM2's ``<|im_end|>`` (id 2): the end of a turn.
EOS_ID = PAD_ID = 2
LAYER_TYPES = ["conv", "full_attention", "conv", "full_attention"]
TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE, "hidden_size": 64, "block_dim": 64, "intermediate_size": 192, "block_multiple_of": 32,
    "num_hidden_layers": len(LAYER_TYPES), "layer_types": LAYER_TYPES, "num_attention_heads": 4,
    "num_key_value_heads": 2, "conv_L_cache": 3, "max_position_embeddings": 8192, "norm_eps": 1e-5,
    "initializer_range": INITIALIZER_RANGE, "tie_word_embeddings": True, "bos_token_id": BOS_ID,
    "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
}
VISION_CONFIG: dict[str, Any] = {
    "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "patch_size": 16,
    "num_patches": 64, "vision_use_head": False,
}
#: LFM2-VL's turn layout: BOS, ChatML turns, ``<image>`` for an image content item.
CHAT_TEMPLATE = (
    "{{- bos_token -}}{%- for message in messages -%}{{- '<|im_start|>' + message['role'] + '\\n' -}}"
    "{%- if message['content'] is string -%}{{- message['content'] -}}{%- else -%}"
    "{%- for item in message['content'] -%}{%- if item['type'] == 'image' -%}{{- '<image>' -}}"
    "{%- elif item['type'] == 'text' -%}{{- item['text'] -}}{%- endif -%}{%- endfor -%}{%- endif -%}"
    "{{- '<|im_end|>\\n' -}}{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)
PREPROCESSOR: dict[str, Any] = {
    "image_processor_type": "Lfm2VlImageProcessor", "processor_class": "Lfm2VlProcessor", "downsample_factor": 2,
    "do_image_splitting": True, "min_tiles": 2, "max_tiles": 10, "use_thumbnail": True, "min_image_tokens": 64,
    "max_image_tokens": 256, "encoder_patch_size": 16, "tile_size": 512, "max_pixels_tolerance": 2.0,
    "do_resize": True, "resample": 3, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "do_pad": True,
}
AUTO_MAP = {"AutoModel": "modeling_d1.D1Model"}


def write_tokenizer(tokenizer_root: Path, out: Path) -> None:
    """SmolLM2's tokenizer from ``tokenizer_root`` with :data:`ADDED_TOKENS` appended, its config and
    :data:`CHAT_TEMPLATE`, into ``out``.

    Raises:
        AssertionError: the added tokens did not land on ids ``BASE_VOCAB..`` in order.
    """
    from tokenizers import AddedToken, Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_root / "tokenizer.json"))
    if tok.get_vocab_size(with_added_tokens=True) != BASE_VOCAB:
        raise AssertionError(f"{tokenizer_root}: vocabulary {tok.get_vocab_size()} is not SmolLM2's {BASE_VOCAB}")
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ADDED_TOKENS])
    ids = [tok.token_to_id(t) for t in ADDED_TOKENS]
    if ids != list(range(BASE_VOCAB, VOCAB_SIZE)):
        raise AssertionError(f"added token ids {ids[:5]}... are not {BASE_VOCAB}..{VOCAB_SIZE - 1}")
    tok.save(str(out / "tokenizer.json"))
    write_json(out / "tokenizer_config.json", {
        "backend": "tokenizers", "tokenizer_class": "TokenizersBackend", "bos_token": ADDED_TOKENS[0],
        "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>",
        "model_max_length": TEXT_CONFIG["max_position_embeddings"], "image_token": "<image>",
        "image_start_token": "<|image_start|>", "image_end_token": "<|image_end|>",
        "image_thumbnail_token": "<|img_thumbnail|>", "processor_class": "Lfm2VlProcessor"})
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)


def build(seed: int, out: Path, tokenizer_root: Path) -> str:
    """Write the twin's snapshot into the empty folder ``out``: ``config.json`` (with :data:`AUTO_MAP`),
    ``generation_config.json``, ``model.safetensors`` (float32, sorted keys, the tied head left out),
    the tokenizer files, the chat template and ``preprocessor_config.json``. Deterministic for a fixed
    seed and library versions. Returns the model class name.

    Raises:
        FileNotFoundError: SmolLM2's ``tokenizer.json`` is missing from ``tokenizer_root``.
        AssertionError: see :func:`write_tokenizer`.
    """
    import torch
    from transformers import Lfm2VlConfig, Lfm2VlForConditionalGeneration

    write_tokenizer(tokenizer_root, out)
    config = Lfm2VlConfig(text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG), image_token_id=IMAGE_ID,
                          projector_hidden_size=64, downsample_factor=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    model = Lfm2VlForConditionalGeneration(config).float().eval()
    name = save_snapshot(model, out, {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID},
                         tied=True, config_extra={"auto_map": AUTO_MAP, "eos_token_id": EOS_ID})
    write_json(out / "preprocessor_config.json", PREPROCESSOR)
    return name
