"""The root conftest's shortcut (``-m dry`` leaves out test files that never name the mark) selects exactly what a
full collection selects: ``-m "dry or dry"`` is the same selection with the shortcut off. And the comparison can
fail: a file that marks its tests without the text ``mark.dry`` is left out by the shortcut (a positive control)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _collected(cwd: Path, mark: str, *extra: str) -> list[str]:
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", mark, "--co", "-q", *extra],
                         cwd=cwd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    return sorted(line for line in run.stdout.splitlines() if "::" in line)


def test_the_dry_shortcut_selects_what_a_full_collection_selects() -> None:
    shortcut, full = _collected(ROOT, "dry", "--no-receipt"), _collected(ROOT, "dry or dry", "--no-receipt")
    assert len(shortcut) > 1000 and shortcut == full, sorted(set(full) ^ set(shortcut))[:10]


def test_a_file_marking_without_the_text_is_what_the_comparison_catches(pytester: pytest.Pytester) -> None:
    (pytester.path / "conftest.py").write_text((ROOT / "conftest.py").read_text())
    pytester.makefile(".py", test_named="import pytest\n\n\n@pytest.mark.dry\ndef test_a():\n    pass\n",
                      test_hidden="import pytest\n\npytestmark = getattr(pytest, 'mark').__getattr__('d' + 'ry')\n\n\n"
                                  "def test_b():\n    pass\n")
    pytester.makeini("[pytest]\nmarkers =\n    dry: no heavy imports\n")
    shortcut, full = (_collected(pytester.path, m, "-p", "no:oracles") for m in ("dry", "dry or dry"))
    assert shortcut == ["test_named.py::test_a"] and full == ["test_hidden.py::test_b", "test_named.py::test_a"]
