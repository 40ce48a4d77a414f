"""Materialising a pin again gives byte-identical files: a fresh build in a temporary folder equals,
file by file, the snapshot the session verified (itself a build: ``make materialize`` made it minutes
before on a fresh machine), and both equal the committed pin.

Slow: the default pin is one full GGUF -> fp32 build (~45 s on the 2-core machine); the twins' builds
take seconds. One build, not two at once: two builder processes took both cores from the other xdist
worker for 90 s.
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest

from oracles.families import DEFAULT_PIN
from oracles.pins.pin import load_pin

BUILD = """
import json, sys
from pathlib import Path
from typing import Callable
from oracles.pins.materialize import materialize
from oracles.pins.pin import load_pin
print(json.dumps(materialize(load_pin(sys.argv[1]), Path(sys.argv[2]))))
"""


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


#: The pins built twice: the GGUF builder's and the hybrid twin's (a ``twin:`` builder with recurrent layers).
PINS = [DEFAULT_PIN, "smollm2-hybrid-twin"]


@pytest.mark.slow
@pytest.mark.parametrize("name", PINS)
def test_materialize_twice_is_byte_identical(tmp_path: Path, name: str,
                                              verified_snapshot: Callable[[str], Path]) -> None:
    pin = load_pin(name)
    one, two = verified_snapshot(name), tmp_path / "two"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}  # as the Makefile builds
    done = subprocess.run([sys.executable, "-c", BUILD, name, str(two)], env=env, text=True, capture_output=True,
                          timeout=600)
    # materialize raises PinError naming file, expected and actual digest when a build differs from the pin
    assert done.returncode == 0, f"building again failed:\n{done.stderr.strip().splitlines()[-1] if done.stderr.strip() else ''}"
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["built"] and result["digest"] == pin.digest, result
    assert _files(one) == _files(two) == sorted(pin.files), "the builds hold other files than the pin lists"
    for name in pin.files:
        assert filecmp.cmp(one / name, two / name, shallow=False), f"{name}: the two builds differ"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a temporary build folder was left behind"
