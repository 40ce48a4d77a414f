"""Materialising a pin twice gives byte-identical files, each verified against the committed pin.

Slow: the default pin is two full GGUF -> fp32 builds (~45 s each on the 2-core machine), the hybrid
twin two seeded Qwen3.5 builds (~5 s each); each pair runs as two processes at once so they share the
cores.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from oracles.pins import DEFAULT_PIN, load_pin

BUILD = """
import json, sys
from pathlib import Path
from oracles.materialize import materialize
from oracles.pins import load_pin
print(json.dumps(materialize(load_pin(sys.argv[1]), Path(sys.argv[2]))))
"""


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


#: The pins built twice: the GGUF builder's and the hybrid twin's (a ``twin:`` builder with recurrent layers).
PINS = [DEFAULT_PIN, "smollm2-hybrid-twin"]


@pytest.mark.slow
@pytest.mark.parametrize("name", PINS)
def test_materialize_twice_is_byte_identical(tmp_path: Path, name: str) -> None:
    pin = load_pin(name)
    one, two = tmp_path / "one", tmp_path / "two"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # as the Makefile builds
    builds = [subprocess.Popen([sys.executable, "-c", BUILD, name, str(dest)], env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE) for dest in (one, two)]
    for dest, proc in zip((one, two), builds):
        out, err = proc.communicate(timeout=600)
        # materialize raises PinError naming file, expected and actual digest when a build differs from the pin
        assert proc.returncode == 0, f"building {dest.name} failed:\n{err.strip().splitlines()[-1] if err.strip() else ''}"
        result = json.loads(out.strip().splitlines()[-1])
        assert result["built"] and result["digest"] == pin.digest, result
    assert _files(one) == _files(two) == sorted(pin.files), "the builds hold other files than the pin lists"
    for name in pin.files:
        assert filecmp.cmp(one / name, two / name, shallow=False), f"{name}: the two builds differ"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary build folder was left behind"
