"""The ONNX Runtime port without its runtime: the registry, which pins it and the folder loaders refuse,
the layout checks of a bad export (on inputs and outputs written here), the onnx-export pins' recipes and
precision, and how the pairing and the families treat the int8 export. Nothing here imports onnx,
onnxruntime, torch or transformers (tests/unit/test_light_imports_dry.py asserts it)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from oracles.engines import BUILTIN, Registry
from oracles.engines.onnx.artifact import Graph, Io, OnnxLayout, check_model, precision_of, read_layout
from oracles.engines.onnx.engine import OnnxRuntimePort, onnx_of
from oracles.errors import PinError
from oracles.families import BY_NAME, CONVERSION_PINS
from oracles.pins.onnx_export import EXPORT_TOOL, PACKAGES, QUANTIZE_TOOL, options_of
from oracles.pins.pairing import judgment_of
from oracles.pins.pin import load_pin

pytestmark = pytest.mark.dry

FILE = Path("/snap/model.onnx")
FLOAT, INT8 = "smollm2-draft-twin-onnx", "smollm2-draft-twin-onnx-int8"


def io(layers: int = 2, extra: tuple[Io, ...] = (), hidden: bool = True,
       heads: int | str = 2) -> tuple[list[Io], list[Io]]:
    """Inputs and outputs as torch.onnx.export writes the draft twin's decoder with past."""
    kv = ("past_key_values", "present")
    ins = [Io("input_ids", "int64", (1, "seq")), *extra]
    outs = [Io("logits", "float32", (1, "seq", 49152))] + ([Io("hidden", "float32", (1, "seq", 64))] if hidden else [])
    for i in range(layers):
        for k in ("key", "value"):
            ins.append(Io(f"{kv[0]}.{i}.{k}", "float32", (1, heads, "past", 16)))
            outs.append(Io(f"{kv[1]}.{i}.{k}", "float32", (1, heads, "past + seq", 16)))
    return ins, outs


def test_registered_under_its_id() -> None:
    assert BUILTIN["onnxruntime"] == "oracles.engines.onnx.engine:OnnxRuntimePort"
    assert Registry().load("onnxruntime") is OnnxRuntimePort


def test_which_engines_load_an_onnx_pin() -> None:
    """The .onnx pins are this engine's; the folder loaders (transformers, mlx-lm) refuse them at collection."""
    from oracles.engines.mlx.lm import MlxPort
    from oracles.engines.torch.reference import TorchReference

    assert "lists none" in str(OnnxRuntimePort.unsupported_pin(load_pin("smollm2-draft-twin")))
    for name in (FLOAT, INT8):
        assert OnnxRuntimePort.unsupported_pin(load_pin(name)) is None and onnx_of(load_pin(name)) == "model.onnx"
        for folder_loader in (TorchReference, MlxPort):
            assert "model.onnx" in str(folder_loader.unsupported_pin(load_pin(name)))


def test_layout_of_the_export() -> None:
    layout = read_layout(FILE, *io())
    assert layout == OnnxLayout(past=(("past_key_values.0.key", "past_key_values.0.value"),
                                      ("past_key_values.1.key", "past_key_values.1.value")),
                                present=(("present.0.key", "present.0.value"), ("present.1.key", "present.1.value")),
                                kv_heads=2, head_dim=16, vocab=49152, hidden_size=64)
    assert layout.num_layers == 2
    extra = (Io("attention_mask", "int64", (1, "all")), Io("position_ids", "int64", (1, "seq")))
    with_extra = read_layout(FILE, *io(extra=extra))
    assert with_extra.attention_mask and with_extra.position_ids


@pytest.mark.parametrize(("given", "message"), [
    (io(extra=(Io("use_cache_branch", "bool", (1,)),)),
     r"^/snap/model.onnx: input 'use_cache_branch' is not one this engine feeds \(input_ids, past_key_values"),
    (([i for i in io()[0] if i.name != "input_ids"], io()[1]), r"^/snap/model.onnx: inputs .* have no 'input_ids'"),
    (([io()[0][0]], [o for o in io()[1] if not o.name.startswith("present")]),
     r"^/snap/model.onnx: no past_key_values.<i>.key/.value inputs: the cache is not exported"),
    ((io()[0], [o for o in io()[1] if o.name != "present.1.value"]),
     r"^/snap/model.onnx: output 'present.1.value' is missing \(layers 0..1 seen\)$"),
    ((io(layers=2)[0], io(layers=3)[1]), r"^/snap/model.onnx: 2 layers of past_key_values inputs but 3 of present outputs$"),
    (io(hidden=False), r"^/snap/model.onnx: output 'hidden' is missing \(the final norm's output .*oracles.pins.onnx_export\)"),
    (io(heads="heads"), r"^/snap/model.onnx: input past_key_values.0.key shape \[1, 'heads', 'past', 16\].* must be fixed axes$"),
])
def test_an_export_this_engine_cannot_feed_is_one_line(given: tuple[list[Io], list[Io]], message: str) -> None:
    with pytest.raises(PinError, match=message):
        read_layout(FILE, *given)


def test_sizes_held_to_config_and_tokenizer() -> None:
    layout = read_layout(FILE, *io())
    config = {"num_hidden_layers": 2, "num_key_value_heads": 2, "num_attention_heads": 4, "hidden_size": 64,
              "vocab_size": 49152}
    check_model(FILE, layout, config, 49152)
    with pytest.raises(PinError, match=r"^/snap/model.onnx: the graph has num_hidden_layers 2 but config.json field "
                                       r"'num_hidden_layers' is 3$"):
        check_model(FILE, layout, {**config, "num_hidden_layers": 3}, 49152)
    with pytest.raises(PinError, match=r"the graph has head_dim 16 but config.json field 'head_dim' is 32$"):
        check_model(FILE, layout, {**config, "head_dim": 32}, 49152)
    with pytest.raises(PinError, match=r"logits width 49152 is narrower than the tokenizer's 50000 ids$"):
        check_model(FILE, layout, config, 50000)


def test_precision_read_from_the_operators() -> None:
    base = Graph(inputs=(), outputs=(), opset=18, producer="p", initializers={"float32": 10, "int64": 3})
    assert precision_of(base) == {"weights": "float32", "compute": "float32"}
    quantized = Graph(inputs=(), outputs=(), opset=18, producer="p", ops={"DynamicQuantizeLinear": 8, "MatMulInteger": 14},
                      initializers={"int8": 100, "float32": 10})
    assert precision_of(quantized) == {"weights": "int8", "compute": "dynamic_uint8"}


def test_the_pins_record_their_recipes() -> None:
    """Each recipe names its tool, the versions it ran with (those constraints.txt pins) and its options."""
    constraints = dict(line.split("==") for line in (Path(__file__).parents[2] / "constraints.txt").read_text().splitlines()
                       if "==" in line and not line.startswith("#"))
    for name, tool in ((FLOAT, EXPORT_TOOL), (INT8, QUANTIZE_TOOL)):
        pin = load_pin(name)
        recipe = pin.recipe or {}
        assert recipe["tool"] == tool and options_of(pin) == (tool, recipe["arguments"])
        assert sorted(recipe["packages"]) == sorted(PACKAGES[tool])
        for dist, version in recipe["packages"].items():
            assert version.split("+")[0] == constraints[dist], (name, dist)
        assert pin.reference == "smollm2-draft-twin" and pin.trained is False
    assert load_pin(FLOAT).precision.describe() == "float32 weights, float32 compute"
    assert load_pin(INT8).precision.to_json() == {"weights": "int8", "compute": "dynamic_uint8"}
    assert load_pin(INT8).converted_from == FLOAT and "model.onnx.data" in load_pin(FLOAT).files


def _pin_file(tmp_path: Path, recipe: dict[str, object]) -> Path:
    obj = json.loads(load_pin(FLOAT).path.read_text())
    path = tmp_path / f"{FLOAT}.json"
    path.write_text(json.dumps({**obj, "recipe": {**obj["recipe"], **recipe}}))
    return path


def test_an_unknown_option_or_tool_is_one_line(tmp_path: Path) -> None:
    pin = load_pin(_pin_file(tmp_path, {"arguments": {"opset_version": 18, "do_constant_folding": False}}))
    with pytest.raises(PinError, match=r"field 'recipe.arguments.do_constant_folding' is not a torch.onnx.export option"):
        options_of(pin)
    with pytest.raises(PinError, match=r"field 'recipe.tool' is 'optimum-cli' but a onnx-export: source is made by"):
        load_pin(_pin_file(tmp_path, {"tool": "optimum-cli"}))


def test_the_pairing_and_the_families_on_the_two_exports() -> None:
    """The float32 export is a default conversion, judged exactly; the int8 one is refused as a port pin (its
    weights are not the reference's) and left out of the float32 self-checks (graded instead)."""
    twin = load_pin("smollm2-draft-twin")
    assert FLOAT in CONVERSION_PINS and INT8 not in CONVERSION_PINS
    assert judgment_of(twin, load_pin(FLOAT)).exact
    with pytest.raises(PinError, match=rf"pin {INT8} holds int8 weights, which pin smollm2-draft-twin does not hold"):
        judgment_of(twin, load_pin(INT8))
    assert "computes in dynamic_uint8" in str(BY_NAME["mtplx"].serves_precision(load_pin(INT8)))
    assert BY_NAME["mtplx"].serves_precision(load_pin(FLOAT)) is None
