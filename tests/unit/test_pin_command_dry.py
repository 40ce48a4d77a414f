"""``oracles pin NAME --from PATH``: what a pin file holds, what is refused (one line each, nothing
written), a local pin's snapshot verified in place, and ``oracles records`` right after.

Snapshots are tiny and hand-made in tmp_path (a hand-written safetensors file, SmolLM2's tokenizer
files copied from the package); expected digests are computed here with hashlib, not by the code
under test. The command runs in-process from a project folder (its ini file names the pins folder).
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

import oracles.pins.pin as pins
from oracles.errors import PinError
from oracles.families import DEFAULT_PIN
from oracles.families.records import RECORDS, TOKENIZER_COPIES
from oracles.pins.pin import PinStore, load_pin
from oracles.pins.writer import LineProgress, Snapshot, hash_files, progress_for

pytestmark = pytest.mark.dry

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def safetensors_bytes(values: list[float]) -> bytes:
    """A one-tensor float32 safetensors file, written by hand (format: 8-byte header length, JSON, data)."""
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(values)}f", *values)


def make_snapshot(root: Path, config: dict[str, Any] | None = None, weights: bool = True) -> Path:
    """A snapshot folder: config.json, model.safetensors, SmolLM2's tokenizer files, and a hidden
    download-metadata folder (``hf download --local-dir`` keeps one) that must not be pinned."""
    root.mkdir(parents=True)
    cfg = {"architectures": ["LlamaForCausalLM"], "hidden_size": 2} if config is None else config
    (root / "config.json").write_text(json.dumps(cfg))
    if weights:
        (root / "model.safetensors").write_bytes(safetensors_bytes([1.0, 2.0, 3.0]))
    for name in TOKENIZER_FILES:
        shutil.copyfile(TOKENIZER_COPIES / DEFAULT_PIN / name, root / name)
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / "model.safetensors.metadata").write_text("etag\n")
    return root


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    return make_snapshot(tmp_path / "snap")


def error_line(err: str) -> str:
    """The one error line of a refused command (tqdm's progress may precede it on stderr)."""
    lines = [line for line in err.splitlines() if line.startswith("oracles ")]
    assert len(lines) == 1, f"expected one error line, got: {err!r}"
    return lines[0]


def test_pin_records_every_file_header_class_and_versions(pin_project: Path, snapshot: Path, oracles_cli: Any) -> None:
    status, out, _ = oracles_cli("pin", "tiny", "--from", str(snapshot))
    assert status == 0, out
    path = pin_project / "fixtures" / "pins" / "tiny.json"
    obj = json.loads(path.read_text())
    expected = {p.name: {"bytes": len(p.read_bytes()), "sha256": hashlib.sha256(p.read_bytes()).hexdigest()}
                for p in snapshot.iterdir() if p.is_file()}
    assert obj["files"] == expected, "every file but the hidden download metadata, with its size and sha256"
    st = (snapshot / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", st[:8])
    assert obj["safetensors_headers"] == {"model.safetensors": hashlib.sha256(st[: 8 + n]).hexdigest()}
    assert obj["source"] == f"local:{snapshot.resolve()}" and obj["model_class"] == "LlamaForCausalLM"
    assert obj["built_with"]["pytest-oracles"] and "trained" not in obj
    assert f"wrote {path}" in out
    pin = load_pin(path)
    assert pin.trained and not pin.untrained and pin.modality == "text"


def test_untrained_flag_is_written_and_read(pin_project: Path, snapshot: Path, oracles_cli: Any, project_pins: PinStore) -> None:
    assert oracles_cli("pin", "rand", "--from", str(snapshot), "--untrained")[0] == 0
    obj = json.loads((pin_project / "fixtures" / "pins" / "rand.json").read_text())
    assert obj["trained"] is False
    pin = load_pin("rand", project_pins)
    assert pin.untrained and not pin.trained


@pytest.mark.parametrize("name", ["tiny", DEFAULT_PIN])
def test_an_existing_pin_is_never_overwritten(pin_project: Path, snapshot: Path, oracles_cli: Any, name: str) -> None:
    """A pin of the project's, or a built-in one (which a project pin of that name would shadow)."""
    if name == "tiny":
        assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    before = {p.name: p.read_bytes() for p in (pin_project / "fixtures" / "pins").glob("*.json")} if name == "tiny" else {}
    status, _, err = oracles_cli("pin", name, "--from", str(snapshot))
    line = error_line(err)
    assert status == 2 and f"pin {name!r} already exists: " in line and "never overwritten" in line, line
    after = {p.name: p.read_bytes() for p in (pin_project / "fixtures" / "pins").glob("*.json")} if name == "tiny" else {}
    assert after == before
    if name != "tiny":
        assert not (pin_project / "fixtures").exists()


@pytest.mark.parametrize("what, message", [
    ("no-config", "not a model snapshot: no config.json (found "),
    ("no-weights", "not a model snapshot: no weights (*.safetensors or pytorch_model*.bin; found "),
    ("no-architectures", "config.json: field 'architectures' is missing or not a list of class names"),
    ("missing-shard", "model.safetensors.index.json: names weights shard model-00002-of-00002.safetensors that is "
                      "not in the snapshot (1 missing)"),
    ("no-folder", "does not exist; expected a snapshot folder (config.json and weights) or hf:REPO@REVISION"),
])
def test_a_folder_that_is_not_a_snapshot_is_one_line(pin_project: Path, tmp_path: Path, oracles_cli: Any, what: str,
                                                     message: str) -> None:
    root = tmp_path / "bad"
    if what != "no-folder":
        make_snapshot(root, config={"hidden_size": 2} if what == "no-architectures" else None,
                      weights=what != "no-weights")
    if what == "no-config":
        (root / "config.json").unlink()
    if what == "missing-shard":
        index = {"weight_map": {"a": "model.safetensors", "b": "model-00002-of-00002.safetensors"}}
        (root / "model.safetensors.index.json").write_text(json.dumps(index))
    status, _, err = oracles_cli("pin", "tiny", "--from", str(root))
    line = error_line(err)
    assert status == 2 and message in line, line
    assert not (pin_project / "fixtures").exists(), "nothing written"


def test_a_name_that_is_no_file_stem_is_refused(pin_project: Path, snapshot: Path, oracles_cli: Any) -> None:
    status, _, err = oracles_cli("pin", "../escape", "--from", str(snapshot))
    assert status == 2 and "use letters, digits, '.', '_' and '-'" in error_line(err)


def test_local_pin_is_verified_in_place(pin_project: Path, snapshot: Path, tmp_path: Path, oracles_cli: Any,
                                        project_pins: PinStore) -> None:
    """``oracles materialize`` of a local pin builds nothing: it verifies the pinned folder itself."""
    assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    assert pins.snapshot_dir(load_pin("tiny", project_pins)) == snapshot.resolve()
    status, out, _ = oracles_cli("materialize", "tiny")
    result = json.loads(out)
    assert status == 0 and result["root"] == str(snapshot.resolve()) and result["built"] is False
    assert result["files"] == 5 and not (tmp_path / "home").exists(), "nothing copied under $ORACLES_HOME"


def test_several_pins_are_verified_in_order_and_dest_takes_one(pin_project: Path, snapshot: Path, oracles_cli: Any) -> None:
    """``oracles materialize A B`` builds or verifies each in order in one process (one JSON result each);
    ``--dest`` names one folder, so with two names it is refused before anything is built."""
    assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    status, out, _ = oracles_cli("materialize", "tiny", "tiny")
    results = [json.loads(part) for part in out.replace("}\n{", "}\0{").split("\0")]
    assert status == 0 and [r["root"] for r in results] == [str(snapshot.resolve())] * 2
    status, _, err = oracles_cli("materialize", "tiny", "tiny", "--dest", str(snapshot.parent / "elsewhere"))
    assert status == 2 and "--dest takes one pin; got 2: tiny tiny" in error_line(err)
    assert not (snapshot.parent / "elsewhere").exists()


def test_snapshot_changed_since_pinned_is_one_line(pin_project: Path, snapshot: Path, oracles_cli: Any) -> None:
    assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    data = bytearray((snapshot / "model.safetensors").read_bytes())
    data[-1] ^= 0x01  # same size, one bit of one weight
    (snapshot / "model.safetensors").write_bytes(bytes(data))
    status, _, err = oracles_cli("materialize", "tiny")
    line = error_line(err)
    assert status == 2 and f"{snapshot.resolve()}/model.safetensors: sha256 mismatch: expected " in line, line
    assert "the snapshot changed since pin 'tiny' was written" in line, line


@pytest.mark.parametrize("family", ["mtplx", "d1"])
def test_records_right_after_pin(pin_project: Path, snapshot: Path, oracles_cli: Any, family: str,
                                 project_pins: PinStore) -> None:
    """The pin's tokenizer is SmolLM2's: the ids ``oracles records`` writes for it are the built-in ones."""
    assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    status, out, _ = oracles_cli("records", family, "--pin", "tiny")
    assert status == 0, out
    written = json.loads((pin_project / "fixtures" / "records" / family / "tokens" / "tiny.json").read_text())
    builtin = json.loads((RECORDS / family / "tokens" / f"{DEFAULT_PIN}.json").read_text())
    assert written["tokenizer_sha256"] == load_pin("tiny", project_pins).tokenizer_sha256 == builtin["tokenizer_sha256"]
    assert written["pin"] == "tiny" and set(written) == set(builtin)
    assert {k: v for k, v in written.items() if k not in ("pin", "generated_by")} == {
        k: v for k, v in builtin.items() if k not in ("pin", "generated_by")}


def test_the_command_leaves_the_callers_stores_as_they_were(pin_project: Path, snapshot: Path,
                                                            oracles_cli: Any) -> None:
    """The command opens its project's stores for its own call only: a test that ran it reads its own
    stores after, with nothing to put back."""
    import oracles.engines
    from oracles.errors import PinError
    from oracles.families.records import records_store
    from oracles.pins.pin import store

    before = (store(), records_store(), oracles.engines.current())
    assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    assert (pin_project / "fixtures" / "pins" / "tiny.json").is_file()
    assert (store(), records_store(), oracles.engines.current()) == before
    with pytest.raises(PinError, match="unknown pin 'tiny'"):
        load_pin("tiny")


def test_pins_dir_and_records_dir_name_the_folders_for_one_call(pin_project: Path, snapshot: Path,
                                                                oracles_cli: Any, tmp_path: Path) -> None:
    """Where ``oracles pin`` and ``oracles records`` write, named on the command line instead of the
    ini file's keys (how the package's own records are regenerated: ``--records-dir oracles/builtin/records``)."""
    pins, records = tmp_path / "elsewhere" / "pins", tmp_path / "elsewhere" / "records"
    assert oracles_cli("--pins-dir", str(pins), "pin", "tiny", "--from", str(snapshot))[0] == 0
    status, out, err = oracles_cli("--pins-dir", str(pins), "--records-dir", str(records), "records", "mtplx",
                                   "--pin", "tiny")
    assert status == 0, err
    assert (pins / "tiny.json").is_file() and (records / "mtplx" / "tokens" / "tiny.json").is_file()
    assert not (pin_project / "fixtures").exists(), "the ini's folders were not written"
    status, _, err = oracles_cli("records", "mtplx", "--pin", "tiny")  # without the option: the ini's pins
    assert status == 2 and "unknown pin 'tiny'" in err, err


def test_line_progress_names_each_file_and_rate(snapshot: Path) -> None:
    snap = Snapshot(root=snapshot, source="local:x", files=("config.json", "model.safetensors"), model_class="X")
    total = sum((snapshot / f).stat().st_size for f in snap.files)
    out = io.StringIO()
    digests = hash_files(snap, LineProgress(total, out))
    lines = out.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines[:2]] == ["hashed config.json", "hashed model.safetensors"]
    assert all("MB/s" in line for line in lines) and lines[-1].startswith(f"hashed {total:,} bytes in ")
    assert digests["config.json"].sha256 == hashlib.sha256((snapshot / "config.json").read_bytes()).hexdigest()


def test_progress_falls_back_to_lines_without_tqdm(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm -> ImportError
    assert isinstance(progress_for(10), LineProgress)


@pytest.mark.parametrize("change, message", [
    (lambda o: o.update(safetensors_headers={"model.safetensors": "abc"}),
     "field 'safetensors_headers' needs a 64-hex sha256 for each file"),
    (lambda o: o.update(trained="no"), "field 'trained' must be true or false, got 'no'"),
    (lambda o: o["files"]["config.json"].update(sha256="X" * 64), "field 'files.config.json' needs an int 'bytes' and "
                                                                  "a 64-hex 'sha256'"),
    (lambda o: o.pop("source"), "field 'source' is missing or not a str"),
], ids=["header-digest", "trained", "file-digest", "source"])
def test_bad_pin_file_is_one_line(pin_project: Path, snapshot: Path, oracles_cli: Any, change: Any, message: str,
                                  project_pins: PinStore) -> None:
    assert oracles_cli("pin", "tiny", "--from", str(snapshot))[0] == 0
    path = pin_project / "fixtures" / "pins" / "tiny.json"
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))
    with pytest.raises(PinError) as err:
        load_pin("tiny", project_pins)
    assert str(err.value) == f"{path}: {message}"
