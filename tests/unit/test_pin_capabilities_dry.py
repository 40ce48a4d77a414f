"""What a pin's model cannot do is a skip with the reason, never a failure and never silent (dry)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from cohort_fake import NoForward, fake_pin

from oracles.commands.records import build
from oracles.engines.base import ContextTooShort, Engine, Unsupported, check_fits
from oracles.families.records import TOKENIZER_COPIES
from oracles.pins.pin import load_pin

pytestmark = pytest.mark.dry


class Short(NoForward, Engine):
    id = "short"

    def __init__(self) -> None:
        super().__init__(Path("."), fake_pin("tiny-context"), 0)
        self.max_context = 16


def test_record_past_the_context_is_unsupported_naming_record_length_and_context() -> None:
    with pytest.raises(ContextTooShort) as err:
        check_fits(Short(), "readme", 1294)
    message = str(err.value)
    assert isinstance(err.value, Unsupported) and isinstance(err.value, ValueError)
    assert "'readme' (1294 prompt tokens)" in message and "context of pin tiny-context is 16" in message, message
    check_fits(Short(), "ping", 16)  # fits exactly: no refusal


def test_tokens_of_a_tokenizer_without_chat_template_say_unsupported(tmp_path: Path) -> None:
    pin = load_pin("smollm2-135m-instruct")
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copyfile(TOKENIZER_COPIES / pin.name / "tokenizer.json", folder / "tokenizer.json")
    config = json.loads((TOKENIZER_COPIES / pin.name / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    for family in ("mtplx", "d1"):
        doc = build(family, pin, folder)
        assert doc["unsupported"].startswith(f"pin {pin.name} has no chat template"), doc
        assert doc["tokenizer_sha256"] == pin.tokenizer_sha256 and "ids" not in doc and "rows" not in doc


def test_engine_without_chat_template_refuses_to_render() -> None:
    engine = Short()
    engine.tokenizer = type("T", (), {"chat_template": None})()
    with pytest.raises(Unsupported, match=r"engine 'short' cannot render a chat: pin tiny-context has no chat template"):
        engine.chat_ids([{"role": "user", "content": "x"}])


def test_a_single_file_artifact_is_left_to_its_runtime_by_the_folder_loaders() -> None:
    from dataclasses import replace

    from oracles.engines.guards import single_file_artifact
    from oracles.engines.mlx.lm import MlxPort
    from oracles.engines.torch.reference import TorchReference
    from oracles.pins.pin import FileDigest

    digest = FileDigest(1, "0" * 64)
    gguf = replace(fake_pin("a-gguf", "LlamaForCausalLM"), files={"model.gguf": digest, "tokenizer.json": digest})
    folder = replace(gguf, name="a-folder", files={**gguf.files, "model.safetensors": digest})
    assert single_file_artifact(gguf) == "model.gguf" and single_file_artifact(folder) is None
    for cls in (MlxPort, TorchReference):
        why = cls.unsupported_pin(gguf)
        assert why is not None and "pin a-gguf's artifact is model.gguf" in why, why
        assert cls.unsupported_pin(folder) is None  # positive control: the folder is theirs to load
