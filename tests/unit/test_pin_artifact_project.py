"""A user's own artifacts, pinned and run from a project outside the package: the draft twin's F32 GGUF (as
llama.cpp's converter makes it), its Q8_0 (libllama's ``llama_model_quantize``), its ``.tflite`` (as
litert-torch exports it) and its ``.onnx`` with the external-data file beside it (as torch.onnx.export
writes them), copied where a user keeps them, pinned with ``oracles pin --from FILE --reference PIN``
(the Q8_0 against ``oracles pin --dequantize-from`` of the same file), then the port family's "ping"
prefill on llama.cpp, LiteRT and ONNX Runtime in that project's own pytest run.

Slow: the inner run loads the torch reference, llama.cpp, LiteRT and ONNX Runtime; the dequantized
reference is built by transformers' GGUF reader.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import pytest

from oracles.pins.pin import load_pin, oracles_home

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: The session's ``$ORACLES_HOME``, read before pytester points ``$HOME`` into its own folder (the default
#: home is under ``$HOME``): where the built-in pins are built.
SESSION_HOME = oracles_home()
#: The built-in pins whose files stand in for a user's: the reference, its GGUF, its .tflite and its .onnx.
TWIN, TWIN_GGUF, TWIN_TFLITE = "smollm2-draft-twin", "smollm2-draft-twin-gguf-f32", "smollm2-draft-twin-litert"
TWIN_ONNX = "smollm2-draft-twin-onnx"


def quantize(src: Path, out: Path, ftype: str) -> Path:
    """``llama_model_quantize`` of ``src`` to the ``LLAMA_FTYPE_MOSTLY_<ftype>`` file ``out``, one thread."""
    from oracles.engines.llamacpp.native import load_library

    loaded = load_library()
    params = loaded.lib.llama_model_quantize_default_params()
    params.ftype, params.nthread = getattr(loaded.lib, f"LLAMA_FTYPE_MOSTLY_{ftype}"), 1
    status = loaded.lib.llama_model_quantize(str(src).encode(), str(out).encode(),
                                            loaded.ffi.new("llama_model_quantize_params *", params))
    assert status == 0, f"llama_model_quantize({src}, {ftype}) returned {status}"
    return out


@pytest.fixture
def user_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Path]:
    """The user's files, copied from the built pins: an F32 GGUF, its Q8_0, a folder holding a .tflite, and an
    .onnx beside its external-data file."""
    from oracles.pins.materialize import materialize

    monkeypatch.setenv("ORACLES_HOME", str(SESSION_HOME))
    for name in (TWIN, TWIN_GGUF, TWIN_TFLITE, TWIN_ONNX):
        materialize(load_pin(name))
    user = tmp_path / "models"
    (user / "exported").mkdir(parents=True)
    (user / "onnx").mkdir()
    f32 = user / "twin-f32.gguf"
    shutil.copyfile(SESSION_HOME / "snapshots" / TWIN_GGUF / "model.gguf", f32)
    shutil.copyfile(SESSION_HOME / "snapshots" / TWIN_TFLITE / "model.tflite", user / "exported" / "model.tflite")
    for name in ("model.onnx", "model.onnx.data"):  # the graph names its data file: it keeps that name
        shutil.copyfile(SESSION_HOME / "snapshots" / TWIN_ONNX / name, user / "onnx" / name)
    return {"gguf": f32, "q8": quantize(f32, user / "twin-q8_0.gguf", "Q8_0"), "tflite": user / "exported",
            "onnx": user / "onnx" / "model.onnx"}


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, user_files: dict[str, Path]) -> Path:
    """The project's own ``$ORACLES_HOME``: the reference twin's built snapshot and the tools (libllama's
    copy) linked from the session's, so the new pins' snapshots are written here and nowhere else."""
    session, home = SESSION_HOME, tmp_path / "home"
    (home / "snapshots").mkdir(parents=True)
    (home / "snapshots" / TWIN).symlink_to(session / "snapshots" / TWIN)
    (home / "tools").symlink_to(session / "tools")
    monkeypatch.setenv("ORACLES_HOME", str(home))
    return home


def test_a_users_gguf_tflite_and_onnx_run_the_port_family(pytester: pytest.Pytester, home: Path, user_files: dict[str, Path],
                                                     oracles_cli: Callable[..., tuple[int, str, str]],
                                                     only_receipt: Callable[..., Any]) -> None:
    for args in (["mine-gguf", "--from", str(user_files["gguf"]), "--reference", TWIN],
                 ["mine-tflite", "--from", str(user_files["tflite"]), "--reference", TWIN],
                 ["mine-q8-deq", "--dequantize-from", str(user_files["q8"]), "--untrained"],
                 ["mine-q8", "--from", str(user_files["q8"]), "--reference", "mine-q8-deq"],
                 ["mine-onnx", "--from", str(user_files["onnx"]), "--reference", TWIN]):
        status, out, err = oracles_cli("pin", *args)
        assert status == 0, err
    pins = pytester.path / "fixtures" / "pins"
    assert json.loads((pins / "mine-q8.json").read_text())["precision"] == {"weights": "Q8_0", "compute": "q8_0",
                                                                            "gguf_type": "Q8_0"}
    assert sorted(p.name for p in (home / "snapshots").iterdir()) == ["mine-gguf", "mine-onnx", "mine-q8", "mine-q8-deq",
                                                                      "mine-tflite", TWIN]
    assert (home / "snapshots" / "mine-onnx" / "model.onnx.data").is_symlink()
    result = pytester.runpytest_subprocess(
        "--pyargs", "oracles.suite.test_port", "--runslow", "-m", "port", "--port", "llamacpp,litert,onnxruntime",
        "--port-pin", "mine-gguf,mine-tflite,mine-q8,mine-onnx", "--oracle-threads", "1", "-p", "no:xdist",
        "-k", "test_prefill_vs_reference and ping and mine", "--receipts-dir", "receipts")
    result.assert_outcomes(passed=4)
    _, receipt = only_receipt(pytester.path / "receipts")
    held = {t["record_id"].split("-ping")[0]: t["data"] for t in receipt["tests"]}
    assert set(held) == {f"{TWIN}-llamacpp@mine-gguf", f"{TWIN}-litert@mine-tflite", "mine-q8-deq-llamacpp@mine-q8",
                         f"{TWIN}-onnxruntime@mine-onnx"}, held
    for exact in ("llamacpp@mine-gguf", "litert@mine-tflite", "onnxruntime@mine-onnx"):
        assert held[f"{TWIN}-{exact}"]["judgment"]["kind"] == "exact", held[f"{TWIN}-{exact}"]
    q8 = held["mine-q8-deq-llamacpp@mine-q8"]
    assert (q8["judgment"]["kind"], q8["judgment"]["dtype"], q8["tolerance"]) == ("band", "q8_0", "band x3"), q8
    assert 0 < q8["max_abs"] <= 3 * q8["band"]["max_abs"], q8  # llama.cpp's rounding is measured, within its band
    verified = {p["name"]: p["source"] for p in receipt["pins"]}
    assert verified["mine-gguf"] == f"file:{user_files['gguf']}" and verified["mine-q8"] == f"file:{user_files['q8']}"
    assert verified["mine-tflite"] == f"file:{user_files['tflite'] / 'model.tflite'}"
    assert verified["mine-onnx"] == f"file:{user_files['onnx']}"
