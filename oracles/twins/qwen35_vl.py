"""The vision-language twin: a tiny seeded Qwen3.5 VL model with its own small tokenizer, the clef
family's default pin (``qwen35-vl-twin``, source ``twin:qwen35-vl#SEED``).

Built from transformers' own ``Qwen3_5Config`` and ``Qwen3_5ForConditionalGeneration``:

* text: hidden 64, four decoder layers typed ``linear_attention`` x 3 then ``full_attention`` (Gated
  DeltaNet, then gated softmax attention: Qwen3.5's own ``full_attention_interval`` 4, the one rule
  mlx-vlm reads), head_dim 32 with half of it rotated (``partial_rotary_factor`` 0.5: 16 dims, 8
  frequencies) and interleaved M-RoPE sections ``[3, 3, 2]`` (the proportions of Qwen3.5's
  ``[11, 11, 10]``), untied LM head;
* vision: depth 2, hidden 32, patch 16, temporal patch 2, spatial merge 2 (a merged token covers
  32 x 32 pixels), a learned 8 x 8 position grid resampled to each image's grid, merger to 64.

Weights: the class's own initialiser under ``torch.manual_seed(SEED)`` with ``initializer_range``
0.1 (Qwen3.5's 0.02 leaves a 4-layer model's logits within ~0.1 of each other, so every read-out is
a near tie and an argmax says nothing); then every norm weight (and LayerNorm bias) is moved by a
seeded normal draw of std :data:`NORM_JITTER`: Qwen3.5's text RMSNorms scale by ``1 + w`` (w
initialised to 0), its gated RMSNorm and the vision LayerNorms by ``w`` (initialised to 1), so at
their initial values a port that applies the wrong convention (``w`` for ``1 + w``) would multiply
by 0 or 2 only on some norms; with random weights every norm's convention shows in the logits.

Tokenizer: a byte-level BPE trained here by the ``tokenizers`` library on :data:`CORPUS` (fixed
text below) to :data:`VOCAB_SIZE` ids, the special tokens first (ids 0..6: end of text, ChatML
turn marks, vision start/end, image pad, video pad), with a ChatML chat template. Training is
deterministic for a fixed corpus and library version, so building twice gives identical bytes.

The processor settings (``preprocessor_config.json``, ``video_preprocessor_config.json``): patch 16,
merge 2, temporal patch 2, mean = std = 0.5 (Qwen3-VL's), BICUBIC, and a pixel budget of
:data:`MIN_PIXELS` .. :data:`MAX_PIXELS` so the small committed images (multiples of 32 on each
side) reach the model at the size they were drawn.

torch, transformers and tokenizers are imported inside :func:`build`, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from oracles.twins import save_snapshot, write_json

#: Special tokens, in id order (0..6). The config's token ids below are their positions.
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>")
PAD_ID, IM_START_ID, EOS_ID, VISION_START_ID, VISION_END_ID, IMAGE_ID, VIDEO_ID = range(7)
#: Byte-level BPE: 256 byte symbols + 7 specials + 249 merges.
VOCAB_SIZE = 512
INITIALIZER_RANGE = 0.1
#: Std of the seeded normal draw added to every norm weight and bias (module docstring).
NORM_JITTER = 0.3
#: Pixel budget of both processors (h * w, and t * h * w for video): 32 x 32 .. 256 x 256.
MIN_PIXELS = 32 * 32
MAX_PIXELS = 256 * 256
PATCH, MERGE, TEMPORAL_PATCH = 16, 2, 2
#: Frames per second the video processors assume for pre-sampled frames (Qwen3-VL's default ``fps``).
VIDEO_FPS = 2.0
FULL_ATTENTION_INTERVAL = 4
LAYER_TYPES = ["linear_attention"] * (FULL_ATTENTION_INTERVAL - 1) + ["full_attention"]

TEXT_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": len(LAYER_TYPES),
    "layer_types": LAYER_TYPES, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
    "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 16,
    "linear_conv_kernel_dim": 4, "max_position_embeddings": 4096, "rms_norm_eps": 1e-6,
    "initializer_range": INITIALIZER_RANGE, "tie_word_embeddings": False, "eos_token_id": EOS_ID, "pad_token_id": PAD_ID,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                        "mrope_section": [3, 3, 2], "mrope_interleaved": True},
}
VISION_CONFIG: dict[str, Any] = {
    "depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": PATCH,
    "spatial_merge_size": MERGE, "temporal_patch_size": TEMPORAL_PATCH, "out_hidden_size": 64,
    "num_position_embeddings": 64, "initializer_range": INITIALIZER_RANGE,
}
#: ChatML, as Qwen's templates render a turn; media placeholders are part of the content string.
CHAT_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
                 "{% endif %}")
PROCESSOR = {"patch_size": PATCH, "merge_size": MERGE, "temporal_patch_size": TEMPORAL_PATCH,
             "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5], "resample": 3, "do_resize": True,
             "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "do_convert_rgb": True,
             "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS}}

#: The tokenizer's training text: the words the clef records and read-outs use (shapes, colours,
#: counts, positions, true/false, the question and instruction phrases, video timestamps), so they
#: become whole tokens; repeated lines weigh the answer words.
CORPUS = (
    "A red circle, a blue square and a green triangle are drawn on a white picture.",
    "The picture shows one red circle. The picture shows two blue squares. There are three green triangles.",
    "Is the circle red? Is the square blue? Which shape is on the left? Which colour is the shape on the right?",
    "How many shapes are in the picture? How many circles are there? Count the squares in the video.",
    "The first frame shows a circle on the left. The last frame shows the circle on the right.",
    "Does the circle move from left to right? Does the square move up or down?",
    "Picture 1: Picture 2: Video: The word in the picture is CAT. The word is DOG. The letters are black.",
    "Question: Answer with true or false only.",
    "Answer with one of these options only: red, blue, green, yellow, circle, square, triangle, left, right.",
    "Answer with one whole number from 0 to 9 only.",
    "true false true false True False true false",
    "red blue green yellow black white circle square triangle left right up down top bottom",
    "0 1 2 3 4 5 6 7 8 9 zero one two three four five six seven eight nine",
    "<0.5 seconds> <1.5 seconds> <2.5 seconds> <3.5 seconds> seconds",
    "A short story: Tom has 3 apples and Anna gives him 4 more, so Tom has 7 apples now.",
    "The sun is hot and the sea is blue. Water boils at 100 degrees and freezes at 0 degrees.",
)


def train_tokenizer(out: Path) -> Any:
    """Train the byte-level BPE on :data:`CORPUS` and write ``tokenizer.json``,
    ``tokenizer_config.json`` and ``chat_template.jinja`` into ``out``; returns the transformers
    tokenizer loaded back from ``out``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import AutoTokenizer

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([line for line in CORPUS for _ in range(3)], trainer)
    tok.save(str(out / "tokenizer.json"))
    config = {"backend": "tokenizers", "tokenizer_class": "TokenizersBackend", "bos_token": None,
              "eos_token": SPECIAL_TOKENS[EOS_ID], "pad_token": SPECIAL_TOKENS[PAD_ID],
              "unk_token": None, "model_max_length": TEXT_CONFIG["max_position_embeddings"],
              "image_token": SPECIAL_TOKENS[IMAGE_ID], "video_token": SPECIAL_TOKENS[VIDEO_ID],
              "vision_start_token": SPECIAL_TOKENS[VISION_START_ID], "vision_end_token": SPECIAL_TOKENS[VISION_END_ID]}
    write_json(out / "tokenizer_config.json", config)
    (out / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    loaded = AutoTokenizer.from_pretrained(out)
    ids = {t: loaded.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    if list(ids.values()) != list(range(len(SPECIAL_TOKENS))):
        raise AssertionError(f"special token ids {ids} are not 0..{len(SPECIAL_TOKENS) - 1}")
    return loaded


def _jitter_norms(model: Any, seed: int) -> list[str]:
    """Add a seeded normal draw (std :data:`NORM_JITTER`) to every norm module's weight and bias;
    returns the parameter names moved (sorted, so the draw order is fixed)."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    params = dict(model.named_parameters())
    names = sorted(n for n in params if "norm" in n.lower())  # RMSNorm, gated RMSNorm, LayerNorm (weight and bias)
    with torch.no_grad():
        for name in names:
            p = params[name]
            p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * NORM_JITTER)
    return names


def build(seed: int, out: Path, tokenizer_root: Path | None = None) -> str:
    """Write the twin's snapshot into the empty folder ``out``: ``config.json``,
    ``generation_config.json``, ``model.safetensors`` (float32, sorted keys), the tokenizer files,
    the chat template and both processor configs. ``tokenizer_root`` is unused (the twin trains
    its own tokenizer). Deterministic for a fixed seed and library versions. Returns the model
    class name.

    Raises:
        AssertionError: the trained tokenizer's special ids are not 0..6 (the config names them).
    """
    import torch
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    train_tokenizer(out)
    config = Qwen3_5Config(text_config=dict(TEXT_CONFIG), vision_config=dict(VISION_CONFIG), tie_word_embeddings=False,
                           image_token_id=IMAGE_ID, video_token_id=VIDEO_ID, vision_start_token_id=VISION_START_ID,
                           vision_end_token_id=VISION_END_ID)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(config).float().eval()
    _jitter_norms(model, seed)
    name = save_snapshot(model, out, {"eos_token_id": EOS_ID, "pad_token_id": PAD_ID}, tied=False,
                         config_extra={"eos_token_id": EOS_ID})
    write_json(out / "preprocessor_config.json", {**PROCESSOR, "image_processor_type": "Qwen2VLImageProcessorPil"})
    write_json(out / "video_preprocessor_config.json", {**PROCESSOR, "fps": VIDEO_FPS, "min_frames": 2,
                                                         "max_frames": 16, "video_processor_type": "Qwen3VLVideoProcessor"})
    return name
