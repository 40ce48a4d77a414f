"""The receipt's environment: installed versions read from dist-info folder names (dry)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import pytest

from oracles.receipts.environment import VERSIONED, git_state, installed_versions

pytestmark = pytest.mark.dry


def test_versions_equal_importlib_metadata() -> None:
    names = [*VERSIONED[1:], "no-such-distribution-here"]
    got = installed_versions(names)
    assert list(got) == names
    for name in VERSIONED[1:]:
        try:
            want = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            want = None
        assert got[name] == want, name
    assert got["no-such-distribution-here"] is None


@pytest.mark.skipif(shutil.which("git") is None, reason="no git on PATH")
def test_git_state_commit_and_tracked_changes_only(tmp_path: Path) -> None:
    assert git_state(tmp_path) == (None, None), "outside a repository"
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    assert git_state(tmp_path) == (None, None), "a repository without commits"
    (tmp_path / "a.txt").write_text("a")
    subprocess.run([*git, "add", "a.txt"], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "untracked.txt").write_text("u")
    assert git_state(tmp_path) == (head, False), "an untracked file is not a change"
    (tmp_path / "a.txt").write_text("b")
    assert git_state(tmp_path / ".") == (head, True)
