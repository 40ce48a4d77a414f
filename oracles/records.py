"""Record files of a family (``fixtures/records/<family>/*.json``): loading with located errors,
canonical JSON and its sha256 (the key a record is matched by across receipts and machines)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Collection

from oracles.errors import FixtureError
from oracles.receipts import load_json

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RECORDS = FIXTURES / "records"


def canonical_json(obj: Any) -> str:
    """Sorted keys, no whitespace, UTF-8 kept, NaN refused: one text for one value."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def canonical_sha256(obj: Any) -> str:
    """sha256 hex of :func:`canonical_json` of ``obj`` encoded as UTF-8."""
    return hashlib.sha256(canonical_json(obj).encode()).hexdigest()


def load_record_list(path: Path, key: str = "records", family: str | None = None,
                     fields: Collection[str] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Read a record file ``{..., key: [ {"id": ..., ...}, ... ]}``; ids must be unique non-empty strings.

    ``family``: the file's top-level ``family``, where it has one, must equal it (a file of one family
    handed to another's loader is refused); ``fields``: every field a record may have (a misspelt field such
    as ``idz`` is refused instead of being ignored).

    Returns (the file's top-level object, its records).

    Raises:
        FixtureError: not JSON (path:line:col), ``key`` missing, a wrong ``family``, a record without
            a string id, an unknown field, or a duplicate id (path and record index or id named).
    """
    obj = load_json(path)
    if not isinstance(obj, dict) or not isinstance(obj.get(key), list):
        raise FixtureError(f"{path}: field {key!r} is missing or not a list")
    if family is not None and obj.get("family", family) != family:
        raise FixtureError(f"{path}: field 'family' is {obj.get('family')!r}, expected {family!r}")
    seen: set[str] = set()
    for i, rec in enumerate(obj[key]):
        rid = rec.get("id") if isinstance(rec, dict) else None
        if not isinstance(rid, str) or not rid or "[" in rid or "]" in rid:
            raise FixtureError(f"{path}: {key}[{i}]: field 'id' is missing or not a plain non-empty string")
        if rid in seen:
            raise FixtureError(f"{path}: {key}[{i}]: duplicate record id {rid!r}")
        unknown = sorted(set(rec) - set(fields)) if fields is not None else []
        if unknown:
            raise FixtureError(f"{path}: record {rid!r}: unknown field {unknown[0]!r} (known: {', '.join(sorted(fields or ()))})")
        seen.add(rid)
    return obj, obj[key]


def require(rec: dict[str, Any], field: str, kind: type | tuple[type, ...], where: str) -> Any:
    """``rec[field]`` when it is a ``kind``, else FixtureError naming ``where`` (file and record) and the field."""
    value = rec.get(field)
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        name = kind.__name__ if isinstance(kind, type) else "/".join(k.__name__ for k in kind)
        raise FixtureError(f"{where}: field {field!r} is missing or not a {name}")
    return value
