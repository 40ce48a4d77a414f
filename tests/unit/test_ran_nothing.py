"""No vacuous pass: a run in which a selected engine ran no check at all (every one of its tests skipped)
is not ``all_ok``, and the receipt's ``ran_nothing`` and the terminal summary name the engine, its pins
and the skip reasons counted.

The engine is plugged in by entry point, as a user's port is (a ``idle-0.1.dist-info`` folder on
``sys.path``): it sets the model facts and a tokenizer, and every capability raises ``Unsupported``, so
each test that asks one is skipped naming it. It runs on a tiny local pin with SmolLM2's tokenizer (the
built-in token ids serve it), so no weights load and no torch is imported.

Not ``dry``: inner pytest sessions cost seconds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest
from inner_runs import DRY_TOKENIZER
from test_pin_command_dry import make_snapshot

from oracles.pins.writer import write_pin

IDLE = DRY_TOKENIZER + '''
from oracles.engines.base import Engine, Unsupported



class Idle(Engine):
    """The model facts and nothing else: every capability is unsupported."""

    id = "idle"

    def __init__(self, root, pin, threads):
        super().__init__(root, pin, threads)
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = 49152, 2, 1, 8192
        self.eos_token_ids, self.tokenizer = frozenset({2}), Tokenizer(root)

    def forward(self, prompt, cache=None, keep=0, layers=False):
        raise Unsupported(self.id, "forward")

    def make_cache(self):
        raise Unsupported(self.id, "make a cache")

    def cache_length(self, cache):
        raise Unsupported(self.id, "measure a cache")
'''
SUITE = '''
import pytest


@pytest.mark.port
@pytest.mark.parametrize("record", ["ping", "pong"])
def test_port_forward(port, record):
    port.forward([1, 2, 3])


@pytest.mark.port
def test_port_cache(port):
    port.cache_length(port.make_cache())


@pytest.mark.port
def test_port_facts(port):
    assert port.vocab_size == 49152


@pytest.mark.mtplx
def test_engine_forward(engine):
    engine.forward([1, 2, 3])


def test_unit():
    pass
'''


class _Quiet:
    def start(self, name: str, size: int) -> None: ...
    def update(self, n: int) -> None: ...
    def finish_file(self) -> None: ...
    def close(self) -> None: ...


@pytest.fixture
def idle(pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The inner project: pin ``tiny``, the suite above, and engine ``idle`` plugged in by entry point."""
    snap = make_snapshot(tmp_path / "snap")
    write_pin("tiny", str(snap), pytester.path / "fixtures" / "pins", trained=False, progress=_Quiet())
    plugged = tmp_path / "plugged"
    info = plugged / "idle-0.1.dist-info"
    info.mkdir(parents=True)
    (plugged / "idle_engine.py").write_text(IDLE)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: idle\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[oracles.engines]\nidle = idle_engine:Idle\n")
    monkeypatch.syspath_prepend(str(plugged))
    pytester.makepyfile(test_suite=SUITE)
    return snap


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest("--pin", "tiny", "--receipts-dir=receipts", *args)


def test_a_port_whose_every_test_skipped_is_not_all_ok(pytester: pytest.Pytester, idle: Path,
                                                       only_receipt: Callable[..., Any]) -> None:
    result = _run(pytester, "--port", "idle", "-m", "port", "-k", "not facts")
    # deselected: test_port_facts (-k), and test_engine_forward and test_unit (-m), each collected once:
    # a test -m cannot select is not parametrized (oracles.plugin.collect.unexpanded)
    result.assert_outcomes(skipped=3, deselected=3)
    _, receipt = only_receipt(pytester.path / "receipts")
    assert receipt["all_ok"] is False
    assert receipt["ran_nothing"] == [{"engine": "idle", "pins": ["tiny"], "tests": 3, "reasons": {
        "unsupported: engine 'idle' cannot forward": 2, "unsupported: engine 'idle' cannot make a cache": 1}}], \
        receipt["ran_nothing"]
    result.stdout.fnmatch_lines(["engine idle ran no check: 3 tests on pin tiny skipped or not run (not all_ok)",
                                 "  2x unsupported: engine 'idle' cannot forward",
                                 "  1x unsupported: engine 'idle' cannot make a cache",
                                 "all_ok: False"])


def test_a_port_that_ran_one_check_is_not_listed(pytester: pytest.Pytester, idle: Path,
                                                 only_receipt: Callable[..., Any]) -> None:
    """Control: the same port with one test that runs (its model facts) made a check."""
    result = _run(pytester, "--port", "idle", "-m", "port")
    result.assert_outcomes(passed=1, skipped=3, deselected=2)  # test_engine_forward and test_unit
    _, receipt = only_receipt(pytester.path / "receipts")
    assert receipt["ran_nothing"] == [] and receipt["all_ok"] is True
    assert "ran no check" not in result.stdout.str()


def test_an_engine_with_no_selected_test_is_not_listed(pytester: pytest.Pytester, idle: Path,
                                                       only_receipt: Callable[..., Any]) -> None:
    """Deselected by -m, the port was asked nothing: it did not run nothing."""
    result = _run(pytester, "--port", "idle", "-m", "not port and not mtplx")
    result.assert_outcomes(passed=1, deselected=4)  # the four engine tests, each collected once
    _, receipt = only_receipt(pytester.path / "receipts")
    assert receipt["ran_nothing"] == [] and receipt["all_ok"] is True


def test_the_reference_is_an_engine_too(pytester: pytest.Pytester, idle: Path,
                                        only_receipt: Callable[..., Any]) -> None:
    result = _run(pytester, "--reference", "idle", "--port", "none", "-m", "mtplx or not port")
    result.assert_outcomes(passed=1, skipped=1, deselected=3)  # the three port tests, each collected once
    _, receipt = only_receipt(pytester.path / "receipts")
    assert [(r["engine"], r["pins"], r["tests"]) for r in receipt["ran_nothing"]] == [("idle", ["tiny"], 1)]
    assert receipt["all_ok"] is False, "the unit test passed, but the reference made no check"
