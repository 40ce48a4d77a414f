"""The LiteRT port without its runtime: the registry, which pins it refuses, the signature checks of a
bad artifact (on signature details written here), and the litert-convert pin's recipe. Nothing here
imports ai_edge_litert or litert_torch (tests/unit/test_light_imports_dry.py asserts it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracles.engines import BUILTIN, Registry
from oracles.engines.litert.artifact import Details, Layout, PlainLayout, check_model, read_layout
from oracles.engines.litert.engine import LiteRtPort, tflite_of
from oracles.errors import PinError
from oracles.pins.litert import CONVERTER_PACKAGES, OPTIONS, PLAIN_OPTIONS, options_of
from oracles.pins.pin import load_pin

pytestmark = pytest.mark.dry

FILE = Path("/snap/model.tflite")
KV = (1, 512, 2, 16)


def details(t: int = 64, vocab: int = 49152, hidden: int | None = 64, layers: int = 2, decode: bool = True) -> Details:
    """Signature details shaped as litert-torch's generative export writes them."""

    def sig(n: int) -> dict[str, dict[str, tuple[tuple[int, ...], str]]]:
        kv = {f"kv_cache_{k}_{i}": (KV, "float32") for i in range(layers) for k in "kv"}
        outputs = {**kv, "logits": ((1, n, vocab), "float32")}
        if hidden is not None:
            outputs["hidden"] = ((1, n, hidden), "float32")
        return {"inputs": {"tokens": ((1, n), "int32"), "input_pos": ((n,), "int32"), **kv}, "outputs": outputs}

    out = {f"prefill_{t}": sig(t)}
    if decode:
        out["decode"] = sig(1)
    return out


def test_registered_under_its_id() -> None:
    assert BUILTIN["litert"] == "oracles.engines.litert.engine:LiteRtPort"
    assert Registry().load("litert") is LiteRtPort


def test_unsupported_pin_refuses_a_pin_without_a_tflite() -> None:
    why = LiteRtPort.unsupported_pin(load_pin("smollm2-draft-twin"))
    assert why is not None and "lists none" in why and "smollm2-draft-twin" in why
    assert LiteRtPort.unsupported_pin(load_pin("smollm2-draft-twin-litert")) is None
    assert tflite_of(load_pin("smollm2-draft-twin-litert")) == "model.tflite"


def test_layout_of_the_generative_export() -> None:
    layout = read_layout(FILE, details())
    assert layout == Layout("prefill_64", 64, "decode", ("kv_cache_k_0", "kv_cache_v_0", "kv_cache_k_1", "kv_cache_v_1"),
                            KV, 49152, 64)
    assert (layout.kv_rows, layout.num_layers) == (512, 2)
    assert read_layout(FILE, details(decode=False)).decode is None


def plain(t: int = 512, outputs: tuple[str, ...] = ("logits", "hidden")) -> Details:
    """Signature details shaped as litert_torch.convert writes a plain graph's (one signature)."""
    shapes = {"logits": ((1, t, 49152), "float32"), "hidden": ((1, t, 64), "float32")}
    return {"serving_default": {"inputs": {"input_ids": ((1, t), "int32")},
                                "outputs": {name: shapes.get(name, ((1, t, 64), "float32")) for name in outputs}}}


def test_layout_of_a_plain_graph() -> None:
    layout = read_layout(FILE, plain())
    assert layout == PlainLayout("serving_default", "input_ids", 512, 49152, 64)
    assert layout.decode is None
    check_model(FILE, layout, {**CONFIG, "num_hidden_layers": 7}, 49152)  # a plain graph has no KV layers to count


def test_a_tflite_neither_generative_nor_plain_is_one_line() -> None:
    with pytest.raises(PinError, match=r"^/snap/model.tflite: field 'signatures' has no prefill_<T> signature and 2 "
                                       r"signatures \(found \['decode', 'serving_default'\]\); .* or a plain graph"):
        read_layout(FILE, {**plain(), "decode": details()["decode"]})
    with pytest.raises(PinError, match=r"^/snap/model.tflite: field 'signatures.serving_default.inputs' is "
                                       r"\['input_pos', 'kv_cache_k_0', .*\]; a plain graph takes one int32 \[1, T\]"):
        read_layout(FILE, {"serving_default": details()["prefill_64"]})


def test_a_plain_graph_without_hidden_or_logits_is_one_line() -> None:
    with pytest.raises(PinError, match=r"field 'signatures.serving_default.outputs.hidden' is None; the engine contract "
                                       r"returns the final norm's hidden state float32 \[1, 512, D\] .*export 'plain'"):
        read_layout(FILE, plain(outputs=("logits",)))
    with pytest.raises(PinError, match=r"field 'signatures.serving_default.outputs.logits' is None; .*"
                                       r"\(found outputs \['output_0', 'output_1'\]\)"):
        read_layout(FILE, plain(outputs=("output_0", "output_1")))
    bad = plain()
    bad["serving_default"]["inputs"]["input_ids"] = ((1, 512), "float32")
    with pytest.raises(PinError, match=r"inputs.input_ids' is float32 \[1, 512\]; expected int32 \[1, T\]$"):
        read_layout(FILE, bad)


def test_a_prefill_without_logits_is_one_line() -> None:
    bad = details()
    del bad["prefill_64"]["outputs"]["logits"]
    with pytest.raises(PinError, match=r"field 'signatures.prefill_64.outputs.logits' is None; .*output_logits_on_prefill"):
        read_layout(FILE, bad)


def test_a_decode_whose_cache_differs_is_one_line() -> None:
    bad = details()
    bad["decode"]["inputs"]["kv_cache_v_1"] = ((1, 256, 2, 16), "float32")
    with pytest.raises(PinError, match=r"field 'signatures.decode.inputs.kv_cache_v_1' is float32 \[1, 256, 2, 16\]; "
                                       r"expected float32 \[1, 512, 2, 16\]"):
        read_layout(FILE, bad)


def test_a_missing_cache_layer_is_one_line() -> None:
    bad = details()
    del bad["prefill_64"]["inputs"]["kv_cache_v_1"]
    with pytest.raises(PinError, match=r"field 'signatures.prefill_64.inputs.kv_cache_v_1' is missing"):
        read_layout(FILE, bad)


CONFIG = {"vocab_size": 49152, "hidden_size": 64, "num_hidden_layers": 2}


def test_sizes_held_to_config_and_tokenizer() -> None:
    check_model(FILE, read_layout(FILE, details()), CONFIG, 49152)


def test_a_vocabulary_differing_from_the_tokenizer_is_one_line() -> None:
    layout = read_layout(FILE, details(vocab=128))
    with pytest.raises(PinError, match=r"^/snap/model.tflite: field 'signatures.prefill_64.outputs.logits' width 128 "
                                       r"is narrower than the pin's tokenizer \(49152 ids\)$"):
        check_model(FILE, layout, {**CONFIG, "vocab_size": 128}, 49152)
    with pytest.raises(PinError, match=r"width 128 differs from /snap/config.json vocab_size 49152"):
        check_model(FILE, layout, CONFIG, 49152)


def test_hidden_and_layers_held_to_config() -> None:
    with pytest.raises(PinError, match=r"outputs.hidden' width 32 differs from /snap/config.json hidden_size 64"):
        check_model(FILE, read_layout(FILE, details(hidden=32)), CONFIG, 49152)
    with pytest.raises(PinError, match=r"has 3 KV layers but /snap/config.json num_hidden_layers is 2"):
        check_model(FILE, read_layout(FILE, details(layers=3)), CONFIG, 49152)


def test_the_twin_pin_records_its_recipe() -> None:
    pin = load_pin("smollm2-draft-twin-litert")
    recipe = pin.recipe or {}
    assert (pin.source, pin.reference, pin.converted_from) == ("litert-convert:smollm2-draft-twin",) + ("smollm2-draft-twin",) * 2
    assert recipe["packages"] == list(CONVERTER_PACKAGES) and recipe["arguments"] == OPTIONS
    assert recipe["shim"] == {"tensorflow.lite.python.schema_py_generated":
                              "sys.modules alias of ai_edge_litert.schema_py_generated"}
    assert sorted(recipe["signatures"]) == ["decode", "prefill_64"]
    assert pin.precision.weights == pin.precision.compute == "float32"
    assert options_of(pin) == OPTIONS


def test_the_plain_pin_records_its_recipe() -> None:
    pin = load_pin("smollm2-draft-twin-litert-plain")
    recipe = pin.recipe or {}
    assert (recipe["tool"], recipe["arguments"], options_of(pin)) == ("litert_torch.convert", PLAIN_OPTIONS, PLAIN_OPTIONS)
    assert recipe["signatures"] == {"serving_default": {"inputs": ["input_ids"], "outputs": ["hidden", "logits"]}}
    assert recipe["packages"] == list(CONVERTER_PACKAGES) and pin.reference == "smollm2-draft-twin"


@pytest.mark.parametrize(("arguments", "field"), [({"export": "plain", "prefill_len": 64}, "prefill_len"),
                                                  ({"export": "onnx"}, "export"), ({"seq_len": 64}, "seq_len")])
def test_an_option_of_the_other_export_is_one_line(tmp_path: Path, arguments: dict[str, object], field: str) -> None:
    obj = json.loads(load_pin("smollm2-draft-twin-litert-plain").path.read_text())
    obj["recipe"]["arguments"] = arguments
    path = tmp_path / "smollm2-draft-twin-litert-plain.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PinError, match=rf"^{path}: field 'recipe.arguments.{field}' is "):
        options_of(load_pin(path))


def test_an_unknown_conversion_option_is_one_line(tmp_path: Path) -> None:
    obj = json.loads(load_pin("smollm2-draft-twin-litert").path.read_text())
    obj["recipe"]["arguments"]["prefil_len"] = 32
    path = tmp_path / "smollm2-draft-twin-litert.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PinError, match=r"field 'recipe.arguments.prefil_len' is not a litert generative conversion option"):
        options_of(load_pin(path))
