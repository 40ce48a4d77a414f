"""A module marked ``builtin_pin(NAME)`` (a built-in pin's own system: d1 System One, MTP drafting,
DeepSeek-V4's port) runs on that pin: ``--pin`` naming other pins deselects it, as it leaves out every
family's default pins; naming it, or no ``--pin``, keeps it. Collection only: no engine is built."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.dry

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
