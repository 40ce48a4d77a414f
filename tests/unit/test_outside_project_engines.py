"""Engines plugged in from outside the project through the ``oracles.engines`` entry-point group, when
they cannot be used: an id that differs from the entry-point name, a module that fails to import, a
class that is not an Engine. Named with ``--port NAME``: a usage error, one line naming it and why.
Under ``--port auto``: the run goes on, and the line after collection says it is not used and why.

A ``NAME-0.1.dist-info`` folder (METADATA + entry_points.txt) on ``sys.path`` is a real installed
distribution to ``importlib.metadata``, which the registry reads; no pip needed. No engine is built.
"""

from __future__ import annotations

from pathlib import Path

import pytest

MODULES = {
    "badid": "from oracles.engines.torch.reference import TorchReference\n\n\nclass BadId(TorchReference):\n    id = 'other'\n",
    "broken": "import framework_that_is_not_installed  # noqa: F401\n",
    "notengine": "class NotEngine:\n    id = 'notengine'\n",
}
ENTRY = {"badid": "badid:BadId", "broken": "broken:Broken", "notengine": "notengine:NotEngine"}
REASON = {
    "badid": "entry point oracles.engines:badid badid:BadId has id 'other', not its entry-point name 'badid'",
    "broken": "entry point oracles.engines:broken broken:Broken cannot be imported: ModuleNotFoundError: No module "
              "named 'framework_that_is_not_installed'",
    "notengine": "entry point oracles.engines:notengine notengine:NotEngine is not a subclass of "
                 "oracles.engines.base.Engine",
}


def plug(folder: Path, names: list[str]) -> Path:
    """Write the modules and one distribution registering them as ``oracles.engines`` entry points."""
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / f"{name}.py").write_text(MODULES[name])
    info = folder / "plugged_engines-0.1.dist-info"
    info.mkdir(exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: plugged-engines\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[oracles.engines]\n" + "".join(f"{n} = {ENTRY[n]}\n" for n in names))
    return folder


@pytest.fixture
def plugged(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = plug(tmp_path / "plugged", list(MODULES))
    monkeypatch.syspath_prepend(str(folder))
    return folder


@pytest.mark.parametrize("name", list(MODULES))
def test_named_port_that_cannot_be_used_is_one_usage_line(pytester: pytest.Pytester, plugged: Path, name: str) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--port", name, "--receipts-dir=receipts")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert errors == [f"ERROR: --port {name!r}: engine cannot run here: {REASON[name]}; drop it, or use --port auto "
                      "to run the ports that can"], result.errlines
    assert not (pytester.path / "receipts").exists()


def test_auto_leaves_each_out_saying_why(pytester: pytest.Pytester, plugged: Path) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--port", "auto", "--no-receipt")
    result.assert_outcomes(passed=1)
    lines = [line for line in result.outlines if line.startswith("oracles: plugged engine")]
    assert sorted(lines) == sorted(f"oracles: plugged engine {n} not used: {REASON[n]}" for n in MODULES), result.outlines
    header = next(line for line in result.outlines if line.startswith("oracles: reference"))
    assert not any(n in header.split("ports ")[1].split(";")[0] for n in MODULES), header
