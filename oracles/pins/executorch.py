"""``executorch-convert:PIN``: a ``.pte`` made from a pinned snapshot by optimum-executorch, pinned by digest.

The runtime (``executorch==1.5.1``, installed ``--no-deps`` with ``ruamel.yaml`` and ``tabulate``, what its
Python runtime's import needs) is in the main environment, where the engine runs it. The exporter
(optimum-executorch 1.1.0 and what its export imports: optimum, torchao, coremltools, pandas, ...) never
enters it: it lives in its own virtual environment under ``$ORACLES_HOME/envs/<CONVERTER_ENV>/``, made on
demand by the first build (``oracles materialize NAME-executorch``) as LiteRT's is (:mod:`oracles.pins.litert`):
a venv without pip whose ``main-venv.pth`` puts this interpreter's site-packages (torch, transformers,
executorch) on its path, and exactly :data:`CONVERTER_PACKAGES` installed into it with ``pip --no-deps``
(optimum-executorch 1.1.0 pins ``transformers==5.0.0rc1``, which pip cannot resolve beside 5.24; with
``--no-deps`` its export runs on 5.24). The build runs :mod:`oracles.pins.executorch_script` with that
environment's python in a subprocess, writes ``model.pte`` into the snapshot folder, and copies the
source pin's ``config.json``, ``generation_config.json`` and tokenizer files beside it (ExecuTorch's
Python runtime has no tokenizer; the engine reads the model facts and the tokenizer from them). The
subprocess is started by the first build of a process and serves its later builds (:class:`Converter`):
``oracles materialize A B C`` of three such pins imports the exporter once, not three times.

The pin's ``recipe`` records the tool (``optimum.exporters.executorch.main_export``, what ``optimum-cli
export executorch`` calls), the converter's packages and versions, the options (:data:`OPTIONS`: the
recipe, dtype, max sequence length, linear quantization), the two additions the script makes
(:data:`oracles.pins.executorch_script.ADDITIONS`) and the program's methods and constants as the script
read them back. Two builds with the same versions gave the same bytes (the twin's 8da4w pin, rebuilt
to its pinned digests), so the result is checked by the pinned sha256 like every file.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

from oracles.errors import PinError
from oracles.pins.convert import versions
from oracles.pins.converter_env import ensure_env, finish
from oracles.pins.pin import TOKENIZER_FILES, Pin, oracles_home

#: The recipe's tool name (``recipe.tool``).
TOOL = "optimum.exporters.executorch"
#: The runtime and exporter core, installed in the main environment (the engine's); the converter env sees it.
RUNTIME = "executorch==1.5.1"
#: The converter environment's folder name under ``$ORACLES_HOME/envs``.
CONVERTER_ENV = "optimum-executorch-1.1.0"
#: What an export imports beyond the main environment, each exactly (installed with ``--no-deps``):
#: optimum-executorch's recipes import every recipe module (coremltools for the Core ML ones, with
#: attrs, cattrs and pyaml), executorch's devtools import pandas.
CONVERTER_PACKAGES = ("optimum-executorch==1.1.0", "optimum==2.0.0", "torchao==0.18.0", "coremltools==9.0",
                      "pandas==3.1.1", "attrs==26.1.0", "cattrs==26.2.1", "pyaml==26.7.0")
#: Options a recipe may give (``recipe.arguments``), with the defaults the built-in pins use: optimum-cli's
#: ``--recipe xnnpack --dtype float32``; 512 cache rows hold the records the port family samples and one
#: chunk of the graded corpus.
OPTIONS: dict[str, Any] = {"recipe": "xnnpack", "dtype": "float32", "max_seq_len": 512, "qlinear": None}
#: The ``qlinear`` values a recipe may give (optimum-executorch 1.1.0's ``quantize_model_``: group size 32,
#: torchao's ``hqq_scale_only`` scales); what a program holds is read from it (:mod:`oracles.pins.pte_artifact`).
QLINEAR = (None, "8da4w", "8w")
#: Files copied from the source snapshot beside the .pte (model facts, tokenizer, chat template).
COPIED = ("config.json", "generation_config.json", *TOKENIZER_FILES)
#: The artifact's file name in its snapshot folder.
PTE = "model.pte"
SCRIPT = Path(__file__).with_name("executorch_script.py")
#: How long a closing converter may take to exit: it exits at once between jobs (end of its input).
CLOSE_SECONDS = 10


def converter_env() -> Path:
    """The converter environment's folder (``$ORACLES_HOME/envs/optimum-executorch-1.1.0``)."""
    return oracles_home() / "envs" / CONVERTER_ENV


def ensure_converter_env(env: Path | None = None) -> Path:
    """The python of the converter environment, made first when it is missing or was made for other
    packages (its ``.installed`` file lists what it holds, written last).

    Raises:
        PinError: the main environment lacks :data:`RUNTIME` (the export lowers with it), or the venv or
            the pip install fails (the command's last line named).
    """
    name, want_version = RUNTIME.split("==")
    if versions((name,)).get(name) != want_version:
        raise PinError(f"an executorch-convert build needs {RUNTIME} in this environment (found "
                       f"{versions((name,)).get(name)!r}): pip install --no-deps {RUNTIME} ruamel.yaml tabulate")
    base = sysconfig.get_paths()["purelib"]
    # every site-packages this interpreter sees (a venv layered on another by a .pth sees both; a path a .pth
    # names is not itself searched for .pth files, so each is listed)
    layered = list(dict.fromkeys([base, *(p for p in sys.path if p.endswith("site-packages"))]))
    return ensure_env(env or converter_env(), CONVERTER_PACKAGES, layered)


def options_of(pin: Pin) -> dict[str, Any]:
    """The export options of ``pin`` (``recipe.arguments`` over :data:`OPTIONS`).

    Raises:
        PinError: an option the conversion does not take, or a ``qlinear`` with no precision here (pin file
            and field named).
    """
    given = dict((pin.recipe or {}).get("arguments", {}))
    if bad := sorted(set(given) - set(OPTIONS)):
        raise PinError(f"{pin.path}: field 'recipe.arguments.{bad[0]}' is not an executorch conversion option "
                       f"({', '.join(OPTIONS)})")
    options = {**OPTIONS, **given}
    if options["qlinear"] not in QLINEAR:
        raise PinError(f"{pin.path}: field 'recipe.arguments.qlinear' is {options['qlinear']!r}, not one of "
                       f"{', '.join(str(k) for k in QLINEAR)}")
    return options


def executorch_builder(pin: Pin, source: Path, write_pin: bool) -> Callable[[Path], str]:
    """The build function ``out -> model class`` of an ``executorch-convert:`` pin from the verified
    ``source`` snapshot folder; unless ``write_pin``, the recipe's converter packages must be this module's
    :data:`CONVERTER_PACKAGES` (the versions that gave the pinned bytes).

    Raises:
        PinError: a recipe naming other converter packages, or an unknown option (pin file and field).
    """
    recipe = pin.recipe or {}
    if not write_pin and list(recipe.get("packages", [])) != [RUNTIME, *CONVERTER_PACKAGES]:
        raise PinError(f"{pin.path}: field 'recipe.packages' is {recipe.get('packages')!r} but this oracles converts "
                       f"with {[RUNTIME, *CONVERTER_PACKAGES]}; the pinned bytes need those")
    options = options_of(pin)
    return lambda out: convert_to_pte(source, out, options)


class Converter:
    """The converter environment's python running :mod:`oracles.pins.executorch_script`, serving jobs in
    order: a job file's path per line on its stdin, one JSON answer per line on its stdout, its other
    output (the exporter's) kept in a temporary file for the error messages. One per process
    (:meth:`get`), closed when the process exits."""

    _running: "Converter | None" = None

    def __init__(self, python: Path) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}
        env.pop("PYTHONPATH", None)
        self.log: IO[bytes] = tempfile.TemporaryFile(prefix="executorch-converter.")
        # -P: the script's folder (oracles/pins, which holds this module, executorch.py) must not shadow the
        # executorch package on the converter's path
        self.process = subprocess.Popen([str(python), "-P", str(SCRIPT)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                        stderr=self.log, text=True, env=env)

    @classmethod
    def get(cls) -> "Converter":
        """This process's converter, started (the environment made first: :func:`ensure_converter_env`) when
        there is none or the last one has exited."""
        if cls._running is None or cls._running.process.poll() is not None:
            if cls._running is not None:
                cls._running.close()  # exited: its output dropped
            cls._running = cls(ensure_converter_env())
            atexit.register(cls._running.close)
        return cls._running

    def convert(self, job: dict[str, Any], what: str) -> dict[str, Any]:
        """The script's result for ``job`` (:func:`oracles.pins.executorch_script.convert`).

        Raises:
            PinError: the job failed (its exception's line) or the converter exited (its last line of output),
                naming ``what``.
        """
        assert self.process.stdin is not None and self.process.stdout is not None
        with tempfile.TemporaryDirectory(prefix="executorch-job.") as tmp:
            path = Path(tmp) / "job.json"
            path.write_text(json.dumps(job))
            try:
                self.process.stdin.write(f"{path}\n")
                self.process.stdin.flush()
            except BrokenPipeError:
                pass  # the exit is reported below
            line = self.process.stdout.readline()
        if not line.strip():
            raise PinError(f"{what}: the converter exited ({self.process.wait()}): {self._last_line()}")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise PinError(f"{what}: {answer['error']}")
        return dict(answer["result"])

    def _last_line(self) -> str:
        self.log.seek(0)
        lines = [ln for ln in self.log.read().decode(errors="replace").splitlines() if ln.strip()]
        return lines[-1].strip() if lines else "(no output)"

    def close(self) -> None:
        """End the converter (its input closed: it exits between jobs; killed if a job still runs after
        :data:`CLOSE_SECONDS`, as when this process is interrupted mid-build) and drop its output."""
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=CLOSE_SECONDS)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        if Converter._running is self:
            Converter._running = None


def convert_to_pte(source: Path, out: Path, options: dict[str, Any]) -> str:
    """Export ``source`` into ``out/model.pte`` in the converter environment (this process's :class:`Converter`)
    and copy the source's config and tokenizer files beside it; returns the model class (``architectures[0]``).
    The result the script answered is kept as ``out/conversion.json`` (pinned with the rest; the pin writer
    reads it).

    Raises:
        PinError: the export fails (the exporter's last error line named).
    """
    job = {"source": str(source), "out": str(out), "file": PTE, "options": options}
    result = Converter.get().convert(job, f"converting {source} to {out / PTE}")
    return finish(source, out, result, COPIED)


def recipe_fields(recipe: dict[str, Any], root: Path) -> dict[str, Any]:
    """``recipe`` as a build at ``root`` makes it (``--write-pin``): the tool, its version, the packages,
    the options, the additions, and the methods and constants the script read back."""
    from oracles.pins.executorch_script import ADDITIONS

    result = json.loads((root / "conversion.json").read_text())
    options = {**OPTIONS, **dict(recipe.get("arguments", {}))}
    return {**recipe, "tool": TOOL, "version": CONVERTER_PACKAGES[0].split("==")[1],
            "packages": [RUNTIME, *CONVERTER_PACKAGES], "arguments": options, "additions": dict(ADDITIONS),
            "methods": result["methods"], "constants": result["constants"], "forward_output": result["forward_output"]}


def written_fields(obj: dict[str, Any], root: Path) -> dict[str, Any]:
    """The pin file ``obj`` as a build at ``root`` writes it (``--write-pin``): its recipe
    (:func:`recipe_fields`) and the precision its program holds (:func:`oracles.pins.pte_artifact.read_precision`:
    what the XNNPACK delegates' values are, whatever the recipe asked for)."""
    from oracles.pins.pte_artifact import read_precision

    return {**obj, "recipe": recipe_fields(obj["recipe"], root), "precision": read_precision(root / PTE).to_json()}
