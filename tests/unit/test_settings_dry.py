"""The settings object and the stores, without a pytest session: every option parsed once from the one
table into a frozen Settings (conflicts refused there), readers of the session state that never
activate anything, and a project's stores that a run enters and leaves (nothing to reset after it).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest

import oracles.engines
from oracles.families.port_scope import PortScope
from oracles.families.records import RecordStore, records_store
from oracles.pins.pin import BUILTIN_PINS, load_pin, store
from oracles.pins.project import Project, ProjectDirs
from oracles.plugin.options import OPTIONS, asked, enabled_by_options
from oracles.plugin.settings import Settings
from oracles.plugin.state import RunState, keep, settings_of, state_of

pytestmark = pytest.mark.dry


def defaults(**given: Any) -> argparse.Namespace:
    """What ``config.option`` holds for our options when none is given, with ``given`` on top."""
    return argparse.Namespace(**{o.dest: o.stored_default for o in OPTIONS} | given)


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """A project with a pin of its own (``mine``: the default pin's file under another name)."""
    pins = tmp_path / "fixtures" / "pins"
    pins.mkdir(parents=True)
    text = (BUILTIN_PINS / "smollm2-135m-instruct.json").read_text()
    (pins / "mine.json").write_text(text.replace('"name": "smollm2-135m-instruct"', '"name": "mine"'))
    return Project.open(ProjectDirs(pins, tmp_path / "fixtures" / "records", None))


def test_defaults_ask_for_nothing() -> None:
    assert not asked(defaults()) and not enabled_by_options(defaults())
    assert asked(defaults(port="none")) and asked(defaults(deadline=5.0))
    assert enabled_by_options(defaults(receipt_tag="t")) and not asked(defaults(runslow=True))


def test_every_option_is_parsed_once_into_a_frozen_typed_settings(project: Project, tmp_path: Path) -> None:
    (tmp_path / "snap").mkdir()
    opt = defaults(pin=" mine, smollm2-135m-instruct ,mine", port="none", oracle_threads=2, deadline=30.0,
                   port_records="64", snapshot=[f"mine={tmp_path}/snap"], receipt_tag="night")
    settings = Settings.resolve(opt, True, project)
    assert settings.pins == ("mine", "smollm2-135m-instruct") and settings.ports == () and settings.port == "none"
    assert settings.port_scope == PortScope("max", 64) and settings.oracle_threads == 2 and settings.deadline == 30.0
    assert settings.snapshots == {"mine": tmp_path / "snap"} and settings.receipt_tag == "night"
    assert settings.receipts_dir == Path("receipts") and settings.resume is None and settings.enabled
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.reference = "mlx"  # type: ignore[misc]
    assert settings.pin_store is project.pins and settings.registry is project.engines


@pytest.mark.parametrize(("given", "message"), [
    ({"resume": "r.json", "no_receipt": True}, "--resume=r.json with --no-receipt: the passes --resume carries over "
                                               "are recorded only in this run's receipt; drop one of the two"),
    ({"snapshot": ["mine={a}", "mine={b}"]}, "--snapshot 'mine={b}': pin 'mine' has folder {a} already; one folder a pin"),
    ({"pin": "mine,nope"}, "--pin mine,nope: unknown pin 'nope': no nope.json in *"),
    ({"port_records": "0"}, "--port-records '0': expected 'sample', 'all' or a positive number of tokens"),
], ids=["resume-no-receipt", "snapshot-twice", "pin-unknown", "scope"])
def test_bad_values_and_conflicts_are_refused_at_resolve(project: Project, tmp_path: Path, given: dict[str, Any],
                                                         message: str) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    given = {k: [v.format(a=a, b=b) for v in value] if isinstance(value, list) else value for k, value in given.items()}
    with pytest.raises(pytest.UsageError) as info:
        Settings.resolve(defaults(**given), True, project)
    text = str(info.value)
    want = message.format(a=a, b=b)
    assert text.startswith(want.removesuffix("*")) if want.endswith("*") else text == want, text


class _Config:
    """As much of a pytest config as the state readers touch."""

    def __init__(self) -> None:
        self.stash = pytest.Stash()


def test_reading_the_state_never_activates() -> None:
    config = _Config()
    with pytest.raises(LookupError, match="pytest-oracles is not active in this pytest session"):
        state_of(config)  # type: ignore[arg-type]
    with pytest.raises(LookupError):
        settings_of(config)  # type: ignore[arg-type]
    assert len(config.stash) == 0, "a reader made something"
    state, settings = RunState.new(None, "default", None, controller=True), Settings()
    keep(config, state, settings)  # type: ignore[arg-type]
    assert state_of(config) is state and settings_of(config) is settings  # type: ignore[arg-type]


def test_a_project_is_entered_for_a_run_and_left_after_it(project: Project) -> None:
    outer = (store(), records_store(), oracles.engines.current())
    with pytest.raises(Exception, match="unknown pin 'mine'"):
        load_pin("mine")
    with project.entered():
        assert store() is project.pins and records_store() is project.records
        assert oracles.engines.current() is project.engines
        assert load_pin("mine").name == "mine"
        inner = Project.open(ProjectDirs(Path("/nonexistent/pins"), Path("/nonexistent/records"), None))
        with inner.entered():  # a run nested in this one sees its own, then this one's again
            assert store() is inner.pins
        assert store() is project.pins
    assert (store(), records_store(), oracles.engines.current()) == outer
    assert isinstance(records_store(), RecordStore)


def test_a_pin_is_parsed_once_per_file_version(project: Project) -> None:
    first = project.pins.load("mine")
    assert project.pins.load("mine") is first
    path = project.pins.path("mine")
    assert path is not None
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 1_000_000))
    assert project.pins.load("mine") is not first and project.pins.load("mine") == first  # read again


def test_this_repository_keeps_its_own_pins_in_fixtures_as_a_project_does(pytestconfig: pytest.Config) -> None:
    """pytest.ini names fixtures/ (the design card's top-level folder) for the project's pins and records;
    the built-in ones are found after it, not through the ini."""
    from oracles.families.records import RECORDS

    root = Path(__file__).resolve().parents[2]
    if pytestconfig.rootpath != root:
        pytest.skip(f"run from another rootdir ({pytestconfig.rootpath}): this repository's ini is not the one read")
    assert pytestconfig.getini("oracles_pins") == [root / "fixtures" / "pins"]
    settings = settings_of(pytestconfig)
    assert settings.pin_store.dirs == (root / "fixtures" / "pins", BUILTIN_PINS)
    assert settings.project is not None and settings.project.records.dirs == (root / "fixtures" / "records", RECORDS)
