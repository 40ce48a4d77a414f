"""``oracles serve``: the reference served over the wire is the reference. ``oracles serve torch --listen``
on the draft twin, then two inner sessions of the mtplx family's forward, decode and generation checks on it
(the 1,294-token "readme" record left out: its head re-run alone takes 90 s of torch here), one with the
reference in process (``--reference torch``) and one with it served over TCP as ``wire:served``, both in this
process (torch imported once): the same checks table and bit-identical comparable units; ``oracles
wire-check`` passes on the served reference. The comparison's own positive control: one flipped bit in one
unit's array is named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pytest

PIN = "smollm2-draft-twin"
MODULES = ("oracles.suite.test_forward", "oracles.suite.test_decode", "oracles.suite.test_generate")
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]
#: The built pins' folder, read before pytester points HOME into a temporary folder.
HOME = str(Path(os.environ.get("ORACLES_HOME") or Path.home() / ".cache" / "oracles").expanduser())


def _receipt(folder: Path) -> tuple[dict[str, Any], Path]:
    (path,) = [p for p in folder.rglob("*.json") if not p.name.startswith(".")]
    return json.loads(path.read_text()), path


class Served:
    """``oracles serve torch --pin smollm2-draft-twin --listen 127.0.0.1:0``, started at once; :meth:`address`
    waits for it to listen (its start, a torch import, overlaps the in-process session)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "oracles.cli", "serve", "torch", "--pin", PIN, "--threads",
                                      "1", "--listen", "127.0.0.1:0"], stderr=subprocess.PIPE, text=True)
        self.found: str | None = None

    def address(self) -> str:
        """``HOST:PORT`` it listens at.

        Raises:
            pytest.fail.Exception: it exited first (its stderr quoted).
        """
        lines: list[str] = []
        assert self.proc.stderr is not None
        while self.found is None:
            line = self.proc.stderr.readline()
            if not line:
                pytest.fail(f"oracles serve exited with {self.proc.wait()}: {''.join(lines)[-2000:]}")
            lines.append(line)
            if "listening on" in line:
                self.found = line.rsplit(" ", 1)[1].strip()
        return self.found


@pytest.fixture(scope="module")
def served() -> Iterator[Served]:
    server = Served()
    yield server
    server.proc.kill()
    server.proc.wait()


def _session(pytester: pytest.Pytester, reference: str, out: Path) -> tuple[dict[str, Any], Path]:
    """One inner session, in this process (torch imported once), its receipt under ``out``."""
    result = pytester.runpytest("--pyargs", *MODULES, "-p", "no:cacheprovider", "--runslow", "--oracle-threads", "1",
                                "--pin", PIN, "--port", "none", "--reference", reference, f"--receipts-dir={out}",
                                "-k", "not readme")
    assert result.ret == 0, "\n".join(result.outlines[-60:])
    return _receipt(out)


def _table(receipt: dict[str, Any]) -> dict[str, tuple[Any, ...]]:
    return {name: (c["ok"], c["passed"], len(c["failed"]), c["skipped"]) for name, c in receipt["checks"].items()}


def units_differ(a: tuple[dict[str, Any], Path], b: tuple[dict[str, Any], Path]) -> list[str]:
    """Every unit of ``a`` whose twin in ``b`` (same kind, request, unit, pin) is missing or differs in ids,
    tokens, argmax or any bit of its arrays (the sha256 of each attached row, which the sidecar keeps
    exactly whatever code stores the row); one line each."""
    from oracles.receipts.sidecar import find_sidecar, load_npz
    from oracles.receipts.units_reader import units_of

    sides = []
    for receipt, path in (a, b):
        sides.append(({u.key: u for u in units_of(receipt, path)}, load_npz(find_sidecar(receipt, path)[0], path)))
    (ua, na), (ub, nb) = sides
    out = [f"{key}: missing" for key in ua if key not in ub]
    for key, u in ua.items():
        v = ub.get(key)
        if v is None:
            continue
        if (u.ids, u.tokens, u.argmax) != (v.ids, v.tokens, v.argmax):
            out.append(f"{key}: ids, tokens or argmax differ")
        for role, npz_key in u.arrays.items():
            x, y = na.rows(npz_key), nb.rows(v.arrays[role])
            if x.values.shape != y.values.shape or not np.array_equal(x.stats.sha, y.stats.sha):
                out.append(f"{key}: array {role} differs")
    return out


def test_a_served_reference_gives_the_same_checks_and_bits(pytester: pytest.Pytester, served: Served, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ORACLES_HOME", HOME)
    torch = _session(pytester, "torch", tmp_path / "torch")
    pytester.makeini(f"[pytest]\noracles = true\noracles_wire =\n    served = tcp://{served.address()}\n")
    wire = _session(pytester, "wire:served", tmp_path / "served")
    assert _table(torch[0]) == _table(wire[0])
    assert torch[0]["all_ok"] and wire[0]["all_ok"]
    assert sum(c["passed"] for c in torch[0]["checks"].values()) >= 12  # 15 measured: forward, decode, generation
    loaded = [e for e in wire[0]["engines"] if e.get("name") == "wire:served"]
    assert loaded and loaded[0].get("far_engine") == "torch", wire[0]["engines"]
    from oracles.receipts.units_reader import units_of

    assert len(units_of(*torch)) >= 3, "no comparable units: the comparison would check nothing"
    assert units_differ(torch, wire) == [] and units_differ(wire, torch) == []
    _flipped_bit_is_named(torch, wire, tmp_path / "flipped")


def _flipped_bit_is_named(torch: tuple[dict[str, Any], Path], served: tuple[dict[str, Any], Path], folder: Path) -> None:
    """Positive control: the served receipt with one bit of one unit's array flipped (stored as attached
    under a new key the copied receipt names, so no other unit coded on it moves)."""
    from oracles.receipts.sidecar import find_sidecar, load_npz
    from oracles.receipts.units import DATA_KEY
    from oracles.receipts.units_reader import units_of

    receipt, path = served
    npz_path = find_sidecar(receipt, path)[0]
    assert npz_path is not None
    folder.mkdir()
    copy = folder / path.name
    unit = units_of(receipt, path)[0]
    role, target = next(iter(unit.arrays.items()))
    flipped = load_npz(npz_path, path).rows(target).values.copy()
    flipped.view(np.uint32).flat[0] ^= 1
    with np.load(npz_path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    np.savez(folder / npz_path.name, **arrays, flipped=flipped)
    doc = json.loads(path.read_text())
    record = next(t for t in doc["tests"] if t["nodeid"] == unit.test)
    stored = next(u for u in record["data"][DATA_KEY] if u["arrays"].get(role) == target)
    stored["arrays"][role] = "flipped"
    copy.write_text(json.dumps(doc))
    found = units_differ(torch, (json.loads(copy.read_text()), copy))
    assert found == [f"{unit.key}: array {next(iter(unit.arrays))} differs"], found


def test_wire_check_passes_on_the_served_reference(served: Served) -> None:
    from oracles.cli import main

    assert main(["wire-check", served.address(), "--pin", PIN]) == 0
