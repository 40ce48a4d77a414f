"""A receipt holding no comparable unit at all (a ``-m port`` run: port tests hold the port against the
reference in the test and attach none) is refused saying so, which families attach units and which
families the receipt ran; :data:`oracles.receipts.units.ATTACHED_BY` is held to the suite's attach_unit calls."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from units_fake import decode, logits, write

import oracles.suite
from oracles.cli import main
from oracles.families import family_of
from oracles.receipts.units import ATTACHED_BY, KINDS

pytestmark = [pytest.mark.dry]

PORT_TESTS = [{"nodeid": f"oracles/suite/test_port.py::test_decode_vs_reference[{r}]", "outcome": "passed",
               "family": "port", "data": {"kind": "decode", "request_sha256": "a" * 64, "max_abs": 0.0}}
              for r in ("arith", "ping")]
WHY = ("attached none; units are attached by tests of families mtplx, mtplx_chat, d1, clef (a port-family test "
       "holds the port against the reference in the test and attaches none)")


def _port_run(tmp_path: Path) -> Path:
    path = tmp_path / "port-run.json"
    doc = json.loads(write(tmp_path, "unused", [decode("torch", logits(), [5, 2])]).read_text())
    path.write_text(json.dumps({**doc, "tests": [*PORT_TESTS, {"nodeid": "t.py::x", "outcome": "passed",
                                                               "family": "mtplx_chat"}]}))
    return path


def test_port_run_says_it_holds_no_units(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trial's case: it was told "no comparable units of engine 'torch'; engines present: none"."""
    path = _port_run(tmp_path)
    assert main(["compare", str(path), str(path), "--port-engine", "torch", "--out", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err == (f"oracles compare: error: {path}: holds no comparable units at all: its 3 "
                                       f"tests (families: port 2, mtplx_chat 1) {WHY}\n")
    assert not (tmp_path / "c.json").exists()


def test_port_side_without_units_is_refused_too(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref = write(tmp_path / "a", "ref", [decode("torch", logits(), [5, 2])])
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({**json.loads(ref.read_text()), "tests": []}))
    assert main(["compare", str(ref), str(empty), "--out", str(tmp_path / "c.json")]) == 2
    assert capsys.readouterr().err == f"oracles compare: error: {empty}: holds no comparable units at all: its 0 tests {WHY}\n"


def _attached_kinds(tree: ast.Module) -> set[str]:
    """The kinds a suite module's attach_unit calls name (an f-string by its constant prefix: every kind
    it may name)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "attach_unit" and len(node.args) > 1:
            kind = node.args[1]
            if isinstance(kind, ast.Constant):
                out.add(str(kind.value))
            elif isinstance(kind, ast.JoinedStr) and isinstance(kind.values[0], ast.Constant):
                out |= {k for k in KINDS if k.startswith(str(kind.values[0].value))}
    return out


def _module_markers(tree: ast.Module) -> set[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            return {m.attr for m in ast.walk(node.value) if isinstance(m, ast.Attribute) and m.attr != "mark"}
    return set()


def test_attached_by_is_the_suites_attach_unit_callers() -> None:
    """Each kind's declared family is the family of the suite module that attaches it, and every kind is
    attached somewhere: the families named to a receipt without units are the ones that attach them."""
    suite = Path(oracles.suite.__file__).parent
    seen: dict[str, str] = {}
    for path in sorted(suite.glob("test_*.py")):
        tree = ast.parse(path.read_text())
        kinds = _attached_kinds(tree)
        if kinds:
            family = family_of(_module_markers(tree))
            assert family is not None, f"{path.name} attaches units but carries no family marker"
            seen.update({k: family.name for k in kinds})
    assert seen == {k: spec.family for k, spec in KINDS.items()}
    assert set(ATTACHED_BY) == set(seen.values())
