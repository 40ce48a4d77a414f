"""oracles.faults.gguf on a tiny GGUF written here with the ``gguf`` package (no llama.cpp, no weights):
each fault changes its one field or tensor and leaves every other byte of the file as it was; the k rows
go back to transformers' order (the inverse of convert_hf_to_gguf's permute, written out here from its
formula); a file is never written over, a fault that would change nothing is refused. And the llama.cpp
taps' mapping (oracles.engines.llamacpp.taps.taps_of) refuses a stage its graph did not compute."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from oracles.errors import OracleError
from oracles.faults.gguf import GGUF_FAULTS, unpermute, write_fault_pin, write_faulty_gguf

pytestmark = pytest.mark.dry

N_LAYER, N_HEAD_KV, HEAD_DIM, WIDTH = 2, 2, 8, 16


def convert_permute(weights: np.ndarray, n_head: int) -> np.ndarray:
    """convert_hf_to_gguf.py's ``LlamaModel.permute`` (llama-cpp-python 0.3.36's vendored copy), as written there."""
    return weights.reshape(n_head, 2, weights.shape[0] // n_head // 2, *weights.shape[1:]).swapaxes(1, 2).reshape(weights.shape)


def tiny_gguf(path: Path, rope_base: float = 100_000.0) -> dict[str, np.ndarray]:
    """A llama-architecture GGUF header and tensors (the faults' fields; random F32 weights)."""
    import gguf

    rng = np.random.default_rng(0)
    tensors = {f"blk.{i}.{n}.weight": rng.standard_normal(shape).astype(np.float32)
               for i in range(N_LAYER) for n, shape in (("attn_k", (N_HEAD_KV * HEAD_DIM, WIDTH)), ("attn_q", (WIDTH, WIDTH)))}
    w = gguf.GGUFWriter(path, "llama")
    w.add_file_type(0)  # ALL_F32, what a GGUF pin reads its precision from
    w.add_block_count(N_LAYER)
    w.add_head_count(WIDTH // HEAD_DIM)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_freq_base(rope_base)
    w.add_layer_norm_rms_eps(1e-5)
    for name, data in tensors.items():
        w.add_tensor(name, data)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return tensors


def read(path: Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    from gguf import GGUFReader

    r = GGUFReader(path)
    fields = {k: f.contents() for k, f in r.fields.items()}
    return fields, {t.name: np.array(t.data) for t in r.tensors}


def test_unpermute_inverts_the_converters_permute() -> None:
    w = np.arange(N_HEAD_KV * HEAD_DIM * 3, dtype=np.float32).reshape(N_HEAD_KV * HEAD_DIM, 3)
    permuted = convert_permute(w, N_HEAD_KV)
    assert not np.array_equal(permuted, w)  # a permute that moved nothing would prove nothing
    assert np.array_equal(unpermute(permuted, N_HEAD_KV), w)


@pytest.mark.parametrize("name", list(GGUF_FAULTS))
def test_each_fault_changes_its_one_place(tmp_path: Path, name: str) -> None:
    src, dest = tmp_path / "faithful.gguf", tmp_path / "faulty.gguf"
    tiny_gguf(src)
    record = write_faulty_gguf(src, dest, name, layer=1)
    (before, tensors), (after, faulty) = read(src), read(dest)
    changed_fields = {k for k in before if before[k] != after[k]}
    changed_tensors = {k for k in tensors if not np.array_equal(tensors[k], faulty[k])}
    assert record["kind"] == name and record["n_layer"] == N_LAYER
    if name == "k_rows_unpermuted":
        assert changed_fields == set() and changed_tensors == {"blk.1.attn_k.weight"}
        assert np.array_equal(convert_permute(faulty["blk.1.attn_k.weight"], N_HEAD_KV), tensors["blk.1.attn_k.weight"])
        assert (record["stage"], record["block"]) == ("layer 1", "attention")
    elif name == "rope_base_10000":
        assert changed_fields == {"llama.rope.freq_base"} and not changed_tensors
        assert after["llama.rope.freq_base"] == 10_000.0
        assert (record["stage"], record["block"]) == ("layer 0", "attention")
    else:
        assert changed_fields == {"llama.attention.layer_norm_rms_epsilon"} and not changed_tensors
        assert after["llama.attention.layer_norm_rms_epsilon"] == pytest.approx(1e-6)
        assert (record["stage"], record["block"]) == ("layer 0", "attention norm")
    assert src.stat().st_size == dest.stat().st_size


def test_refusals(tmp_path: Path) -> None:
    src = tmp_path / "faithful.gguf"
    tiny_gguf(src)
    (tmp_path / "taken.gguf").write_bytes(b"")
    with pytest.raises(OracleError, match="taken.gguf: exists; a faulty GGUF is never written over a file"):
        write_faulty_gguf(src, tmp_path / "taken.gguf", "rms_eps_tenth")
    with pytest.raises(OracleError, match="unknown GGUF fault 'nope'; known: k_rows_unpermuted, "):
        write_faulty_gguf(src, tmp_path / "a.gguf", "nope")
    with pytest.raises(OracleError, match=r"layer 5 is not one of its 2 layers \(llama.block_count\)"):
        write_faulty_gguf(src, tmp_path / "b.gguf", "k_rows_unpermuted", layer=5)
    tiny_gguf(tmp_path / "default.gguf", rope_base=10_000.0)
    with pytest.raises(OracleError, match="'llama.rope.freq_base' is 10000 already"):
        write_faulty_gguf(tmp_path / "default.gguf", tmp_path / "c.gguf", "rope_base_10000")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default.gguf", "faithful.gguf", "taken.gguf"]  # no leftovers


def test_fault_pin_is_the_artifacts_pin_with_the_faulty_file(tmp_path: Path) -> None:
    from oracles.pins.pin import load_pin, sha256_file, verify_snapshot

    root = tmp_path / "faithful"
    root.mkdir()
    tiny_gguf(root / "model.gguf")
    (root / "tokenizer.json").write_text("{}")
    doc = {"name": "tiny-gguf", "source": "gguf-convert:tiny", "model_class": "LlamaForCausalLM", "reference": "tiny",
           "recipe": {"tool": "convert_hf_to_gguf.py", "version": "x==1", "arguments": {}}, "source_sha256": "0" * 64,
           "precision": {"weights": "float32", "compute": "float32", "gguf_type": "ALL_F32"},
           "files": {n: {"bytes": (root / n).stat().st_size, "sha256": sha256_file(root / n)}
                     for n in ("model.gguf", "tokenizer.json")}}
    (tmp_path / "tiny-gguf.json").write_text(json.dumps(doc))
    artifact = load_pin(tmp_path / "tiny-gguf.json")
    pin_file = write_fault_pin(artifact, root, "rms_eps_tenth", tmp_path / "pins", tmp_path / "snaps")
    pin = load_pin(pin_file)
    assert pin.name == "tiny-gguf-rms_eps_tenth" and pin.reference == "tiny" and pin.recipe is None
    assert pin.source == f"local:{(tmp_path / 'snaps' / pin.name).resolve()}"
    verify_snapshot(pin, tmp_path / "snaps" / pin.name)
    assert pin.files["tokenizer.json"] == artifact.files["tokenizer.json"]
    assert pin.files["model.gguf"].sha256 != artifact.files["model.gguf"].sha256
    assert json.loads(pin_file.read_text())["fault"]["changed"]["field"] == "llama.attention.layer_norm_rms_epsilon"
    with pytest.raises(OracleError, match="exists; a fault pin is never written over one"):
        write_fault_pin(artifact, root, "rms_eps_tenth", tmp_path / "pins", tmp_path / "snaps")


def test_taps_name_the_stage_llamacpp_did_not_compute() -> None:
    from oracles.engines.llamacpp.taps import taps_of, wanted_names
    from oracles.engines.types import Unsupported

    t, d = 3, 4
    found = {name: np.full((t, d), i, np.float32) for i, name in enumerate(sorted(wanted_names(N_LAYER)))}
    taps = taps_of(found, np.zeros((t, 5), np.float32), np.zeros((t, d), np.float32), N_LAYER, "llamacpp")
    assert np.array_equal(taps.stream[0], found["embd"]) and np.array_equal(taps.stream[2], found["l_out-1"])
    assert np.array_equal(taps.attn[1], found["attn_out-1"]) and np.array_equal(taps.mlp[0], found["ffn_out-0"])
    assert taps.attn_norm is not None and np.array_equal(taps.attn_norm[1], found["attn_norm-1"])
    assert taps.mlp_norm is not None and np.array_equal(taps.mlp_norm[0], found["ffn_norm-0"])
    del found["ffn_norm-1"]
    with pytest.raises(Unsupported, match="cannot tap layer 1's MLP norm: llama.cpp's graph computed no tensor named "
                                          "'ffn_norm-1'"):
        taps_of(found, np.zeros((t, 5), np.float32), np.zeros((t, d), np.float32), N_LAYER, "llamacpp")
