"""A test's family comes from its markers, never from the names of the folders above it."""

from __future__ import annotations

from typing import Any, Callable

import pytest


def test_folder_named_like_a_family_does_not_make_a_family(pytester: pytest.Pytester,
                                                           only_receipt: Callable[..., Any]) -> None:
    """``item.keywords`` holds the parent nodes' names: a checkout in a folder named ``port`` put every
    test of it in the port family (receipt column and xdist group). A marked test keeps its family."""
    folder = pytester.mkpydir("port")
    (folder / "test_inner.py").write_text("import pytest\n\ndef test_plain():\n    pass\n\n"
                                          "@pytest.mark.d1\ndef test_marked():\n    pass\n")
    pytester.runpytest("--receipts-dir=r").assert_outcomes(passed=2)
    _, receipt = only_receipt(pytester.path / "r")
    families = {t["check"]: t["family"] for t in receipt["tests"]}
    assert families == {"test_plain": "unit", "test_marked": "d1"}, families
