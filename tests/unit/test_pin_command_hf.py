"""``oracles pin NAME --from hf:REPO@REVISION``: resolved offline from a local Hugging Face cache.

The cache is made here in the hub's own layout (``models--ORG--NAME/{blobs,snapshots/<commit>,refs}``,
snapshot files as relative symlinks into ``blobs/``, as huggingface_hub writes them), once read
through huggingface_hub's ``scan_cache_dir`` and once through the folder layout alone (as where
huggingface_hub is not installed). Not ``dry``: huggingface_hub is imported.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_pin_command_dry import error_line, make_snapshot

from oracles.pins import hf_cache
from oracles.pins.pin import PinStore, load_pin, snapshot_dir

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "fedcba9876543210fedcba9876543210fedcba98"


def make_cache(hub: Path, repo: str = "org/tiny") -> Path:
    """A hub cache holding ``repo`` at COMMIT (ref ``main``) and OTHER (no ref); returns the repo folder."""
    folder = hub / ("models--" + repo.replace("/", "--"))
    plain = make_snapshot(hub.parent / "plain")
    for commit in (COMMIT, OTHER):
        snap = folder / "snapshots" / commit
        snap.mkdir(parents=True)
        for path in sorted(p for p in plain.iterdir() if p.is_file()):
            data = path.read_bytes() + (b"" if commit == COMMIT or path.suffix != ".json" else b" ")
            blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
            blob.parent.mkdir(exist_ok=True)
            blob.write_bytes(data)
            (snap / path.name).symlink_to(os.path.relpath(blob, snap))
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(COMMIT)
    return folder


@pytest.fixture(params=["huggingface_hub", "layout"])
def hub(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``$HF_HUB_CACHE`` with one repository; read by huggingface_hub, or by the layout alone."""
    cache = tmp_path / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # restored after the test (the scan sets it where unset)
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    if request.param == "layout":
        real = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec",
                            lambda name, *a: None if name == "huggingface_hub" else real(name, *a))
    make_cache(cache)
    return cache


@pytest.mark.parametrize("revision", ["main", COMMIT])
def test_pin_from_hf_cache_names_the_commit(pin_project: Path, hub: Path, oracles_cli: Any, revision: str,
                                            project_pins: PinStore) -> None:
    status, out, err = oracles_cli("pin", "tiny", "--from", f"hf:org/tiny@{revision}")
    assert status == 0, err
    pin = load_pin("tiny", project_pins)
    assert pin.source == f"hf:org/tiny@{COMMIT}", "a branch is pinned as the commit it names now"
    root = hub / "models--org--tiny" / "snapshots" / COMMIT
    assert snapshot_dir(pin) == root
    assert pin.files["config.json"].sha256 == hashlib.sha256((root / "config.json").read_bytes()).hexdigest()
    status, out, _ = oracles_cli("materialize", "tiny")
    assert status == 0 and json.loads(out)["root"] == str(root) and json.loads(out)["built"] is False


def test_detached_commit_is_found(pin_project: Path, hub: Path, oracles_cli: Any, project_pins: PinStore) -> None:
    assert oracles_cli("pin", "old", "--from", f"hf:org/tiny@{OTHER}")[0] == 0
    assert load_pin("old", project_pins).source == f"hf:org/tiny@{OTHER}"


@pytest.mark.parametrize("spec, held", [
    ("hf:org/tiny@v2", f"(refs main; snapshots {COMMIT[:12]}, {OTHER[:12]})"),
    ("hf:org/other@main", "(no such folder)"),
])
def test_revision_not_in_cache_is_one_line_naming_the_folder(pin_project: Path, hub: Path, oracles_cli: Any, spec: str,
                                                             held: str) -> None:
    status, _, err = oracles_cli("pin", "tiny", "--from", spec)
    line = error_line(err)
    repo, _, revision = spec.removeprefix("hf:").partition("@")
    folder = hub / ("models--" + repo.replace("/", "--"))
    assert status == 2, line
    assert f"{spec}: revision {revision!r} is not in the local Hugging Face cache: looked in {folder} {held}" in line
    assert not (pin_project / "fixtures").exists()


def test_cache_folder_follows_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """huggingface_hub's rules: HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub, else ~/.cache."""
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_cache.cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hf_cache.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hf_cache.cache_dir() == tmp_path / "hf" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "direct"))
    assert hf_cache.cache_dir() == tmp_path / "direct"


def test_malformed_hf_source_is_refused(pin_project: Path, oracles_cli: Any) -> None:
    status, _, err = oracles_cli("pin", "tiny", "--from", "hf:not a repo")
    assert status == 2 and "expected hf:ORG/NAME@REVISION" in error_line(err)


def test_hf_pin_whose_commit_left_the_cache_is_one_line(pin_project: Path, hub: Path, oracles_cli: Any) -> None:
    assert oracles_cli("pin", "tiny", "--from", "hf:org/tiny@main")[0] == 0
    root = hub / "models--org--tiny" / "snapshots" / COMMIT
    for path in root.iterdir():
        path.unlink()
    root.rmdir()
    status, _, err = oracles_cli("materialize", "tiny")
    assert status == 2 and f"snapshot of pin 'tiny' missing: {root} is not a folder" in error_line(err)
