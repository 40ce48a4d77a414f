"""The LFM2-VL d1 twin's registration and what its materialised snapshot says (no weights loaded, no torch):
the sizes the issue measured, the ``auto_map`` that makes mlx-vlm load it as its d1 model, and the added
LFM2-VL tokens on the ids the config names."""

from __future__ import annotations

import json

import pytest

from oracles.engines.mlx.d1 import is_d1_config
from oracles.pins.materialize import TWINS
from oracles.pins.pin import load_pin, snapshot_dir
from oracles.twins import lfm2_vl

pytestmark = [pytest.mark.dry, pytest.mark.d1]
PIN = "lfm2-vl-d1-twin"


def test_registered() -> None:
    pin = load_pin(PIN)
    assert pin.source == "twin:lfm2-vl-d1#0" and TWINS["lfm2-vl-d1"] == ("oracles.twins.lfm2_vl", "smollm2-135m-instruct")
    assert pin.model_class == "Lfm2VlForConditionalGeneration"


def test_d1_config_rule() -> None:
    assert is_d1_config({"model_type": "lfm2_vl", "auto_map": {"AutoModel": "modeling_d1.D1Model"}})
    assert is_d1_config({"model_type": "d1"})
    assert not is_d1_config({"model_type": "lfm2_vl"})  # plain LFM2-VL: mlx-vlm's decision API refuses it
    assert not is_d1_config({"model_type": "qwen3_5", "auto_map": {"AutoModel": "modeling_d1.D1Model"}})


def test_snapshot_config() -> None:
    root = snapshot_dir(load_pin(PIN))
    if not (root / "config.json").is_file():
        pytest.skip(f"pin {PIN} is not materialised (run `oracles materialize {PIN}`)")
    cfg = json.loads((root / "config.json").read_text())
    text, vision = cfg["text_config"], cfg["vision_config"]
    assert is_d1_config(cfg) and cfg["model_type"] == "lfm2_vl"
    assert (text["hidden_size"], text["block_dim"], text["intermediate_size"], text["block_multiple_of"]) == (64, 64, 192, 32)
    assert text["layer_types"] == ["conv", "full_attention", "conv", "full_attention"] and text["conv_L_cache"] == 3
    assert (text["num_attention_heads"], text["num_key_value_heads"], cfg["tie_word_embeddings"]) == (4, 2, True)
    assert (vision["hidden_size"], vision["num_hidden_layers"], vision["patch_size"], vision["num_patches"]) == (32, 2, 16, 64)
    assert vision["vision_use_head"] is False and (cfg["projector_hidden_size"], cfg["downsample_factor"]) == (64, 2)
    added = {t["content"]: t["id"] for t in json.loads((root / "tokenizer.json").read_text())["added_tokens"]}
    assert added["<image>"] == cfg["image_token_id"] == lfm2_vl.IMAGE_ID and added["<|startoftext|>"] == lfm2_vl.BOS_ID
    assert text["vocab_size"] == lfm2_vl.VOCAB_SIZE == max(added.values()) + 1
