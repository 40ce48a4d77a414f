"""Record files of a family: loading with located errors, canonical JSON and its sha256 (the key a
record is matched by across receipts and machines), and the token ids kept per tokenizer.

A family's requests (``oracles/builtin/records/<family>/*.json``) hold no token ids: those depend on the
tokenizer and chat template of the pin a test runs on. They are kept per tokenizer in
``<records folder>/<family>/tokens/<pin>.json``, a document whose ``tokenizer_sha256`` is the
:attr:`~oracles.pins.pin.Pin.tokenizer_sha256` of the pin that wrote it, so every pin with the same
tokenizer files reads the same ids. ``oracles records FAMILY --pin NAME`` writes one from the tokenizer
alone. The records folders are the project's (pytest ini option ``oracles_records``, default
``fixtures/records`` beside the ini file), then the built-in ones: a :class:`RecordStore` the test
session and the ``oracles`` command each make and enter for their run (:func:`entered`).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Collection

from oracles.active import Active
from oracles.errors import FixtureError, TokensMissing
from oracles.receipts.files import load_json

if TYPE_CHECKING:
    from oracles.pins.pin import Pin, PinStore

BUILTIN = Path(__file__).resolve().parents[1] / "builtin"
RECORDS = BUILTIN / "records"
TOKENIZER_COPIES = BUILTIN / "tokenizers"


@dataclass(frozen=True)
class RecordStore:
    """Folders holding ``<family>/tokens/*.json``, searched in order: the project's, then the built-in one."""

    dirs: tuple[Path, ...]

    @classmethod
    def with_project(cls, project_records: Path | None) -> "RecordStore":
        """The project's folder (when given and different from the built-in one) before the built-in records."""
        dirs = [RECORDS]
        if project_records is not None and project_records.resolve() != RECORDS:
            dirs.insert(0, project_records.resolve())
        return cls(tuple(dirs))

    @property
    def write_dir(self) -> Path:
        """Where ``oracles records`` writes: the project's folder (the first)."""
        return self.dirs[0]

    def tokens(self, family: str, pin: "Pin") -> tuple[Path, dict[str, Any]]:
        """The tokens document of ``family`` for ``pin``'s tokenizer: (path, document).

        Raises:
            TokensMissing: none matches; names the pin, the tokenizer digest and the command to run.
            FixtureError: a tokens file is malformed (path and field named).
        """
        want = pin.tokenizer_sha256
        for folder in self.dirs:
            for path in sorted((folder / family / "tokens").glob("*.json")):
                doc = _tokens_doc(path, path.stat().st_mtime_ns)
                if doc["tokenizer_sha256"] == want:
                    return path, doc
        raise TokensMissing(f"pin {pin.name}: family {family} has no token ids for its tokenizer (sha256 "
                            f"{want[:12]}) in {' or '.join(str(d / family / 'tokens') for d in self.dirs)}; run "
                            f"`oracles records {family} --pin {pin.name}`")


@functools.lru_cache(maxsize=32)
def _tokens_doc(path: Path, _mtime: int) -> dict[str, Any]:
    doc = load_json(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("tokenizer_sha256"), str):
        raise FixtureError(f"{path}: field 'tokenizer_sha256' is missing or not a string (a tokens file names the "
                           "tokenizer its ids were made with)")
    return doc


#: The built-in records alone: where token ids are looked up outside any run.
BUILTIN_RECORDS = RecordStore((RECORDS,))
#: The record stores of the runs in progress (:mod:`oracles.active`): a run nested in another sees its own.
_RUNS: Active[RecordStore] = Active()
#: Make a RecordStore the current one for a run, until :data:`left`.
entered = _RUNS.enter
#: Undo :data:`entered` (a run that ends).
left = _RUNS.leave


def records_store() -> RecordStore:
    """The store of the run in progress (its project's records, then the built-in ones), else
    :data:`BUILTIN_RECORDS`."""
    return _RUNS.current(lambda: BUILTIN_RECORDS)


def family_tokens(family: str, pin_name: str, where: RecordStore | None = None,
                  pins: "PinStore | None" = None) -> dict[str, Any]:
    """The tokens document of ``family`` for pin ``pin_name``: looked up in ``where`` (default
    :func:`records_store`), the pin in ``pins`` (default :func:`oracles.pins.pin.store`).

    Raises:
        TokensMissing, FixtureError, PinError: see :meth:`RecordStore.tokens` and :func:`oracles.pins.pin.load_pin`.
    """
    from oracles.pins.pin import load_pin

    return (where or records_store()).tokens(family, load_pin(pin_name, pins))[1]


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
