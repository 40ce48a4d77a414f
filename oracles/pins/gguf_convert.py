"""The ``gguf-convert:PIN`` source: llama.cpp's own ``convert_hf_to_gguf.py`` on a pin's snapshot.

The converter is the one vendored in the ``llama-cpp-python`` sdist (``vendor/llama.cpp``: the script,
its ``conversion/`` package and its ``gguf-py``), fetched once from PyPI's simple index into
``$ORACLES_HOME/tools/`` and verified by the sha256 the pin's ``recipe.sdist_sha256`` names; the three
parts are extracted beside it. The script runs in a subprocess of this Python (it needs torch,
transformers and numpy, as ``convert_hf_to_gguf.py`` imports them) with ``PYTHONPATH`` set to that
``gguf-py``, so the pinned ``gguf`` package writes the file, not the installed one::

    python convert_hf_to_gguf.py SNAPSHOT --outtype f32 --outfile OUT/model.gguf

A pin's ``recipe``: ``{"tool": "convert_hf_to_gguf.py", "version": "llama-cpp-python==0.3.36",
"sdist": FILE, "sdist_sha256": HEX, "arguments": {"outtype": "f32"}}``. Nothing heavy is imported here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path
from typing import Callable

from oracles.errors import PinError
from oracles.pins.digests import sha256_file
from oracles.pins.gguf_file import read_header
from oracles.pins.gguf_pins import copy_tokenizer
from oracles.pins.pin import Pin, oracles_home

#: PEP 503 simple index of the distribution the converter comes from.
SIMPLE_INDEX = "https://pypi.org/simple/{name}/"
#: The parts of the sdist's ``vendor/llama.cpp`` the conversion needs.
PARTS = ("convert_hf_to_gguf.py", "conversion/", "gguf-py/")
#: ``recipe.arguments`` keys, each passed as ``--KEY VALUE``.
ARGUMENTS = ("outtype",)
#: What the converted file is called inside the snapshot folder.
OUTFILE = "model.gguf"


def _sdist_spec(pin: Pin) -> tuple[str, str, str]:
    """(distribution, version, sha256) from ``pin``'s recipe.

    Raises:
        PinError: ``recipe.version`` is not ``DIST==VER`` or ``recipe.sdist_sha256`` is not 64 hex.
    """
    recipe = pin.recipe or {}
    match = re.fullmatch(r"([A-Za-z0-9._-]+)==([A-Za-z0-9._+-]+)", str(recipe.get("version", "")))
    if match is None:
        raise PinError(f"{pin.path}: field 'recipe.version' is {recipe.get('version')!r}, not DIST==VERSION")
    sha = str(recipe.get("sdist_sha256", ""))
    if not re.fullmatch(r"[0-9a-f]{64}", sha):
        raise PinError(f"{pin.path}: field 'recipe.sdist_sha256' must be the sdist's 64-hex sha256")
    return match.group(1), match.group(2), sha


def sdist(dist: str, version: str, sha256: str) -> Path:
    """The sdist ``DIST-VERSION.tar.gz`` under ``$ORACLES_HOME/tools/``, downloaded from the simple index
    when missing; its sha256 checked either way.

    Raises:
        PinError: the index lists no such file, the download fails, or its sha256 differs.
    """
    name = f"{dist.replace('-', '_')}-{version}.tar.gz"
    path = oracles_home() / "tools" / name
    if not path.is_file():
        index = SIMPLE_INDEX.format(name=dist)
        try:
            html = urllib.request.urlopen(index, timeout=60).read().decode()
            urls = [u for u in re.findall(r'href="([^"]+)"', html) if u.split("#")[0].endswith("/" + name)]
            if not urls:
                raise PinError(f"{index}: lists no {name}")
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{name}.", dir=path.parent)
            os.close(fd)
            urllib.request.urlretrieve(urls[0].split("#")[0], tmp)
            os.replace(tmp, path)
        except OSError as exc:
            raise PinError(f"{index}: cannot download {name}: {exc}") from None
    got = sha256_file(path)
    if got != sha256:
        raise PinError(f"{path}: sha256 mismatch: expected {sha256}, actual {got}")
    return path


def converter(archive: Path) -> Path:
    """The folder holding :data:`PARTS` extracted from ``archive`` (its ``vendor/llama.cpp``), made once
    beside it (``<archive stem>-convert/``)."""
    dest = archive.parent / (archive.name.removesuffix(".tar.gz") + "-convert")
    if (dest / PARTS[0]).is_file():
        return dest
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=archive.parent))
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            rel = member.name.split("/vendor/llama.cpp/", 1)
            if len(rel) == 2 and any(rel[1] == p or rel[1].startswith(p) for p in PARTS) and member.isfile():
                member.name = rel[1]
                tar.extract(member, tmp, filter="data")
    tmp.rename(dest)
    return dest


def convert(script_dir: Path, snapshot: Path, out_file: Path, arguments: dict[str, str]) -> None:
    """Run ``convert_hf_to_gguf.py snapshot --KEY VALUE... --outfile out_file`` (module docstring).

    Raises:
        PinError: the script exits non-zero (its last output line quoted).
    """
    argv = [sys.executable, str(script_dir / PARTS[0]), str(snapshot), "--outfile", str(out_file)]
    for key, value in arguments.items():
        argv += [f"--{key}", str(value)]
    env = {**os.environ, "PYTHONPATH": str(script_dir / "gguf-py"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or [""]
        raise PinError(f"{script_dir / PARTS[0]} on {snapshot}: exit {done.returncode}: {tail[0]}")


def convert_builder(pin: Pin, source: tuple[Path, str, str],
                    write_pin: bool) -> tuple[Callable[[Path], str], str, dict[str, str]]:
    """(build function ``out -> model class``, source digest, {}) of a ``gguf-convert:`` pin whose ``source``
    (folder, digest, name: :func:`oracles.pins.materialize.source_of`) is materialised, after checking the
    source snapshot's digest against ``source_sha256`` (unless ``write_pin``) and the recipe's arguments.

    Raises:
        PinError: the source digest differs, a recipe argument that is not in :data:`ARGUMENTS`, or as
            :func:`_sdist_spec`; one line naming the pin file and field.
    """
    root, digest, _called = source

    if not write_pin and pin.source_sha256 != digest:
        raise PinError(f"{pin.path}: field 'source_sha256' is {pin.source_sha256} but the source {pin.source!r} has "
                       f"digest {digest}")
    arguments = {str(k): str(v) for k, v in (pin.recipe or {}).get("arguments", {}).items()}
    if bad := sorted(set(arguments) - set(ARGUMENTS)):
        raise PinError(f"{pin.path}: field 'recipe.arguments.{bad[0]}' is not a {PARTS[0]} argument this source "
                       f"passes ({', '.join(ARGUMENTS)})")
    dist, version, sha = _sdist_spec(pin)

    def build(out: Path) -> str:
        script_dir = converter(sdist(dist, version, sha))
        convert(script_dir, root, out / OUTFILE, arguments)
        read_header(out / OUTFILE).check_complete()
        copy_tokenizer(root, out)
        return pin.model_class

    return build, digest, {}
