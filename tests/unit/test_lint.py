"""ruff holds the package, its tests and benches to pyproject's ``[tool.ruff]`` in every full pytest run, with a
positive control; ``make lint`` (part of ``make test``) runs it with mypy (pyproject's ``[tool.mypy]``). Not in
the dry smoke: each test starts ruff."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("oracles", "tests", "bench", "conftest.py")


def _ruff(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("ruff", reason="ruff is not installed: pip install -e '.[dev]'")
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


def test_ruff_check_is_clean() -> None:
    done = _ruff(*CHECKED, cwd=ROOT)
    assert done.returncode == 0, f"ruff check {' '.join(CHECKED)}:\n{done.stdout}{done.stderr}"


def test_ruff_check_fails_on_a_finding(tmp_path: Path) -> None:
    """Positive control: the same call, the project's configuration, on a file with two findings must fail
    naming both (so the clean check above is not clean because nothing was read)."""
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n\nl = 1\n")
    done = _ruff("--config", str(ROOT / "pyproject.toml"), str(bad), cwd=tmp_path)
    assert done.returncode == 1 and "F401" in done.stdout and "E741" in done.stdout, done.stdout + done.stderr
