"""One section per family of a receipt: its rows of the checks table (failed first), its records (failed
first) and, per check, a table of the figures its records attached (each record's numbers, flags and
short words, one level into an object). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from oracles.receipts.table import FAILING, TestRecord
from oracles.report.curves import Curve
from oracles.report.load import Loaded
from oracles.report.verdict import check_of

#: At most this many records a check's table shows (the failed first); the receipt holds the rest.
MAX_ROWS = 30
#: At most this many figures a check's table shows, in the order its records attached them.
MAX_COLUMNS = 10
#: A string figure longer than this is no figure (a message, a text, a digest): left to the receipt.
MAX_WORD = 40
#: Keys that are identities, not figures: the record's own id and engine are in its row already.
SKIP = frozenset({"request_sha256", "row_sha256", "engine", "pin", "kind", "describe", "text", "ids"})


@dataclass(frozen=True)
class RecordTable:
    """The figures of one check's records: ``columns`` (data keys, ``a.b`` one level in), ``rows``
    (record id, outcome, one cell a column, "" where a record lacks it), ``left`` (records not shown)."""

    check: str
    columns: tuple[str, ...]
    rows: tuple[tuple[str, str, tuple[str, ...]], ...]
    left: int


@dataclass
class Section:
    """A family's part of the page: ``checks`` (name, row of the checks table), ``records``, ``tables``
    and ``curves`` (its figures, filled in by :mod:`oracles.report.build`)."""

    family: str
    checks: list[tuple[str, dict[str, Any]]]
    records: list[TestRecord]
    tables: list[RecordTable]
    curves: list[Curve] = field(default_factory=list)

    @property
    def failed(self) -> int:
        """How many of its checks failed (``ok`` False)."""
        return sum(1 for _, row in self.checks if row["ok"] is False)


def cell(value: Any) -> str | None:
    """A figure as a table cell: a number to 4 significant digits, a flag as yes/no, a short word; None
    for anything else (a list, a long text)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if value is None:
        return "-"
    if isinstance(value, str) and len(value) <= MAX_WORD and "\n" not in value:
        return value
    return None


def figures_of(data: dict[str, Any]) -> dict[str, str]:
    """A record's figures as cells by key (:func:`cell`), one level into an object (``figures.nmse``)."""
    out: dict[str, str] = {}
    for key, value in data.items():
        if key in SKIP or key.endswith("sha256"):
            continue
        if isinstance(value, dict):
            for sub, inner in value.items():
                shown = cell(inner) if not isinstance(inner, (dict, list)) else None
                if shown is not None:
                    out[f"{key}.{sub}"] = shown
        elif (shown := cell(value)) is not None:
            out[key] = shown
    return out


def record_table(check: str, records: Sequence[TestRecord]) -> RecordTable | None:
    """The table of one check's records (failed first, at most :data:`MAX_ROWS`); None when none of them
    attached a figure."""
    cells = [(rec, figures_of(rec.data)) for rec in records]
    columns: list[str] = []
    for _, found in cells:
        columns += [k for k in found if k not in columns]
    if not columns:
        return None
    columns = columns[:MAX_COLUMNS]
    rows = tuple((rec.record_id or rec.nodeid, rec.outcome, tuple(found.get(c, "") for c in columns))
                 for rec, found in cells[:MAX_ROWS])
    return RecordTable(check=check, columns=tuple(columns), rows=rows, left=max(0, len(cells) - MAX_ROWS))


def _order(rec: TestRecord) -> tuple[int, str]:
    """Failed records first, then those not run, then the rest, each by nodeid."""
    rank = 0 if rec.outcome in FAILING else (1 if rec.outcome == "not_run" else 2)
    return rank, rec.nodeid


def family_order(names: Sequence[str]) -> list[str]:
    """``names`` in the order of :data:`oracles.families.FAMILIES`, any other (``unit``) after them, by name."""
    from oracles.families import FAMILIES

    known = [f.name for f in FAMILIES]
    return sorted(set(names), key=lambda n: (known.index(n) if n in known else len(known), n))


def sections(loaded: Loaded) -> list[Section]:
    """Every family of the receipt's checks table, those with a failed check first, each part in
    :func:`family_order`; with its checks (failed first, then by name), records (:func:`_order`) and
    record tables."""
    checks = loaded.receipt.checks
    names = check_of(loaded)
    by_family: dict[str, list[TestRecord]] = {}
    for rec in sorted(loaded.records, key=_order):
        by_family.setdefault(rec.family, []).append(rec)
    families = family_order([str(row.get("family") or "unit") for row in checks.values()] + list(by_family))
    out = []
    for fam in families:
        rows = sorted(((n, row) for n, row in checks.items() if str(row.get("family") or "unit") == fam),
                      key=lambda item: (item[1]["ok"] is not False, item[0]))
        records = by_family.get(fam, [])
        per_check: dict[str, list[TestRecord]] = {}
        for rec in records:
            per_check.setdefault(names[rec.nodeid], []).append(rec)
        tables = [t for name, _ in rows if (t := record_table(name, per_check.get(name, []))) is not None]
        out.append(Section(family=fam, checks=rows, records=records, tables=tables))
    return sorted(out, key=lambda s: s.failed == 0)  # a family with a failed check first; stable otherwise
