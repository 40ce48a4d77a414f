"""``oracles pin NAME --from FILE.gguf|FILE.tflite|FILE.onnx --reference PIN`` on tiny files made here
(:mod:`artifact_files`): the pin, its snapshot (the file and an ``.onnx``'s external data linked, the
reference's files copied), its verification and its rebuild; the precision read from the file; every
refusal one line naming the file and the field, with nothing written (no pin file, no snapshot folder).

Not dry: a GGUF is held to llama.cpp's own list of architectures by loading its vocabulary with libllama
(~0.7 s the first time in a process, milliseconds after); a ``.tflite`` is read with ai-edge-litert's schema,
an ``.onnx`` with the ``onnx`` package (no runtime).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest
from artifact_files import TOKENS, reference_snapshot, tiny_gguf, tiny_onnx, tiny_tflite
from test_pin_command_dry import error_line

from oracles.errors import PinError
from oracles.pins.pin import PinStore, load_pin, oracles_home, snapshot_dir, verify_snapshot

#: The libraries the kinds read their files with, found without importing them: collection (``pytest -m dry``
#: too) does not pay their imports (~1.4 s together); the tests import them when they run.
MISSING = [m for m in ("llama_cpp_py_sync", "ai_edge_litert", "onnx") if importlib.util.find_spec(m) is None]
pytestmark = pytest.mark.skipif(bool(MISSING), reason=f"not installed: {', '.join(MISSING)}")

#: The ``$ORACLES_HOME`` of the session, before a test points it into its tmp_path: its ``tools`` folder holds
#: the one copy of libllama this process opens (llama.cpp's log callback is installed on the first copy
#: opened, so a second copy in a test's own home would log to stderr, not to the engine's error lines).
SESSION_HOME = oracles_home()
#: The arguments after --from FILE that name the tiny reference pin.
REF = ["--reference", "ref"]


class _Quiet:
    def start(self, name: str, size: int) -> None: ...
    def update(self, n: int) -> None: ...
    def finish_file(self) -> None: ...
    def close(self) -> None: ...


def shared_tools(tmp_path: Path) -> None:
    """The test's ``$ORACLES_HOME/tools`` (:func:`conftest.pin_project`'s home) is the session's (:data:`SESSION_HOME`)."""
    (SESSION_HOME / "tools").mkdir(parents=True, exist_ok=True)
    (tmp_path / "home").mkdir(exist_ok=True)
    (tmp_path / "home" / "tools").symlink_to(SESSION_HOME / "tools")


@pytest.fixture
def reference(pin_project: Path, tmp_path: Path) -> Path:
    """The untrained local pin ``ref`` of :func:`artifact_files.reference_snapshot`; returns its folder."""
    from oracles.pins.writer import write_pin

    shared_tools(tmp_path)
    root = reference_snapshot(tmp_path / "ref")
    write_pin("ref", str(root), pin_project / "fixtures" / "pins", trained=False, progress=_Quiet())
    return root


@pytest.fixture
def pin_cli(oracles_cli: Callable[..., tuple[int, str, str]]) -> Callable[..., tuple[int, str, str]]:
    """``oracles pin mine --from FILE --reference ref`` with extra arguments."""
    return lambda source, *extra: oracles_cli("pin", "mine", "--from", str(source), *extra)


def _nothing_written(project: Path) -> None:
    assert sorted(p.name for p in (project / "fixtures" / "pins").iterdir()) == ["ref.json"]
    assert not (oracles_home() / "snapshots" / "mine").exists()
    assert not list((oracles_home() / "snapshots").glob(".mine.*")), "a temporary build folder was left behind"


def test_a_gguf_is_pinned_beside_the_references_tokenizer(pin_project: Path, reference: Path, tmp_path: Path,
                                                          pin_cli: Any) -> None:
    gguf = tiny_gguf(tmp_path / "user" / "model.gguf")
    status, out, err = pin_cli(gguf, "--reference", "ref")
    assert status == 0, err
    assert "next: pytest --pyargs oracles.suite -m port --runslow --port llamacpp --port-pin mine" in out, out
    obj = json.loads((pin_project / "fixtures" / "pins" / "mine.json").read_text())
    assert obj["source"] == f"file:{gguf}" and obj["reference"] == "ref" and obj["trained"] is False
    assert obj["source_sha256"] == hashlib.sha256(gguf.read_bytes()).hexdigest() == obj["files"]["model.gguf"]["sha256"]
    assert sorted(obj["files"]) == ["model.gguf", "tokenizer.json", "tokenizer_config.json"]
    assert obj["precision"] == {"weights": "float32", "compute": "float32", "gguf_type": "ALL_F32"}
    assert obj["model_class"] == "LlamaForCausalLM"
    pin = load_pin("mine", PinStore.with_project(pin_project / "fixtures" / "pins"))
    root = snapshot_dir(pin)
    assert root == oracles_home() / "snapshots" / "mine"
    assert (root / "model.gguf").is_symlink() and os.readlink(root / "model.gguf") == str(gguf)
    assert (root / "tokenizer.json").read_bytes() == (reference / "tokenizer.json").read_bytes()
    assert verify_snapshot(pin, root)["files"] == 3
    assert pin.tokenizer_sha256 == load_pin("ref", PinStore.with_project(pin_project / "fixtures" / "pins")).tokenizer_sha256


def test_a_folder_holding_one_gguf_and_its_tokenizer_files_is_that_gguf(pin_project: Path, reference: Path,
                                                                        tmp_path: Path, pin_cli: Any) -> None:
    folder = tmp_path / "user"
    tiny_gguf(folder / "model.gguf")
    for name in ("tokenizer.json", "tokenizer_config.json", "config.json"):
        shutil.copyfile(reference / name, folder / name)
    status, _, err = pin_cli(folder, "--reference", "ref")
    assert status == 0, err
    assert json.loads((pin_project / "fixtures" / "pins" / "mine.json").read_text())["source"] == f"file:{folder / 'model.gguf'}"


def test_a_tflite_is_pinned_with_the_references_config_and_tokenizer(pin_project: Path, reference: Path,
                                                                     tmp_path: Path, pin_cli: Any) -> None:
    tflite = tiny_tflite(tmp_path / "user" / "model.tflite")
    status, out, err = pin_cli(tflite, "--reference", "ref")
    assert status == 0, err
    assert "--port litert --port-pin mine" in out, out
    obj = json.loads((pin_project / "fixtures" / "pins" / "mine.json").read_text())
    assert sorted(obj["files"]) == ["config.json", "generation_config.json", "model.tflite", "tokenizer.json",
                                    "tokenizer_config.json"]
    assert obj["precision"] == {"weights": "float32", "compute": "float32"}
    pin = load_pin("mine", PinStore.with_project(pin_project / "fixtures" / "pins"))
    assert (snapshot_dir(pin) / "model.tflite").is_symlink()
    verify_snapshot(pin, snapshot_dir(pin))


@pytest.mark.parametrize(("weights", "precision"), [("FLOAT16", {"weights": "float16", "compute": "float32"}),
                                                    ("INT8", {"weights": "int8", "compute": "dynamic_int8"})])
def test_a_tflites_precision_is_its_constants(pin_project: Path, reference: Path, tmp_path: Path, pin_cli: Any,
                                              weights: str, precision: dict[str, str]) -> None:
    status, _, err = pin_cli(tiny_tflite(tmp_path / "user" / "m.tflite", weights=weights), "--reference", "ref")
    assert status == 0, err
    assert json.loads((pin_project / "fixtures" / "pins" / "mine.json").read_text())["precision"] == precision


def test_an_onnx_is_pinned_with_its_external_data_beside_it(pin_project: Path, reference: Path, tmp_path: Path,
                                                             pin_cli: Any, oracles_cli: Any) -> None:
    """The graph and the external-data file it names are linked, both digests pinned and verified every session;
    a changed data file is refused by name, and ``oracles materialize`` links it again."""
    onnx = tiny_onnx(tmp_path / "user" / "model.onnx")
    status, out, err = pin_cli(onnx.parent, "--reference", "ref")  # a folder: the one .onnx beside its data
    assert status == 0, err
    assert "--port onnxruntime --port-pin mine" in out, out
    obj = json.loads((pin_project / "fixtures" / "pins" / "mine.json").read_text())
    assert obj["source"] == f"file:{onnx}" and obj["source_sha256"] == obj["files"]["model.onnx"]["sha256"]
    assert sorted(obj["files"]) == ["config.json", "generation_config.json", "model.onnx", "model.onnx.data",
                                    "tokenizer.json", "tokenizer_config.json"]
    data = onnx.parent / "model.onnx.data"
    assert obj["files"]["model.onnx.data"]["sha256"] == hashlib.sha256(data.read_bytes()).hexdigest()
    assert obj["precision"] == {"weights": "float32", "compute": "float32"}
    pin = load_pin("mine", PinStore.with_project(pin_project / "fixtures" / "pins"))
    root = snapshot_dir(pin)
    assert os.readlink(root / "model.onnx") == str(onnx) and os.readlink(root / "model.onnx.data") == str(data)
    assert verify_snapshot(pin, root)["files"] == 6
    from oracles.engines.onnx.artifact import onnx_facts

    assert onnx_facts(root / "model.onnx")["external_data"] == {"model.onnx.data": 192}  # as the engine reads the links
    pin_file = pin_project / "fixtures" / "pins" / "mine.json"
    pin_file.write_text(json.dumps({**obj, "precision": {"weights": "int8", "compute": "dynamic_uint8"}}))
    with pytest.raises(PinError, match=r"mine\.json: field 'precision\.weights' is 'int8' but .*model\.onnx holds 'float32'"):
        verify_snapshot(load_pin(pin_file), root)  # the graph's precision, checked as every kind's
    pin_file.write_text(json.dumps(obj))
    data.write_bytes(data.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(PinError, match=r"model\.onnx\.data: sha256 mismatch: expected .*changed since pin 'mine'"):
        verify_snapshot(pin, root)
    data.write_bytes(data.read_bytes()[:-4] + np.float32(1).tobytes())  # the tiny graph's last weight is 1.0
    shutil.rmtree(root)
    status, out, err = oracles_cli("materialize", "mine")
    assert status == 0 and json.loads(out)["built"] is True, err
    assert os.readlink(root / "model.onnx.data") == str(data)


def test_a_quantized_gguf_reads_its_type_and_rounding(pin_project: Path, tmp_path: Path, oracles_cli: Any) -> None:
    from oracles.pins.writer import write_pin

    shared_tools(tmp_path)
    write_pin("ref", str(reference_snapshot(tmp_path / "ref", hidden=32)), pin_project / "fixtures" / "pins",
              trained=False, progress=_Quiet())
    status, _, err = oracles_cli("pin", "mine", "--from", str(tiny_gguf(tmp_path / "q.gguf", hidden=32, quantize="Q8_0")),
                                 "--reference", "ref")
    assert status == 0, err
    obj = json.loads((pin_project / "fixtures" / "pins" / "mine.json").read_text())
    assert obj["precision"] == {"weights": "Q8_0", "compute": "q8_0", "gguf_type": "Q8_0"}


def _refusals(tmp: Path) -> dict[str, tuple[Path, list[str], str]]:
    """name -> (the --from path, the arguments after it, the refusal's expected text: a regex)."""
    def truncated(path: Path) -> Path:
        path.write_bytes(path.read_bytes()[:-7])
        return path

    def missing_data(path: Path) -> Path:
        (path.parent / "model.onnx.data").unlink()
        return path

    def data_outside(path: Path) -> Path:
        """The graph's data file moved up out of its folder, and its location so named (onnx's own writer
        refuses to write a location with ``..``, so the graph is edited and serialized here)."""
        import onnx

        model = onnx.load(str(path), load_external_data=False)
        for entry in model.graph.initializer[0].external_data:
            if entry.key == "location":
                entry.value = "../model.onnx.data"
        (path.parent / "model.onnx.data").rename(path.parent.parent / "model.onnx.data")
        path.write_bytes(model.SerializeToString())
        return path

    other = [*TOKENS[:2], "B", *TOKENS[3:]]
    return {
        "unknown architecture": (tiny_gguf(tmp / "arch" / "m.gguf", arch="nonesuch"), REF,
                                 r"m\.gguf: field 'general.architecture' is 'nonesuch', which llama\.cpp \S+ \(\w+\) does "
                                 r"not know \(.*unknown model architecture: 'nonesuch'"),
        "another vocabulary": (tiny_gguf(tmp / "vocab" / "m.gguf", tokens=other), REF,
                               r"m\.gguf: field 'tokenizer\.ggml\.tokens' differs from .*ref/tokenizer\.json: first at id 2 "
                               r"\('B' vs 'b'\), 1 of 6 ids differ"),
        "another width": (tiny_gguf(tmp / "width" / "m.gguf", hidden=16), REF,
                          r"m\.gguf: field 'llama\.embedding_length' is 16 but the reference pin ref has hidden_size 8 "
                          r"\(.*ref/config\.json\): not a conversion of that model"),
        "truncated gguf": (truncated(tiny_gguf(tmp / "cut" / "m.gguf")), REF,
                           r"m\.gguf: truncated: tensor 'token_embd\.weight' ends at byte \d+ but the file has \d+ bytes"),
        "no hidden output": (tiny_tflite(tmp / "nohidden" / "m.tflite", outputs=("logits",)), REF,
                             r"m\.tflite: field 'signatures\.serving_default\.outputs\.hidden' is None; the engine "
                             r"contract returns the final norm's hidden state"),
        "no signatures": (tiny_tflite(tmp / "nosig" / "m.tflite", signatures=False), REF,
                          r"m\.tflite: field 'signatures' has no prefill_<T> signature and 0 signatures"),
        "truncated tflite": (truncated(tiny_tflite(tmp / "cuttfl" / "m.tflite")), REF,
                             r"m\.tflite: truncated or damaged: its flatbuffer cannot be read in its \d+ bytes"),
        "tflite of another width": (tiny_tflite(tmp / "tflwidth" / "m.tflite", hidden=16), REF,
                                    r"m\.tflite: field 'signatures\.serving_default\.outputs\.hidden' is 16 but the "
                                    r"reference pin ref has hidden_size 8"),
        "onnx inputs": (tiny_onnx(tmp / "onnxin" / "m.onnx", inputs=("input_ids", "use_cache_branch")), REF,
                        r"m\.onnx: input 'use_cache_branch' is not one this engine feeds \(input_ids, past_key_values"),
        "onnx without hidden": (tiny_onnx(tmp / "onnxout" / "m.onnx", outputs=False), REF,
                                r"m\.onnx: output 'hidden' is missing \(the final norm's output"),
        "onnx data missing": (missing_data(tiny_onnx(tmp / "onnxdata" / "m.onnx")), REF,
                              r"m\.onnx: external-data file model\.onnx\.data is missing \(its tensors need 192 bytes\)"),
        "onnx data outside its folder": (data_outside(tiny_onnx(tmp / "onnxup" / "in" / "m.onnx")), REF,
                                         r"m\.onnx: field 'initializer\.external_data\.location' is '\.\./model\.onnx\.data', "
                                         r"not a file beside the \.onnx$"),
        "truncated onnx": (truncated(tiny_onnx(tmp / "cutonnx" / "m.onnx")), REF,
                           r"m\.onnx: not a loadable \.onnx \(\d+ bytes; truncated\?\): "),
        "onnx of another width": (tiny_onnx(tmp / "onnxwidth" / "m.onnx", hidden=16), REF,
                                  r"m\.onnx: field 'outputs\.hidden\.shape\[-1\]' is 16 but the reference pin ref has "
                                  r"hidden_size 8"),
        "no reference": (tiny_gguf(tmp / "noref" / "m.gguf"), [],
                         r"a \.gguf artifact needs --reference PIN, the float32 pin it is held against"),
        "unknown reference": (tiny_gguf(tmp / "badref" / "m.gguf"), ["--reference", "nope"],
                              r"--reference nope: unknown pin 'nope'"),
    }


REFUSALS = ["unknown architecture", "another vocabulary", "another width", "truncated gguf", "no hidden output",
            "no signatures", "truncated tflite", "tflite of another width", "onnx inputs", "onnx without hidden",
            "onnx data missing", "onnx data outside its folder", "truncated onnx", "onnx of another width",
            "no reference", "unknown reference"]


@pytest.mark.parametrize("case", REFUSALS)
def test_each_refusal_is_one_line_and_writes_nothing(pin_project: Path, reference: Path, tmp_path: Path,
                                                     pin_cli: Any, case: str) -> None:
    path, extra, want = _refusals(tmp_path / "user")[case]
    status, _, err = pin_cli(path, *extra)
    line = error_line(err)
    assert status == 2 and re.search(want, line), line
    assert str(path) in line or case in ("no reference", "unknown reference"), line
    _nothing_written(pin_project)


def test_a_file_no_kind_reads_or_a_folder_of_two_is_refused(pin_project: Path, reference: Path, tmp_path: Path,
                                                           pin_cli: Any) -> None:
    (tmp_path / "model.bin").write_bytes(b"x")
    status, _, err = pin_cli(tmp_path / "model.bin", "--reference", "ref")
    assert status == 2 and "is a file but not an artifact oracles pin reads (.gguf, .tflite, .pte, .onnx)" in error_line(err)
    tiny_gguf(tmp_path / "two" / "a.gguf")
    tiny_tflite(tmp_path / "two" / "b.tflite")
    status, _, err = pin_cli(tmp_path / "two", "--reference", "ref")
    assert status == 2 and "holds 2 artifacts (a.gguf, b.tflite); name the one to pin: --from FILE" in error_line(err)
    _nothing_written(pin_project)


def test_materialize_rebuilds_the_snapshot_and_refuses_a_changed_file(pin_project: Path, reference: Path,
                                                                      tmp_path: Path, pin_cli: Any,
                                                                      oracles_cli: Any) -> None:
    gguf = tiny_gguf(tmp_path / "user" / "model.gguf")
    assert pin_cli(gguf, "--reference", "ref")[0] == 0
    pin = load_pin("mine", PinStore.with_project(pin_project / "fixtures" / "pins"))
    shutil.rmtree(snapshot_dir(pin))
    status, out, err = oracles_cli("materialize", "mine")
    assert status == 0 and json.loads(out)["built"] is True, err
    gguf.write_bytes(gguf.read_bytes()[:-4] + b"\0\0\0\1")
    with pytest.raises(PinError, match=r"model\.gguf: sha256 mismatch: expected .*changed since pin 'mine' was written"):
        verify_snapshot(pin, snapshot_dir(pin))
    shutil.rmtree(snapshot_dir(pin))
    status, _, err = oracles_cli("materialize", "mine")
    assert status == 2 and re.search(rf"{gguf}: sha256 mismatch: expected \w+, actual \w+; the file changed since pin "
                                     r"'mine' was written", error_line(err)), err
