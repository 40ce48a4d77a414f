"""What happens when an engine cannot take a pin: a port that cannot load a pin's architecture is left
out at collection (mlx-lm's model modules, read without importing mlx); a build that fails is tried
once per session and every later test gets the same line; an engine whose tokenizer encodes the
canary unlike the pin's dry tokenizer is refused naming both. No framework is imported."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from cohort_fake import DryTokenizer, NoForward, fake_pin

from oracles.engines.base import Engine
from oracles.engines.mlx.config import missing_model_module
from oracles.engines.mlx.lm import MlxPort
from oracles.errors import OracleError
from oracles.pins.pin import FileDigest, Pin, available_pins, load_pin, sha256_file
from oracles.pins.tokenizer import CANARY, canary_disagreement, load_tokenizer
from oracles.plugin.fixtures import EngineLoader

pytestmark = pytest.mark.dry

SMOL = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"


def _fake_mlx_lm(tmp: Path) -> Path:
    """An mlx-lm package tree as far as missing_model_module reads it: utils.py's tables and models/."""
    pkg = tmp / "mlx_lm"
    (pkg / "models" / "deepseek_v3").mkdir(parents=True)
    (pkg / "models" / "deepseek_v3" / "__init__.py").write_text("")
    for name in ("llama", "qwen2", "bailing_moe_v3"):
        (pkg / "models" / f"{name}.py").write_text("import mlx.core  # never imported by the check\n")
    (pkg / "utils.py").write_text("import mlx.core as mx\n\nMODEL_REMAPPING = {'mistral': 'llama', 'kimi_k2': "
                                  "'deepseek_v3'}\nMODEL_ARCHITECTURE_REMAPPING = {('bailing_hybrid', "
                                  "'BailingMoeV3ForCausalLM'): 'bailing_moe_v3'}\n")
    return pkg


@pytest.mark.parametrize("config", [{"model_type": "qwen2"}, {"model_type": "mistral"}, {"model_type": "kimi_k2"},
                                    {"model_type": "bailing_hybrid", "architectures": ["BailingMoeV3ForCausalLM"]}])
def test_mlx_model_module_found(tmp_path: Path, config: dict[str, Any]) -> None:
    assert missing_model_module(config, _fake_mlx_lm(tmp_path)) is None


def test_mlx_model_module_missing_names_type_and_file(tmp_path: Path) -> None:
    pkg = _fake_mlx_lm(tmp_path)
    assert "model_type 'opt' has no model module" in str(missing_model_module({"model_type": "opt"}, pkg))
    assert "(no models/opt.py)" in str(missing_model_module({"model_type": "opt"}, pkg))
    assert missing_model_module({}, pkg) == "its config.json has no model_type"
    # an architecture remapping that does not apply falls back to MODEL_REMAPPING, as mlx-lm does
    assert missing_model_module({"model_type": "bailing_hybrid", "architectures": ["Other"]}, pkg) is not None


def _pin(tmp: Path, name: str, config: dict[str, Any], model_class: str) -> Pin:
    folder = tmp / name
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(config))
    digest = FileDigest(bytes=(folder / "config.json").stat().st_size, sha256=sha256_file(folder / "config.json"))
    return Pin(name=name, source=f"local:{folder}", source_sha256=None, model_class=model_class,
               files={"config.json": digest}, safetensors_headers={}, built_with={}, path=folder / "pin.json",
               trained=False)


def test_mlx_port_leaves_out_opt_pin_at_collection(tmp_path: Path) -> None:
    """The installed mlx-lm (where there is one) has no OPT module: the pair is left out with that
    reason, a Qwen2 pin is kept, and mlx itself is not imported to find out."""
    if MlxPort.unavailable_reason() is not None:
        pytest.skip("mlx-lm is not installed here")
    before = "mlx.core" in sys.modules
    opt = _pin(tmp_path, "tiny-opt", {"model_type": "opt", "architectures": ["OPTForCausalLM"]}, "OPTForCausalLM")
    qwen = _pin(tmp_path, "tiny-qwen2", {"model_type": "qwen2"}, "Qwen2ForCausalLM")
    reason = MlxPort.unsupported_pin(opt)
    assert reason is not None and reason.startswith("mlx-lm cannot load pin tiny-opt (OPTForCausalLM): model_type 'opt'")
    assert MlxPort.unsupported_pin(qwen) is None
    assert ("mlx.core" in sys.modules) == before


def test_mlx_port_judges_the_model_type_it_loads_not_the_config_one(tmp_path: Path) -> None:
    """A text-only Qwen3.5 (config model_type qwen3_5_text, which mlx-lm has no module for) is loaded as
    mlx-lm's qwen3_5 (oracles.engines.mlx.hybrid): kept. Without the translation the hybrid twin's MLX
    runs, a third of make test's port coverage, were left out."""
    if MlxPort.unavailable_reason() is not None:
        pytest.skip("mlx-lm is not installed here")
    hybrid = _pin(tmp_path, "tiny-hybrid", {"model_type": "qwen3_5_text", "layer_types": ["linear_attention"] * 3
                                            + ["full_attention"]}, "Qwen3_5ForCausalLM")
    assert MlxPort.unsupported_pin(hybrid) is None
    irregular = _pin(tmp_path, "tiny-irregular", {"model_type": "qwen3_5_text", "layer_types": [
        "full_attention", "linear_attention", "linear_attention", "full_attention"]}, "Qwen3_5ForCausalLM")
    reason = MlxPort.unsupported_pin(irregular)
    assert reason is not None and "places full attention by full_attention_interval only" in reason


def test_mlx_port_keeps_pin_whose_config_is_not_the_pinned_one(tmp_path: Path) -> None:
    """A snapshot not materialised (or another config.json) is not judged at collection: the load judges."""
    pin = _pin(tmp_path, "tiny-opt", {"model_type": "opt"}, "OPTForCausalLM")
    (tmp_path / "tiny-opt" / "config.json").write_text(json.dumps({"model_type": "opt", "changed": True}))
    assert MlxPort.unsupported_pin(pin) is None


class _Broken(NoForward, Engine):
    id = "broken"
    loads = 0

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        type(self).loads += 1
        raise ValueError("Model type opt not supported.\nsecond line")


class _Refusing(NoForward, Engine):
    id = "refusing"

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        raise OracleError("the torch reference cannot hook pin p (OPTForCausalLM, decoder OPTDecoder): ...")


def _loader(monkeypatch: pytest.MonkeyPatch, cls: type[Engine], events: list[Any]) -> EngineLoader:
    import oracles.engines as registry

    monkeypatch.setattr(registry, "unavailable_reason", lambda _e: None)
    monkeypatch.setattr(registry, "engine_class", lambda _e: cls)
    return EngineLoader(lambda _pin: SMOL, 0, lambda _e: {}, lambda event, **f: events.append((event, f)),
                        lambda name: load_pin(name) if name in available_pins() else fake_pin(name))


def test_failed_load_is_tried_once_and_each_test_gets_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[Any] = []
    loader = _loader(monkeypatch, _Broken, events)
    messages = []
    for _ in range(3):
        with pytest.raises(pytest.fail.Exception) as info:
            loader.get("broken", "tiny-opt")
        messages.append(str(info.value))
        assert info.value.pytrace is False
    assert _Broken.loads == 1 and events == []
    assert len(set(messages)) == 1 and "\n" not in messages[0]
    assert messages[0].startswith("engine broken cannot load pin tiny-opt: ValueError: Model type opt not supported. "
                                  "(raised at unit/test_engine_load_dry.py:")
    assert messages[0].endswith("; tried once per run")


def test_oracle_error_is_its_own_line_without_a_location(monkeypatch: pytest.MonkeyPatch) -> None:
    loader = _loader(monkeypatch, _Refusing, [])
    with pytest.raises(pytest.fail.Exception) as info:
        loader.get("refusing", "p")
    assert "raised at" not in str(info.value) and "cannot hook pin p (OPTForCausalLM" in str(info.value)


class _Qwen2LikeTokenizer(DryTokenizer):
    """Encodes as transformers 5's Qwen2Tokenizer does over SmolLM2's tokenizer.json: "\\n\\n" one token."""

    def __init__(self) -> None:
        super().__init__(SMOL)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        ids = self.light.encode(text)
        out: list[int] = []
        for i in ids:
            if i == 198 and out and out[-1] == 198:
                out[-1] = 1116
            else:
                out.append(i)
        return out


def test_canary_has_what_splits_tokenizers() -> None:
    ids = load_tokenizer(SMOL).encode(CANARY)
    assert "\n\n" in CANARY and "  " in CANARY and any(c.isdigit() for c in CANARY) and not CANARY.isascii()
    assert [198, 198] == [i for i in ids if i == 198][:2]  # SmolLM2's tokenizer.json: "\n\n" is two tokens


def test_canary_agreement_is_silent() -> None:
    assert canary_disagreement(_Same(), SMOL, "torch", "p") is None


class _Same:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return load_tokenizer(SMOL).encode(text)


def test_canary_disagreement_names_both_tokenizers_and_ids() -> None:
    line = canary_disagreement(_Qwen2LikeTokenizer(), SMOL, "torch", "tiny-qwen2")
    assert line is not None and "\n" not in line
    assert line.startswith("engine torch refuses pin tiny-qwen2: its tokenizer (test_engine_load_dry "
                           "_Qwen2LikeTokenizer) encodes the canary ")
    assert "1116" in line and "198, 198" in line and "(tokenizers, " in line
    # not a transformers class: the engine's own tokenizer is named the likely fault (test_engine_contract_dry)
    assert line.endswith("else the pin's tokenizer files are not its model's own")


class _Tokenizing(NoForward, Engine):
    id = "tokenizing"

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = 49152, 8, 1, 0
        self.eos_token_ids = frozenset({2})
        self.tokenizer = _Qwen2LikeTokenizer()


def test_loader_refuses_engine_whose_tokenizer_disagrees(monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[Any] = []
    loader = _loader(monkeypatch, _Tokenizing, events)
    with pytest.raises(pytest.fail.Exception) as info:
        loader.get("tokenizing", "smollm2-135m-instruct")
    assert "engine tokenizing refuses pin smollm2-135m-instruct" in str(info.value) and events == []


def test_loader_asks_no_canary_of_a_vision_pin(monkeypatch: pytest.MonkeyPatch) -> None:
    """A vision pin's families tokenize through the engine's processor (nothing recorded is fed): the
    engine loads (positive control above). An engine without a tokenizer no longer loads: the contract
    requires one (test_engine_contract_dry)."""
    events: list[Any] = []
    assert isinstance(_loader(monkeypatch, _Tokenizing, events).get("tokenizing", "qwen35-vl-twin"), _Tokenizing)
    assert [e for e, _ in events] == ["engine_loaded"]
