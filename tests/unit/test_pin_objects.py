"""A pin is read once a session, and every fixture gives the same loaded Pin: ``pin_file``, ``pins(name)``
and ``engine.pin_file`` (the engine built with it), while the test ids stay the pin's name.

An inner session on the draft twin (16 MB verified) with a numpy-only engine registered as a built-in.
"""

from __future__ import annotations

import pytest

import oracles.engines
from oracles.pins.pin import oracles_home

PIN = "smollm2-draft-twin"
#: Read before pytester moves $HOME: the materialised snapshots this machine has.
HOME = str(oracles_home())

ENGINE = """
from cohort_fake import DryTokenizer, NoForward

from oracles.engines.base import Engine


class Light(NoForward, Engine):
    id = "light"

    def __init__(self, root, pin, threads=0):
        super().__init__(root, pin, threads)
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = 49152, 64, 2, 8192
        self.eos_token_ids, self.tokenizer = frozenset({2}), DryTokenizer(root)
"""

SUITE = """
import pytest

SEEN = []


@pytest.mark.mtplx
def test_engine_gets_the_session_pin(engine, pin, pin_file, pins):
    assert isinstance(pin, str) and pin_file.name == pin == engine.pin
    assert engine.pin_file is pin_file is pins(pin)
    SEEN.append(pin_file)


@pytest.mark.mtplx
def test_a_later_test_gets_the_same_object(engine, pin_file):
    assert SEEN and all(p is pin_file for p in SEEN) and engine.pin_file is pin_file
"""


def test_one_pin_object_per_session(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(oracles.engines.BUILTIN, "light", "light_engine:Light")
    monkeypatch.setenv("ORACLES_HOME", HOME)
    pytester.syspathinsert()
    pytester.makepyfile(light_engine=ENGINE, test_pins=SUITE)
    # each session builds its own engine Registry from BUILTIN, so the inner run sees "light"
    result = pytester.runpytest("--no-receipt", "--reference", "light", "--port", "none", "--pin", PIN, "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([f"*test_engine_gets_the_session_pin*{PIN}* PASSED*",
                                 f"*test_a_later_test_gets_the_same_object*{PIN}* PASSED*"])
