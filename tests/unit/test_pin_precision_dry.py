"""A pin's precision: parsed from the pin file, read from the artifact (config.json's quantization and the
safetensors dtypes), checked against it, and the built-in conversion pins as the issue's table declares them.

Snapshots are hand-made in tmp_path: safetensors files written byte by byte here (zeros; only headers
are read), configs as mlx-lm writes them. Expected values are written out in the tests.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from oracles.errors import PinError
from oracles.pins.pin import PinStore, load_pin, verify_snapshot
from oracles.pins.precision import FLOAT32, Precision, check_packing, parse_precision, read_precision
from oracles.pins.precision import _tensors as tensors_of

pytestmark = pytest.mark.dry

SIZES = {"F32": 4, "BF16": 2, "F16": 2, "U32": 4, "U8": 1}


def safetensors(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    """A safetensors file of zero-filled tensors (format: 8-byte little-endian header length, header JSON, data)."""
    header: dict[str, Any] = {}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        n = SIZES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + n]}
        offset += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(offset)


def quantized(bits: int = 4, group: int = 64, inputs: int = 128, out: int = 8, biases: bool = True,
              scale_dtype: str = "F32") -> dict[str, tuple[str, list[int]]]:
    """One quantized linear as ``mlx.core.quantize`` lays it out, and a float32 norm."""
    t = {"model.q.weight": ("U32", [out, inputs * bits // 32]), "model.q.scales": (scale_dtype, [out, inputs // group])}
    if biases:
        t["model.q.biases"] = (scale_dtype, [out, inputs // group])
    t["model.norm.weight"] = ("F32", [inputs])
    return t


def snapshot(root: Path, tensors: dict[str, tuple[str, list[int]]], quant: dict[str, Any] | None = None) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    cfg: dict[str, Any] = {"architectures": ["LlamaForCausalLM"]}
    if quant is not None:
        cfg["quantization"] = cfg["quantization_config"] = quant
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "model.safetensors").write_bytes(safetensors(tensors))
    return root


def read(root: Path) -> Precision:
    return read_precision(root, ["model.safetensors"])


AFFINE4 = {"group_size": 64, "bits": 4, "mode": "affine"}


# --- the pin file's field ---------------------------------------------------------------------------------

def test_absent_field_is_float32() -> None:
    assert parse_precision(None, Path("p.json")) == Precision("float32", "float32") == FLOAT32


def test_quantized_field_parses_and_describes() -> None:
    p = parse_precision({"weights": "affine", "compute": "float32", "bits": 4, "group_size": 64, "mode": "affine"},
                        Path("p.json"))
    assert (p.quantized, p.exact_compute, p.describe()) == (True, True, "affine 4-bit g64, float32 compute")
    assert parse_precision({"weights": "bfloat16", "compute": "bfloat16"}, Path("p.json")).exact_compute is False
    assert Precision("float32", "float32", gguf_type="Q4_1").describe() == "float32 weights (from GGUF Q4_1), float32 compute"
    assert (Precision("float32", "float32", dequantized_from="q4").describe()
            == "float32 weights dequantized from q4, float32 compute")


@pytest.mark.parametrize(("value", "field"), [
    ("float32", "precision'"),
    ({"weights": "int3", "compute": "float32"}, "precision.weights"),
    ({"weights": "float32", "compute": "int8"}, "precision.compute"),
    ({"weights": "affine", "compute": "float32", "bits": "4", "group_size": 64, "mode": "affine"}, "precision.bits"),
    ({"weights": "affine", "compute": "float32", "bits": 4, "mode": "affine"}, "precision.group_size"),
    ({"weights": "float32", "compute": "float32", "bits": 4}, "precision.bits"),
    ({"weights": "affine", "compute": "float32", "bits": 4, "group_size": 64, "mode": "mxfp4"}, "precision.mode"),
    ({"weights": "float32", "compute": "float32", "colour": "red"}, "precision.colour"),
    ({"weights": "float32", "compute": "float32", "gguf_type": ""}, "precision.gguf_type"),
])
def test_malformed_field_is_one_line_naming_file_and_field(value: Any, field: str) -> None:
    with pytest.raises(PinError) as err:
        parse_precision(value, Path("/pins/p.json"))
    assert str(err.value).startswith(f"/pins/p.json: field '{field}") and "\n" not in str(err.value)


# --- read from the artifact ------------------------------------------------------------------------------

def test_float_dtypes_are_read(tmp_path: Path) -> None:
    assert read(snapshot(tmp_path / "a", {"w": ("F32", [4, 4])})) == FLOAT32
    assert read(snapshot(tmp_path / "b", {"w": ("BF16", [4, 4]), "n": ("F32", [4])})) == Precision("bfloat16", "bfloat16")


def test_affine_is_read_from_config_and_shapes(tmp_path: Path) -> None:
    got = read(snapshot(tmp_path / "q", quantized(), AFFINE4))
    assert got == Precision("affine", "float32", 4, 64, "affine")
    assert read(snapshot(tmp_path / "q8", quantized(bits=8), {**AFFINE4, "bits": 8})).bits == 8


def test_mxfp4_has_no_biases_and_computes_in_the_norms_dtype(tmp_path: Path) -> None:
    root = snapshot(tmp_path / "m", quantized(group=32, biases=False, scale_dtype="U8"),
                    {"group_size": 32, "bits": 4, "mode": "mxfp4"})
    assert read(root) == Precision("mxfp4", "float32", 4, 32, "mxfp4")


@pytest.mark.parametrize(("tensors", "quant", "message"), [
    (quantized(bits=4), {**AFFINE4, "bits": 8}, r"model\.safetensors: tensor 'model\.q\.weight' is U32 \[8, 16\] with "
     r"scales \[8, 2\]: at .*config\.json field 'quantization' bits 8, group_size 64 it packs 64 inputs in 1 groups, "
     r"not 2: config and weights disagree$"),
    (quantized(group=64), {**AFFINE4, "group_size": 32}, r"tensor 'model\.q\.weight' .* group_size 32 .* in 4 groups, "
     r"not 2: config and weights disagree$"),
    (quantized(), None, r"model\.safetensors: tensor 'model\.q\.weight' is U32 \(packed quantized weights\) but "
     r".*config\.json has no field 'quantization'$"),
    ({"w": ("F32", [4, 4])}, AFFINE4, r"config\.json: field 'quantization' says 4-bit g64 but no safetensors file holds "
     r"a U32 packed weight: config and weights disagree$"),
    (quantized(biases=False), AFFINE4, r"tensor 'model\.q\.weight': tensor 'model\.q\.biases' is missing, but .* "
     r"field 'quantization\.mode' is 'affine'$"),
    ({"model.q.weight": ("U32", [8, 16])}, AFFINE4, r"tensor 'model\.q\.weight' is U32 \(packed\) but there is no "
     r"tensor 'model\.q\.scales'$"),
])
def test_config_and_weights_disagreeing_is_one_line(tmp_path: Path, tensors: Any, quant: Any, message: str) -> None:
    root = snapshot(tmp_path / "s", tensors, quant)
    with pytest.raises(PinError, match=message) as err:
        read(root)
    assert "\n" not in str(err.value)


def test_agreeing_shapes_pass_the_packing_check(tmp_path: Path) -> None:
    """The positive control of the table above: the same tensors with the config they were packed with."""
    root = snapshot(tmp_path / "s", quantized(bits=8, group=32), {"group_size": 32, "bits": 8, "mode": "affine"})
    check_packing(root, tensors_of(root, ["model.safetensors"]), {"group_size": 32, "bits": 8, "mode": "affine"})


def test_a_per_module_override_is_honoured(tmp_path: Path) -> None:
    """mlx-lm's mixed recipes write ``"model.q": {"bits": 8, ...}`` beside the global values."""
    quant = {**AFFINE4, "model.q": {"bits": 8, "group_size": 64}}
    assert read(snapshot(tmp_path / "s", quantized(bits=8), quant)).bits == 4  # the global value is the pin's
    with pytest.raises(PinError, match=r"bits 4, group_size 64 .* not 2"):
        read(snapshot(tmp_path / "t", quantized(bits=8), AFFINE4))


@pytest.mark.parametrize(("cfg", "message"), [
    ({"quantization": AFFINE4, "quantization_config": {**AFFINE4, "bits": 8}},
     r"config\.json: fields 'quantization' and 'quantization_config' disagree$"),
    ({"quantization_config": {"quant_method": "gptq", "bits": 4}}, r"field 'quantization_config\.quant_method' is 'gptq'"),
    ({"quantization": {"bits": 4}}, r"field 'quantization\.group_size' must be a positive integer, got None$"),
])
def test_malformed_quantization_is_one_line(tmp_path: Path, cfg: dict[str, Any], message: str) -> None:
    root = snapshot(tmp_path / "s", quantized())
    (root / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(PinError, match=message):
        read(root)


# --- verification ------------------------------------------------------------------------------------

def _pin(pins: Path, root: Path, **fields: Any) -> Path:
    data = (root / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    doc = {"name": "p", "source": f"local:{root}", "model_class": "LlamaForCausalLM",
           "files": {f.name: {"bytes": f.stat().st_size, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()}
                     for f in sorted(root.iterdir())},
           "safetensors_headers": {"model.safetensors": hashlib.sha256(data[: 8 + n]).hexdigest()}, **fields}
    pins.mkdir(exist_ok=True)
    (pins / "p.json").write_text(json.dumps(doc))
    return pins / "p.json"


def test_verify_refuses_a_declared_precision_the_artifact_does_not_have(tmp_path: Path) -> None:
    root = snapshot(tmp_path / "s", quantized(), AFFINE4)
    declared = {"weights": "affine", "compute": "float32", "bits": 8, "group_size": 64, "mode": "affine"}
    path = _pin(tmp_path / "pins", root, precision=declared)
    with pytest.raises(PinError, match=r"p\.json: field 'precision\.bits' is 8 but the snapshot .* holds 4 "):
        verify_snapshot(load_pin(path), root)
    path.unlink()
    good = _pin(tmp_path / "pins", root, precision={**declared, "bits": 4})
    assert verify_snapshot(load_pin(good), root)["files"] == 2  # the positive control


def test_verify_refuses_a_bf16_artifact_pinned_without_the_field(tmp_path: Path) -> None:
    root = snapshot(tmp_path / "s", {"w": ("BF16", [4, 4])})
    with pytest.raises(PinError, match=r"field 'precision\.weights' is 'float32' but the snapshot .* holds 'bfloat16' "
                                       r".*\(float32 is what a pin without a 'precision' field declares\)$"):
        verify_snapshot(load_pin(_pin(tmp_path / "pins", root)), root)


def test_oracles_pin_writes_the_precision_it_reads(tmp_path: Path) -> None:
    from oracles.pins.writer import write_pin

    root = snapshot(tmp_path / "s", quantized(), AFFINE4)
    pin = write_pin("mine", str(root), tmp_path / "pins", reference="mine-deq")
    assert (pin.precision, pin.reference) == (Precision("affine", "float32", 4, 64, "affine"), "mine-deq")
    bad = snapshot(tmp_path / "bad", quantized(), {**AFFINE4, "bits": 8})
    with pytest.raises(PinError, match="config and weights disagree"):
        write_pin("other", str(bad), tmp_path / "pins")
    assert not (tmp_path / "pins" / "other.json").exists()


# --- reference, converted_from, recipe, sources -------------------------------------------------------------

def _write(pins: Path, name: str, **fields: Any) -> Path:
    doc = {"name": name, "source": "twin:tiny#0", "model_class": "LlamaForCausalLM",
           "files": {"config.json": {"bytes": 1, "sha256": "0" * 64}}, **fields}
    pins.mkdir(exist_ok=True)
    (pins / f"{name}.json").write_text(json.dumps(doc))
    return pins / f"{name}.json"


RECIPE = {"tool": "mlx_lm.convert", "version": "0.32.2", "arguments": {"dtype": "bfloat16"}}


def test_conversion_source_fields_parse(tmp_path: Path) -> None:
    _write(tmp_path, "base")
    pin = load_pin(_write(tmp_path, "conv", source="mlx-convert:base", recipe=RECIPE, reference="base"))
    assert (pin.converted_from, pin.reference, pin.recipe) == ("base", "base", RECIPE)
    assert pin.reference_pin(PinStore((tmp_path,))).name == "base"
    assert pin.source_parts()["from_pin"] == "base"
    deq = load_pin(_write(tmp_path, "deq", source="dequantize:local:/models/q4", recipe={**RECIPE, "tool": "mx.dequantize"}))
    assert (deq.source_parts()["from_path"], deq.converted_from, deq.reference) == ("/models/q4", None, None)
    assert deq.reference_pin(PinStore((tmp_path,))) is deq


def test_unknown_reference_is_refused_when_it_is_loaded(tmp_path: Path) -> None:
    pin = load_pin(_write(tmp_path, "p", reference="nowhere"))  # parses: the reference may be pinned after
    with pytest.raises(PinError, match=r"p\.json: field 'reference' names unknown pin 'nowhere' \(searched .*\)$"):
        pin.reference_pin(PinStore((tmp_path,)))


@pytest.mark.parametrize(("fields", "message"), [
    ({"reference": "a/b"}, r"field 'reference' must be a pin name, got 'a/b'$"),
    ({"converted_from": 3}, r"field 'converted_from' must be a pin name, got 3$"),
    ({"source": "mlx-convert:base"}, r"field 'recipe' is missing: a mlx-convert: source needs the tool"),
    ({"source": "mlx-convert:base", "recipe": {**RECIPE, "tool": "mx.dequantize"}},
     r"field 'recipe\.tool' is 'mx\.dequantize' but a mlx-convert: source is made by mlx_lm\.convert$"),
    ({"source": "mlx-convert:base", "recipe": {"tool": "mlx_lm.convert"}}, r"field 'recipe' must be "),
    ({"source": "mlx-convert:base", "recipe": RECIPE, "converted_from": "other"},
     r"field 'converted_from' is 'other' but the source converts pin 'base'$"),
    ({"source": "convert:base"}, r"field 'source' 'convert:base' is not pypi:.*dequantize:PIN\|local:PATH$"),
    ({"precision": {"weights": "float32"}}, r"field 'precision\.compute' is None"),
])
def test_malformed_conversion_fields_are_one_line(tmp_path: Path, fields: dict[str, Any], message: str) -> None:
    with pytest.raises(PinError, match=message) as err:
        load_pin(_write(tmp_path, "p", **fields))
    assert str(err.value).startswith(str(tmp_path / "p.json")) and "\n" not in str(err.value)


# --- the built-in pins, as the interface table declares them --------------------------------------

TABLE = {
    "smollm2-135m-instruct": (Precision("float32", "float32", gguf_type="Q4_1", dequantized_from="smollm2-gguf-q4_1"),
                              None, None),
    "smollm2-mlx-bf16": (Precision("bfloat16", "bfloat16"), "smollm2-135m-instruct", "smollm2-135m-instruct"),
    "smollm2-mlx-q8": (Precision("affine", "float32", 8, 64, "affine"), "smollm2-mlx-q8-dequant", "smollm2-135m-instruct"),
    "smollm2-mlx-q4": (Precision("affine", "float32", 4, 64, "affine"), "smollm2-mlx-q4-dequant", "smollm2-135m-instruct"),
    "smollm2-mlx-q8-dequant": (Precision("float32", "float32", dequantized_from="smollm2-mlx-q8"), None, "smollm2-mlx-q8"),
    "smollm2-mlx-q4-dequant": (Precision("float32", "float32", dequantized_from="smollm2-mlx-q4"), None, "smollm2-mlx-q4"),
    "smollm2-gguf-q4_1": (Precision("Q4_1", "q8_1", gguf_type="Q4_1"), "smollm2-135m-instruct", None),
    "smollm2-gguf-f32": (Precision("float32", "float32", gguf_type="ALL_F32"), "smollm2-135m-instruct", "smollm2-135m-instruct"),
    "smollm2-draft-twin-litert": (Precision("float32", "float32"), "smollm2-draft-twin", "smollm2-draft-twin"),
    "smollm2-draft-twin-litert-plain": (Precision("float32", "float32"), "smollm2-draft-twin", "smollm2-draft-twin"),
}


@pytest.mark.parametrize("name", sorted(TABLE))
def test_builtin_pin_declares_the_table(name: str) -> None:
    pin = load_pin(name)
    assert (pin.precision, pin.reference, pin.converted_from) == TABLE[name]
    assert pin.reference_pin().name == (pin.reference or name)


@pytest.mark.parametrize("name", [n for n in TABLE if n.startswith(("smollm2-mlx", "smollm2-gguf"))])
def test_conversion_pins_share_the_default_tokenizer(name: str) -> None:
    """Token ids are kept per tokenizer: the conversions read the default pin's (the build fixes the one
    environment-dependent byte, ``local_files_only``)."""
    assert load_pin(name).tokenizer_sha256 == load_pin("smollm2-135m-instruct").tokenizer_sha256
