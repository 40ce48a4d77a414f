"""A receipt's npz sidecar: which file holds its arrays, opened lazily without pickles (its stored logits
read through :class:`oracles.receipts.logit_store.LogitStore`)."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from oracles.errors import ReceiptError


def find_sidecar(receipt: dict[str, Any], path: Path) -> tuple[Path | None, str | None]:
    """The receipt's npz sidecar and, when it is not the recorded one, a note saying which was used.

    The sidecar is ``receipt["arrays"]`` beside the JSON; when that file is missing (the pair was
    renamed or copied as ``R.json`` + ``R.npz``), the file with the JSON's stem and ``.npz`` is used.
    ``(None, None)`` when the receipt names no sidecar.

    Raises:
        ReceiptError: field ``arrays`` is not a string, or neither file exists (both named).
    """
    name = receipt.get("arrays")
    if not name:
        return None, None
    if not isinstance(name, str):
        raise ReceiptError(f"{path}: field 'arrays' is {name!r}, not the npz sidecar's file name")
    recorded = path.parent / name
    if recorded.is_file():
        return recorded, None
    namesake = path.with_suffix(".npz")
    if namesake.is_file():
        return namesake, f"{path}: npz sidecar {namesake} (the recorded {name} is missing; using the JSON's namesake)"
    raise ReceiptError(f"{path}: field 'arrays': its npz sidecar {recorded} is missing, and so is {namesake}")


def load_npz(npz: Path | None, path: Path) -> Any:
    """The npz sidecar ``npz`` of receipt ``path`` opened (lazily, no pickles) as a
    :class:`oracles.receipts.logit_store.LogitStore`, or None when ``npz`` is None.

    Raises:
        ReceiptError: the file is not a readable npz archive (both files named).
    """
    if npz is None:
        return None
    from oracles.receipts.logit_store import LogitStore

    try:
        return LogitStore(np.load(npz, allow_pickle=False))
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ReceiptError(f"{path}: field 'arrays': npz sidecar {npz} cannot be read: {exc}") from exc
