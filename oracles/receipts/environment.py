"""What a receipt records about the machine it ran on: package versions (read from the installed
distributions, importing nothing heavy), thread settings, the machine, the git state; computed in a
background thread from session start (:class:`EnvironmentProbe`).
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Sequence

VERSIONED = ("python", "numpy", "torch", "transformers", "tokenizers", "safetensors", "mlx", "mlx-lm", "mlx-vlm",
             "gguf", "accelerate", "pytest", "pytest-xdist", "pytest-timeout", "pytest-oracles")



def _dist_key(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def installed_versions(names: Sequence[str]) -> dict[str, str | None]:
    """The installed version of each distribution in ``names`` (``None`` when not installed).

    Read from the ``{name}-{version}.dist-info`` folder names on ``sys.path``, first match winning as
    for imports (PyPA "Recording installed projects": the folder is named for the distribution, ``-``
    and ``.`` escaped as ``_``, and its version). importlib.metadata parses each METADATA file with the
    email parser, ~6 ms a package here (72 ms for these eleven, in every session); a folder scan is
    ~1 ms. A name not found that way (an egg-info install) falls back to importlib.metadata.
    """
    want = {_dist_key(n): n for n in names}
    found: dict[str, str | None] = {}
    for entry in sys.path:
        try:
            folders = [d.name for d in os.scandir(entry or ".") if d.name.endswith(".dist-info")]
        except OSError:
            continue
        for folder in folders:
            dist, _, version = folder[: -len(".dist-info")].rpartition("-")
            name = want.get(_dist_key(dist))
            if name is not None and name not in found:
                found[name] = version
    for name in names:
        if name not in found:
            try:
                found[name] = importlib.metadata.version(name)
            except importlib.metadata.PackageNotFoundError:
                found[name] = None
    return {name: found[name] for name in names}


def git_state(rootdir: Path) -> tuple[str | None, bool | None]:
    """(HEAD commit, whether a tracked file differs from it) of the repository holding ``rootdir``;
    (None, None) outside a repository, in one without commits, or without git.

    One ``git status`` process: its porcelain v2 header names the commit (``# branch.oid``), and each
    other line is a changed tracked file (untracked files are not asked for). None when no ``.git``
    is in ``rootdir`` or above it and no ``GIT_DIR`` is set: git's own discovery looks nowhere else.
    """
    if "GIT_DIR" not in os.environ and not any((d / ".git").exists() for d in (rootdir, *rootdir.resolve().parents)):
        return None, None
    try:
        done = subprocess.run(["git", "-C", str(rootdir), "status", "--porcelain=v2", "--branch", "--no-ahead-behind",
                               "--untracked-files=no"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    lines = done.stdout.splitlines() if done.returncode == 0 else []
    commit = next((ln.split()[2] for ln in lines if ln.startswith("# branch.oid ")), None)
    if commit is None or commit == "(initial)":
        return None, None
    return commit, any(not ln.startswith("#") for ln in lines)


def cpu_model() -> str:
    """The processor's model name: /proc/cpuinfo's first ``model name`` where there is one (Linux on x86),
    else ``platform.processor()``. On Linux that one is ``uname -p`` in a process of its own (~16 ms of a
    session's start here, and empty), and one float32 program may round otherwise on another instruction set."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def environment(rootdir: Path, threads: int) -> dict[str, Any]:
    """Versions (from the installed distributions, importing nothing heavy), threads, machine and git state."""
    versions: dict[str, str | None] = {"python": platform.python_version(), **installed_versions(VERSIONED[1:])}
    env_threads = {k: os.environ.get(k) for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                   "OPENBLAS_CORETYPE", "VECLIB_MAXIMUM_THREADS")}

    commit, dirty = git_state(rootdir)
    return {
        "versions": versions,
        "threads": {"oracle_threads": threads, "cpu_count": os.cpu_count(), **env_threads},
        "machine": {"system": platform.system(), "release": platform.release(), "machine": platform.machine(),
                    "processor": cpu_model(), "node": platform.node()},
        "git": {"commit": commit, "dirty": dirty},
        "executable": sys.executable,
    }


class EnvironmentProbe:
    """:func:`environment` computed in a background thread from session start (its git and package
    metadata reads then overlap collection and tests instead of lengthening the session's end)."""

    def __init__(self, rootdir: Path, threads: int) -> None:
        self._result: list[dict[str, Any]] = []
        self._thread = threading.Thread(target=lambda: self._result.append(environment(rootdir, threads)),
                                        name="oracles-environment", daemon=True)
        self._thread.start()

    def result(self) -> dict[str, Any]:
        self._thread.join()
        if not self._result:  # the thread failed; its traceback went to stderr
            return {"error": "environment probe failed"}
        return self._result[0]
