"""The receipt's environment: installed versions read from dist-info folder names, the processor's model
without a process of its own (dry)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
from pathlib import Path

import pytest

from oracles.receipts.environment import VERSIONED, cpu_model, environment, git_state, installed_versions


@pytest.mark.dry
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
    """The commit of a repository and whether a tracked file changed; nothing outside one. Not dry: it runs git."""
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


@pytest.mark.dry
@pytest.mark.skipif(not Path("/proc/cpuinfo").is_file(), reason="no /proc/cpuinfo")
def test_processor_is_the_model_name_read_without_a_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a repository the environment starts no process (``platform.processor()`` runs ``uname -p``
    on Linux); the processor is /proc/cpuinfo's first model name, read here by hand."""
    names = [ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
             if ln.startswith("model name")]
    if not names:
        pytest.skip("/proc/cpuinfo names no model here (an ARM machine): platform.processor() is asked")

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError(f"a process was started: {args}")

    monkeypatch.setattr(subprocess, "Popen", refused)
    monkeypatch.delenv("GIT_DIR", raising=False)
    assert cpu_model() == names[0] != ""
    assert environment(tmp_path, 1)["machine"]["processor"] == names[0]
