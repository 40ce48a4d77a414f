"""What a report leads with: the receipt's verdict (its ``all_ok``, with the reasons it is not) and the
failed tests, each with its one-line message. Pure: reads a :class:`~oracles.report.load.Loaded`."""

from __future__ import annotations

from dataclasses import dataclass

from oracles.receipts.table import FAILING, TestRecord, check_name
from oracles.report.load import Loaded

#: The longest one-line message a failure is shown with before its full text (a test's summary holds
#: up to 4,000 characters: oracles/plugin/state.py).
LINE_CHARS = 240


@dataclass(frozen=True)
class Failure:
    """One failed test: ``family``, ``check`` (its row in the checks table), ``record`` (the parametrize
    id, or the nodeid when it has none), ``outcome`` (one of :data:`oracles.receipts.table.FAILING`, or
    ``not_run``), ``line`` (the first line of its message, at most :data:`LINE_CHARS`), ``detail`` (the
    whole message) and ``nodeid``."""

    family: str
    check: str
    record: str
    outcome: str
    line: str
    detail: str
    nodeid: str


@dataclass(frozen=True)
class Verdict:
    """``ok`` (the receipt's ``all_ok``), ``headline`` (``PASS``/``FAIL`` and the counts in one line) and
    ``reasons``: why it is not all ok, one line each (failed checks, tests not run, engines that ran no
    check, collection errors); empty when ok."""

    ok: bool
    headline: str
    reasons: tuple[str, ...]


def one_line(text: str | None, limit: int = LINE_CHARS) -> str:
    """The first non-empty line of ``text``, cut to ``limit`` characters (an ellipsis says so)."""
    first = next((ln.strip() for ln in (text or "").splitlines() if ln.strip()), "")
    return first if len(first) <= limit else first[: limit - 1] + "…"


def check_of(loaded: Loaded) -> dict[str, str]:
    """nodeid -> the name of its row in the receipt's checks table (:func:`oracles.receipts.table.check_name`)."""
    return {rec.nodeid: check_name(rec.nodeid, rec.check, loaded.receipt.checks) for rec in loaded.records}


def failures(loaded: Loaded) -> list[Failure]:
    """Every test that failed in any way (:data:`FAILING`), then every test not run, each once; failed
    ones by family, check and record (the order of the checks table), so the page and the Markdown
    list them the same way."""
    checks = check_of(loaded)

    def failure(rec: TestRecord) -> Failure:
        text = rec.summary or f"{rec.outcome} (no message recorded)"
        return Failure(family=rec.family, check=checks[rec.nodeid], record=rec.record_id or rec.nodeid,
                       outcome=rec.outcome, line=one_line(text), detail=text, nodeid=rec.nodeid)

    failed = sorted((failure(r) for r in loaded.records if r.outcome in FAILING),
                    key=lambda f: (f.family, f.check, f.record))
    not_run = [failure(r) for r in loaded.records if r.outcome == "not_run"]
    return failed + not_run


def verdict(loaded: Loaded) -> Verdict:
    """The receipt's verdict in one line and the reasons it is not all ok (:class:`Verdict`)."""
    r = loaded.receipt
    counts: dict[str, int] = {}
    for rec in loaded.records:
        counts[rec.outcome] = counts.get(rec.outcome, 0) + 1
    bad_checks = [name for name, row in r.checks.items() if row["ok"] is False]
    shown = ", ".join(f"{counts[k]} {k}" for k in sorted(counts, key=lambda k: (-counts[k], k)))
    word = "PASS" if r.all_ok else "FAIL"
    headline = (f"{word}: {len(r.checks) - len(bad_checks)} of {len(r.checks)} checks ok; "
                f"{len(loaded.records)} tests ({shown or 'none'}) in {r.seconds:.0f} s")
    reasons: list[str] = []
    if bad_checks:
        reasons.append(f"{len(bad_checks)} check{'s' if len(bad_checks) != 1 else ''} failed: "
                       + ", ".join(bad_checks[:8]) + (f" (+{len(bad_checks) - 8})" if len(bad_checks) > 8 else ""))
    if r.not_run:
        reasons.append(f"{len(r.not_run)} tests were not run (the run was cut short): not all ok")
    for row in r.ran_nothing:
        reasons.append(f"engine {row.get('engine')} ran no check: {row.get('tests')} tests on "
                       f"{', '.join(map(str, row.get('pins', [])))} skipped or not run")
    if r.collection_errors:
        reasons.append(f"{len(r.collection_errors)} collection errors: "
                       + "; ".join(one_line(str(e.get("nodeid"))) for e in r.collection_errors[:4]))
    if not r.all_ok and not reasons:
        reasons.append("no check passed" if not any(row["ok"] for row in r.checks.values()) else "not all ok")
    return Verdict(ok=r.all_ok, headline=headline, reasons=tuple(reasons))
