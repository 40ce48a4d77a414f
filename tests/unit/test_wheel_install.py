"""The package as a user gets it: a wheel built from this tree, installed into a fresh venv with only what
``pytest -m dry`` needs (pytest, pytest-timeout, numpy, tokenizers, jinja2; never torch), runs
``pytest --pyargs oracles.suite -m dry`` on the built-in pins from a folder outside this repository
whose ini file turns pytest-oracles on.

The wheel is built from a copy of the tree (``pip wheel`` leaves ``build/`` and ``*.egg-info`` in the
folder it builds), in pip's isolated build environment as a user's pip would (pyproject's
``setuptools>=68`` from the registry; a venv's bundled setuptools 65 cannot read its license field). The venv
is made without pip (``venv --without-pip``) and filled by this environment's pip (``pip --python``),
which saves ensurepip's few seconds; the dependencies come from the package registry under
constraints.txt. Slow (~20 s here, most of it pip); the phases' seconds are printed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


def sh(*cmd: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, \
        f"{' '.join(map(str, cmd))} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def clean_env() -> dict[str, str]:
    """This environment without what would let the repository's tree win over the installed wheel."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTEST_ADDOPTS", "PYTEST_PLUGINS")
    return {k: v for k, v in os.environ.items() if k not in drop and not k.startswith("PYTEST_")}


def test_wheel_in_a_fresh_venv_runs_the_dry_suite_outside_the_repo(tmp_path: Path) -> None:
    seconds: dict[str, float] = {}
    t = time.perf_counter()
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copyfile(ROOT / name, src / name)
    shutil.copytree(ROOT / "oracles", src / "oracles", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    sh(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp_path / "dist", src, env=clean_env())
    (wheel,) = (tmp_path / "dist").glob("pytest_oracles-*.whl")
    seconds["wheel"] = time.perf_counter() - t

    t = time.perf_counter()
    venv = tmp_path / "venv"
    sh(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    sh(sys.executable, "-m", "pip", "--python", python, "install", "-q", "-c", ROOT / "constraints.txt", wheel,
       env=clean_env())
    seconds["venv + install"] = time.perf_counter() - t
    installed = sh(python, "-c", "import importlib.metadata as m; print(sorted(d.metadata['Name'].lower() for d in "
                                 "m.distributions()))", env=clean_env())
    assert "'torch'" not in installed and "'transformers'" not in installed, installed

    t = time.perf_counter()
    user = tmp_path / "elsewhere"
    user.mkdir()
    (user / "pytest.ini").write_text("[pytest]\noracles = true\n")
    where = sh(python, "-c", "import oracles; print(oracles.__file__)", cwd=user, env=clean_env()).strip()
    assert Path(where).is_relative_to(venv), f"oracles imported from {where}, not the venv"
    out = sh(python, "-m", "pytest", "--pyargs", "oracles.suite", "-m", "dry", "-p", "no:cacheprovider", "-q",
             cwd=user, env=clean_env())
    seconds["pytest -m dry"] = time.perf_counter() - t
    tail = out.strip().splitlines()[-1]
    assert " passed" in tail and "failed" not in tail and "error" not in tail, out[-3000:]
    assert "warning" not in tail, f"a warning (an unknown mark without xdist, say): {out[-3000:]}"
    receipts = list((user / "receipts" / "default").glob("*.json"))
    assert len(receipts) == 1, "the ini turned pytest-oracles on: one receipt in the user's folder"
    assert "'matplotlib'" not in installed, installed
    _survey_without_matplotlib(venv, user)
    print("seconds: " + ", ".join(f"{k} {v:.1f}" for k, v in seconds.items()))


def _survey_without_matplotlib(venv: Path, user: Path) -> None:
    """The installed ``oracles`` command without matplotlib (no plots, torch or dev extra): a survey writes
    its JSON, says in one line why there is no PNG, and exits 0 (a user's report: a traceback, exit 1)."""
    stats = {"pos0": 3.0, "rest": 1.0, "overall": 3.0, "argmax_pos": 0, "argmax_ch": 1}
    record = {"nodeid": "x::test_text_absmax[a]", "outcome": "passed",
              "data": {"kind": "absmax", "pin": "mine", "engine": "torch", "run": "a", "tokens": 2, "layers": [stats],
                       "layer_input": stats, "final_norm": stats, "mlp_down_in": None}}
    (user / "r.json").write_text(json.dumps({"tests": [record]}))
    done = subprocess.run([str(venv / "bin" / "oracles"), "survey", "r.json"], cwd=user, env=clean_env(),
                          capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stderr) == (0, "PNG not written: matplotlib is not installed (pip install "
                                                 "'pytest-oracles[plots]')\n"), done
    assert (user / "r.mine.absmax.json").is_file() and not (user / "r.mine.absmax.png").exists()
