"""Materialising the default pin twice gives byte-identical files, each verified against the committed pin.

Slow (two full GGUF -> fp32 builds, ~45 s each on the 2-core machine); the one test that builds.
"""

from __future__ import annotations

import filecmp
from pathlib import Path

import pytest

from oracles.pins import DEFAULT_PIN, load_pin


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


@pytest.mark.slow
def test_materialize_twice_is_byte_identical(tmp_path: Path) -> None:
    from oracles.materialize import materialize

    pin = load_pin(DEFAULT_PIN)
    first = materialize(pin, tmp_path / "one")  # raises PinError naming file, expected, actual on any mismatch
    second = materialize(pin, tmp_path / "two")
    assert first["built"] and second["built"], "a build was skipped: the folders must start empty"
    one, two = tmp_path / "one", tmp_path / "two"
    assert _files(one) == _files(two) == sorted(pin.files), "the builds hold other files than the pin lists"
    for name in pin.files:
        assert filecmp.cmp(one / name, two / name, shallow=False), f"{name}: the two builds differ"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary build folder was left behind"
