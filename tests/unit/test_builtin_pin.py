"""A module marked ``builtin_pin(NAME)`` (a built-in pin's own system: d1 System One, MTP drafting,
DeepSeek-V4's port) runs on that pin: ``--pin`` naming other pins deselects it, as it leaves out every
family's default pins; naming it, or no ``--pin``, keeps it. Collection only: no engine is built. Not in the
dry smoke: each test runs inner pytest sessions (~50 ms apiece)."""

from __future__ import annotations

import pytest

MODULE = """
import pytest

pytestmark = pytest.mark.builtin_pin("mtp-twin")


def test_on_the_twin():
    pass
"""


@pytest.mark.parametrize(("args", "collected", "deselected"), [
    ((), 1, 0), (("--pin", "mtp-twin"), 1, 0), (("--pin", "smollm2-draft-twin"), 0, 1),
    (("--pin", "smollm2-draft-twin,mtp-twin"), 1, 0)])
def test_builtin_pin_modules_follow_pin(pytester: pytest.Pytester, args: tuple[str, ...], collected: int,
                                        deselected: int) -> None:
    pytester.makeini("[pytest]\noracles = true\n")
    pytester.makepyfile(test_twin=MODULE)
    result = pytester.runpytest("--collect-only", "-q", "--no-receipt", *args)
    assert result.ret == (pytest.ExitCode.OK if collected else pytest.ExitCode.NO_TESTS_COLLECTED), result.outlines
    tests = [line for line in result.outlines if "::test_on_the_twin" in line]
    assert len(tests) == collected, result.outlines
    assert any(f"{deselected} deselected" in line for line in result.outlines) == bool(deselected), result.outlines


PORT = '''from oracles.engines.base import Engine


class TwinPort(Engine):
    """A port that loads the MTP twin alone (collection asks only its class methods)."""

    id = "twinport"

    @classmethod
    def unsupported_pin(cls, pin):
        return None if pin.name == "mtp-twin" else f"twinport loads mtp-twin only, not {pin.name}"

    def forward(self, prompt, cache=None, keep=0, layers=False):
        raise NotImplementedError

    def make_cache(self):
        return None

    def cache_length(self, cache):
        return 0
'''
PARAMETERS = """
import pytest

pytestmark = pytest.mark.builtin_pin("mtp-twin")


def test_engines(engine_id, pin):
    pass


def test_ports(port_id, pin, port_pin):
    pass


def test_pin_alone(pin):
    pass
"""


def test_builtin_pin_modules_run_on_their_pin_with_every_engine_that_loads_it(
        pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines and ports of a builtin_pin module are those of ``--port`` that can load its pin (a port
    plugged in by entry point among them; one that cannot is left out, as everywhere), on that pin alone."""
    plugged = pytester.path / "plugged"
    (plugged / "twinport-0.1.dist-info").mkdir(parents=True)
    (plugged / "twinport.py").write_text(PORT)
    (plugged / "twinport-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: twinport\nVersion: 0.1\n")
    (plugged / "twinport-0.1.dist-info" / "entry_points.txt").write_text("[oracles.engines]\ntwinport = twinport:TwinPort\n")
    monkeypatch.syspath_prepend(str(plugged))
    pytester.makeini("[pytest]\noracles = true\n")
    pytester.makepyfile(test_twin=PARAMETERS)
    result = pytester.runpytest("--collect-only", "-q", "--no-receipt", "--port", "twinport,mlx")
    assert result.ret == pytest.ExitCode.OK, result.outlines
    ids = sorted(line.split("::")[1] for line in result.outlines if "::test_" in line)
    assert ids == ["test_engines[mtp-twin-torch]", "test_engines[mtp-twin-twinport]", "test_pin_alone[mtp-twin]",
                   "test_ports[mtp-twin-twinport]"], result.outlines
