"""``litert-convert:PIN``: a ``.tflite`` made from a pinned snapshot by litert-torch, pinned by digest.

The converter (litert-torch 0.10.0 and what its conversion imports: jax, torchao, the MLIR converter)
never enters the default environment. It lives in its own virtual environment under
``$ORACLES_HOME/envs/<CONVERTER_ENV>/``, made on demand by the first build (``oracles materialize
NAME-litert``): a venv without pip whose ``main-venv.pth`` puts this interpreter's own site-packages
(torch, numpy, safetensors, ai-edge-litert) on its path, and exactly :data:`CONVERTER_PACKAGES`
installed into it with ``pip --no-deps`` (litert-torch's declared dependencies, a 2.1 GB resolution,
are mostly never imported by a conversion). The build runs :mod:`oracles.pins.litert_script` with that
environment's python in a subprocess (it has no ``oracles``; the job is a JSON file), writes
``model.tflite`` into the snapshot folder, and copies the source pin's ``config.json``,
``generation_config.json`` and tokenizer files beside it (LiteRT has no tokenizer; the engine reads
the model facts and the tokenizer from them).

Two exports: litert-torch's generative one (the default; prefill/decode signatures over a KV cache) and,
with ``recipe.arguments.export`` ``"plain"``, ``litert_torch.convert`` of the transformers model on one
fixed-length batch of ids (:data:`PLAIN_OPTIONS`). The pin's ``recipe`` records the tool, the
converter's packages and versions, the options (prefill length, KV rows, quantize, logits on prefill;
or the plain graph's length), the signatures written, and the one shim the conversion
needs (litert-torch imports ``tensorflow.lite.python.schema_py_generated``; TensorFlow is not its
dependency: :data:`oracles.pins.litert_script.SHIM`). Two builds with the same versions gave the same
bytes, so the result is checked by the pinned sha256 like every file.
"""

from __future__ import annotations

import json
import os
import sysconfig
import tempfile
from pathlib import Path
from typing import Any, Callable

from oracles.errors import PinError
from oracles.pins.converter_env import ensure_env, finish, run_tool
from oracles.pins.pin import TOKENIZER_FILES, Pin, oracles_home

#: The recipe's tool name (``recipe.tool``).
TOOL = "litert_torch.generative"
#: The converter environment's folder name under ``$ORACLES_HOME/envs``.
CONVERTER_ENV = "litert-torch-0.10.0"
#: What a conversion imports beyond the main environment, each exactly (installed with ``--no-deps``).
CONVERTER_PACKAGES = ("litert-torch==0.10.0", "litert-converter==0.5.0", "ai-edge-quantizer==0.10.0",
                      "jax==0.10.2", "jaxlib==0.10.2", "opt_einsum==3.4.0", "torchao==0.18.0", "scipy==1.17.1",
                      "absl-py==2.5.1", "multipledispatch==1.0.0", "immutabledict==4.3.1")
#: Options a recipe of the generative export may give (``recipe.arguments``), with the defaults the
#: built-in pins use.
OPTIONS: dict[str, Any] = {"prefill_len": 64, "kv_cache_max_len": 512, "quantize": "none",
                           "output_logits_on_prefill": True}
#: The options of a plain graph (``recipe.arguments.export`` is ``"plain"``): the fixed number of positions
#: ``T`` it runs. 512 serves the records the generative export's 512 KV rows serve.
PLAIN_OPTIONS: dict[str, Any] = {"export": "plain", "seq_len": 512}
#: The recipe's tool name of a plain graph.
PLAIN_TOOL = "litert_torch.convert"
#: Files copied from the source snapshot beside the .tflite (model facts, tokenizer, chat template).
COPIED = ("config.json", "generation_config.json", *TOKENIZER_FILES)
#: The artifact's file name in its snapshot folder.
TFLITE = "model.tflite"
SCRIPT = Path(__file__).with_name("litert_script.py")


def converter_env() -> Path:
    """The converter environment's folder (``$ORACLES_HOME/envs/litert-torch-0.10.0``)."""
    return oracles_home() / "envs" / CONVERTER_ENV


def ensure_converter_env(env: Path | None = None) -> Path:
    """The python of the converter environment, made first when it is missing or was made for other
    packages (its ``.installed`` file lists what it holds, written last).

    Raises:
        PinError: the venv or the pip install fails (the command's last line named).
    """
    base = sysconfig.get_paths()["purelib"]
    return ensure_env(env or converter_env(), CONVERTER_PACKAGES, [base])


def options_of(pin: Pin) -> dict[str, Any]:
    """The conversion options of ``pin`` (``recipe.arguments`` over :data:`OPTIONS`).

    Raises:
        PinError: an option the conversion does not take, naming the pin file and field.
    """
    given = dict((pin.recipe or {}).get("arguments", {}))
    export = given.get("export", "generative")
    if export not in ("generative", "plain"):
        raise PinError(f"{pin.path}: field 'recipe.arguments.export' is {export!r}; a litert conversion exports "
                       "'generative' (prefill/decode over a KV cache) or 'plain' (one fixed-length signature)")
    allowed = PLAIN_OPTIONS if export == "plain" else {"export": "generative", **OPTIONS}
    if bad := sorted(set(given) - set(allowed)):
        raise PinError(f"{pin.path}: field 'recipe.arguments.{bad[0]}' is not a litert {export} conversion option "
                       f"({', '.join(allowed)})")
    return {**OPTIONS, **given} if export == "generative" else {**PLAIN_OPTIONS, **given}


def litert_builder(pin: Pin, source: Path, write_pin: bool) -> Callable[[Path], str]:
    """The build function ``out -> model class`` of a ``litert-convert:`` pin from the verified
    ``source`` snapshot folder; unless ``write_pin``, the recipe's converter packages must be this
    module's :data:`CONVERTER_PACKAGES` (the versions that gave the pinned bytes).

    Raises:
        PinError: a recipe naming other converter packages, or an unknown option (pin file and field).
    """
    recipe = pin.recipe or {}
    if not write_pin and list(recipe.get("packages", [])) != list(CONVERTER_PACKAGES):
        raise PinError(f"{pin.path}: field 'recipe.packages' is {recipe.get('packages')!r} but this oracles converts "
                       f"with {list(CONVERTER_PACKAGES)}; the pinned bytes need those")
    options = options_of(pin)
    return lambda out: convert_to_tflite(source, out, options)


def convert_to_tflite(source: Path, out: Path, options: dict[str, Any]) -> str:
    """Convert ``source`` into ``out/model.tflite`` in the converter environment and copy the source's
    config and tokenizer files beside it; returns the model class (``architectures[0]``). The result
    the script printed is kept as ``out/conversion.json`` (pinned with the rest; the pin writer reads it).

    Raises:
        PinError: the conversion fails (the converter's last error line named).
    """
    python = ensure_converter_env()
    with tempfile.TemporaryDirectory(prefix="litert-job.") as tmp:
        job = Path(tmp) / "job.json"
        job.write_text(json.dumps({"source": str(source), "out": str(out), "file": TFLITE, "options": options}))
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONHASHSEED": "0"}
        env.pop("PYTHONPATH", None)
        stdout = run_tool([str(python), str(SCRIPT), str(job)], f"converting {source} to {out / TFLITE}", env)
    result = json.loads(stdout.strip().splitlines()[-1])
    return finish(source, out, result, COPIED)


def recipe_fields(recipe: dict[str, Any], root: Path) -> dict[str, Any]:
    """``recipe`` as a build at ``root`` makes it (``--write-pin``): the tool, the converter packages,
    the options, the signatures the script reported, and the shim."""
    from oracles.pins.litert_script import SHIM

    result = json.loads((root / "conversion.json").read_text())
    given = dict(recipe.get("arguments", {}))
    plain = given.get("export") == "plain"
    options = {**(PLAIN_OPTIONS if plain else OPTIONS), **given}
    return {**recipe, "tool": PLAIN_TOOL if plain else TOOL, "version": CONVERTER_PACKAGES[0].split("==")[1],
            "packages": list(CONVERTER_PACKAGES), "arguments": options, "signatures": result["signatures"],
            "shim": {alias: f"sys.modules alias of {real}" for alias, real in SHIM.items()}}
