"""The files a receipt session writes and reads: exclusive atomic writes, the receipt's JSON layout,
the partial log, the npz sidecar, strict JSON reading.

A receipt is never overwritten: it is written to a temporary file, fsynced, then hard-linked to its
final name (``os.link`` fails when the name exists) and the temporary name removed. The
``.partial.jsonl`` beside it gains one line per finished test, each one ``write(2)`` of an unbuffered
file, so a killed run leaves its evidence (:func:`oracles.receipts.table.load_records` reads either back).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from oracles.errors import FixtureError, ReceiptError


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_exclusive(path: Path, data: bytes) -> None:
    """Create ``path`` with ``data``: temporary file, fsync, hard link to the final name, unlink.

    The final name appears whole or not at all and is never overwritten.

    Raises:
        ReceiptError: when ``path`` exists or its folder cannot be written; no file is left behind.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "xb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
    except FileExistsError as exc:
        raise ReceiptError(f"{path}: already exists; receipts are never overwritten") from exc
    except OSError as exc:
        raise ReceiptError(f"{path}: cannot be written: {exc.strerror or exc}") from exc
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:  # the folder itself is unusable (e.g. a file): the error above says so
            pass
    fsync_dir(path.parent)


#: Top-level lists of a receipt written one compact item per line.
ONE_LINE_ITEMS = ("tests", "not_run")


#: Encoders made once: ``json.dumps`` with any non-default argument builds a new encoder per call, a
#: cost paid per test (a partial-log line) and per receipt item.
_ITEM = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(", ", ": "))


def _c_encoder(encoder: json.JSONEncoder) -> Callable[[Any], str]:
    """``encoder.encode`` through json's C encoder made once. ``JSONEncoder.encode`` makes one (and a
    closure and a markers dict) per call: a third of a test record's line. Same output: ``encode``
    uses this very encoder for a non-str object without ``indent``. No markers: the circular-reference
    check is ``check_json_safe``'s, when the data was attached (a cycle recurses there first)."""
    try:
        from _json import make_encoder
    except ImportError:  # a Python without json's C accelerator
        return encoder.encode
    c = make_encoder(None, encoder.default, json.encoder.encode_basestring, None, encoder.key_separator,
                     encoder.item_separator, False, False, False)

    def encode(obj: Any) -> str:
        return encoder.encode(obj) if isinstance(obj, str) else "".join(c(obj, 0))

    return encode


#: ``obj`` as :func:`dump_json` writes an item of a receipt's one-line lists: strict JSON on one line
#: (raises ValueError on a NaN or infinity).
encode_item = _c_encoder(_ITEM)


def dump_json(obj: Any, encoded: Mapping[str, Sequence[str | None]] | None = None) -> bytes:
    """Strict JSON (no NaN), UTF-8, two-space indent.

    The items of a receipt's ``tests`` and ``not_run`` lists are written one compact line each:
    readable for thousands of tests, and json's C encoder (used only without ``indent``) writes them
    about ten times faster than the indented pure-Python one.

    Args:
        encoded: for a one-line list, its items' text already made by :func:`encode_item` (None for an
            item to encode here), one per item: the test records the partial log wrote are not encoded twice.

    Raises:
        ValueError: a NaN or infinity anywhere in ``obj``; ``encoded`` with another count of texts than
            its list has items.
    """
    def dumps(value: Any, indent: int | None) -> str:
        if indent is None:
            return encode_item(value)
        return json.dumps(value, indent=indent, allow_nan=False, ensure_ascii=False)

    if not isinstance(obj, dict):
        return (dumps(obj, 2) + "\n").encode()
    parts = []
    for key, value in obj.items():
        if key in ONE_LINE_ITEMS and isinstance(value, list) and value:
            given = (encoded or {}).get(key) or [None] * len(value)
            items = (text or encode_item(item) for item, text in zip(value, given, strict=True))
            text = "[\n    " + ",\n    ".join(items) + "\n  ]"
        else:  # strings hold no raw newline in JSON, so re-indenting by lines is safe
            text = dumps(value, 2).replace("\n", "\n  ")
        parts.append(f"  {dumps(str(key), None)}: {text}")
    return ("{\n" + ",\n".join(parts) + "\n}\n").encode() if parts else b"{}\n"


class PartialLog:
    """The ``.partial.jsonl`` beside a receipt: opened exclusively, one flushed line per finished test.

    Lines are flushed to the OS at once, so they survive the process being killed (no fsync per line:
    the guarantee is against a killed process, not a lost machine). :meth:`close` fsyncs the file when
    asked: when no receipt holds its records.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._fh = open(path, "xb", buffering=0)  # unbuffered: each line is one write(2), nothing held back
        except OSError as exc:
            raise ReceiptError(f"{path}: cannot be created: {exc.strerror or exc}") from exc

    def write(self, obj: Mapping[str, Any]) -> None:
        """One line: ``obj`` as :func:`encode_item` writes it (raises ValueError on a NaN or infinity)."""
        self._fh.write((encode_item(obj) + "\n").encode("utf-8"))

    def write_test(self, record: Mapping[str, Any]) -> str:
        """A finished test's line, ``{"event": "test", ...record}`` (``record``: a test record's fields, never
        empty); returns ``record``'s text as :func:`encode_item` makes it, for the receipt to reuse (the line
        is that text with the event key put first). Raises ValueError on a NaN or infinity."""
        text = encode_item(record)
        self._fh.write(('{"event": "test", ' + text[1:] + "\n").encode("utf-8"))
        return text

    def close(self, sync: bool = True) -> None:
        """Close the log, fsynced first with ``sync``."""
        if not self._fh.closed:
            if sync:
                os.fsync(self._fh.fileno())
            self._fh.close()


def load_json(path: Path) -> Any:
    """Read a JSON file; a syntax error names the file and line.

    Raises:
        FixtureError: ``"<path>:<line>:<col>: <msg>"``, ``"<path>: cannot be read: ..."``, or
            ``"<path>: not a UTF-8 text file ..."`` (e.g. an npz sidecar passed where its JSON belongs).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise FixtureError(f"{path}: cannot be read: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise FixtureError(f"{path}: not a UTF-8 text file (byte 0x{exc.object[exc.start]:02x} at offset {exc.start}), "
                           f"so not a JSON receipt") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise FixtureError(f"{path}:{exc.lineno}:{exc.colno}: not valid JSON: {exc.msg}") from exc


def pack_arrays(staging: Path, npz: Path) -> int:
    """Pack every ``*.npy`` in ``staging`` into one npz sidecar, written exclusively; remove staging.

    Unit logits (staged with ``<key>.logits.json``) are stored coded, the other arrays as attached
    (:func:`oracles.receipts.logit_store.pack`). Returns the number of arrays packed (0 writes no file).

    Raises:
        ReceiptError: when ``npz`` exists or cannot be written, or a staged logit array is not ``[V]`` or
            ``[R, V]`` rows.
    """
    files = sorted(staging.glob("*")) if staging.is_dir() else []
    if any(f.suffix == ".npy" for f in files):
        from oracles.receipts.logit_store import pack  # numpy only when there are arrays

        try:
            data, count = pack(staging)
        except ValueError as exc:
            raise ReceiptError(f"{npz}: a staged logit array cannot be stored: {exc}") from exc
        write_exclusive(npz, data)
    else:
        count = 0
    for f in files:
        f.unlink()
    if staging.is_dir():
        staging.rmdir()
    return count
