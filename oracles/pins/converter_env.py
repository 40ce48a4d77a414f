"""A converter's own environment: a venv under ``$ORACLES_HOME/envs/NAME`` that sees this interpreter's
site-packages through a ``main-venv.pth`` and holds exactly the converter's packages, installed with ``pip
--no-deps`` (a converter's declared dependencies are mostly never imported by a conversion). Its
``.installed`` file, written last, lists what it was made with; one made for other packages or another base
environment is made again. Used by :mod:`oracles.pins.litert` and :mod:`oracles.pins.executorch`, which also
keep a conversion's answer and the source's model files beside the converted file (:func:`finish`; the ONNX
export copies them too).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any, Sequence

from oracles.errors import PinError
from oracles.pins.convert import model_class_of


def ensure_env(env: Path, packages: Sequence[str], layered: Sequence[str]) -> Path:
    """The python of the environment at ``env``, made first when it is missing or its ``.installed`` file
    names other ``packages`` or another base (this interpreter's ``purelib``). ``layered``: the
    site-packages folders its ``main-venv.pth`` lists, in order.

    Raises:
        PinError: the venv or the pip install fails (the command's last line named).
    """
    marker, python = env / ".installed", env / "bin" / "python"
    want = {"packages": list(packages), "base": sysconfig.get_paths()["purelib"]}
    if marker.is_file() and python.exists() and json.loads(marker.read_text()) == want:
        return python
    shutil.rmtree(env, ignore_errors=True)
    env.parent.mkdir(parents=True, exist_ok=True)
    run_tool([sys.executable, "-m", "venv", "--without-pip", str(env)], f"creating the converter venv {env}")
    site = Path(sysconfig.get_paths(vars={"base": str(env), "platbase": str(env)})["purelib"])
    (site / "main-venv.pth").write_text("".join(f"{p}\n" for p in layered))
    run_tool([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-deps", *packages],
             f"installing the converter into {env}")
    marker.write_text(json.dumps(want))
    return python


def run_tool(cmd: list[str], what: str, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its stdout.

    Raises:
        PinError: a non-zero exit, naming ``what``, the status and the last line of its stderr.
    """
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()] or ["(no output)"]
        raise PinError(f"{what}: exit status {done.returncode}: {lines[-1].strip()}")
    return done.stdout


def copy_beside(source: Path, out: Path, names: Sequence[str]) -> None:
    """Copy each of ``names`` that ``source`` holds into ``out`` (model facts, tokenizer, chat template: a
    runtime without a tokenizer reads them beside the converted file)."""
    for name in names:
        if (source / name).is_file():
            shutil.copyfile(source / name, out / name)


def finish(source: Path, out: Path, result: dict[str, Any], names: Sequence[str]) -> str:
    """Keep a converter's answer as ``out/conversion.json`` (pinned with the rest; the pin writer reads it),
    copy ``names`` from ``source`` beside it (:func:`copy_beside`); returns ``out``'s model class."""
    (out / "conversion.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    copy_beside(source, out, names)
    return model_class_of(out)
