"""What a pin records of a file: its size and sha256, and the digest of a safetensors file's header.

Below :mod:`oracles.pins.pin` and :mod:`oracles.pins.precision`, which both read them; the standard
library only.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oracles.errors import PinError


@dataclass(frozen=True)
class FileDigest:
    """A pinned file's size (``bytes``) and sha256 (64 lowercase hex digits)."""

    bytes: int
    sha256: str


def sha256_file(path: Path) -> str:
    """The sha256 of the file at ``path`` as 64 lowercase hex digits, read in the library's chunks."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def safetensors_header(path: Path) -> tuple[int, dict[str, Any], bytes]:
    """Read a safetensors header: (header length N, parsed header, the raw 8 + N bytes).

    Raises:
        PinError: the file is shorter than its declared header or the header is not JSON (path named).
    """
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) != 8:
            raise PinError(f"{path}: {len(head)} bytes, too short for a safetensors header length")
        (n,) = struct.unpack("<Q", head)
        size = path.stat().st_size
        if n > size - 8:
            raise PinError(f"{path}: header length {n} runs past the end of the file ({size} bytes)")
        raw = fh.read(n)
    try:
        header = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PinError(f"{path}: safetensors header is not JSON: {exc}") from exc
    if not isinstance(header, dict):
        raise PinError(f"{path}: safetensors header is not a JSON object")
    return n, header, head + raw


def file_digests(root: Path, names: list[str] | None = None) -> dict[str, FileDigest]:
    """Size and sha256 of each file under ``root`` (all regular files when ``names`` is None)."""
    if names is None:
        names = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return {n: FileDigest((root / n).stat().st_size, sha256_file(root / n)) for n in names}
