"""The report's HTML page, in the order a conversion engineer reads it: the verdict and why, the failed
tests with their one-line messages, a section per family (its checks, figures and records' figures),
then the run, the pins and engines with their versions and translations, and the environment.
Every receipt string is escaped (:func:`oracles.report.html.esc`)."""

from __future__ import annotations

import json
from typing import Any

from oracles.report.build import Report
from oracles.report.curves import Curve, slug
from oracles.report.html import details, esc, page, table
from oracles.report.sections import RecordTable, Section
from oracles.report.verdict import Failure

#: At most this many failures are listed one by one (a run where everything failed lists these and a count).
MAX_FAILURES = 200
#: A family of more checks shows those not ok, its whole table folded (the unit tests' family has hundreds).
MAX_SHOWN_CHECKS = 12


def family_id(family: str) -> str:
    """The section's element id: ``family-<name>``."""
    return f"family-{slug(family)}"


def _verdict(report: Report) -> str:
    v, r = report.verdict, report.loaded.receipt
    found = r.environment.get("git")
    git: dict[str, Any] = found if isinstance(found, dict) else {}
    meta = (f"receipt {report.loaded.path} · run {r.run_id} · started {r.started} · finished {r.finished} · "
            f"pytest exit {r.exitstatus}" + (f" · git {git.get('commit')}{' (dirty)' if git.get('dirty') else ''}"
                                             if git.get("commit") else ""))
    items = "".join(f"<li>{esc(x)}</li>" for x in v.reasons)
    reasons = f'<ul class="reasons">{items}</ul>' if items else ""
    return (f'<header id="verdict" class="verdict {"pass" if v.ok else "fail"}" data-ok="{str(v.ok).lower()}">'
            f'<h1>{"PASS" if v.ok else "FAIL"}</h1><p class="headline">{esc(v.headline)}</p>'
            f'{reasons}<p class="meta">{esc(meta)}</p></header>')


def _failure(f: Failure) -> str:
    body = f"<pre>{esc(f.detail)}</pre><p class=\"note\">{esc(f.nodeid)}</p>"
    return (f'<li class="failure" data-check="{esc(f.check)}" data-family="{esc(f.family)}" data-outcome="{esc(f.outcome)}">'
            f'<span class="outcome">{esc(f.outcome)}</span> <a class="check" href="#{family_id(f.family)}">{esc(f.check)}</a>'
            f' <span class="record">[{esc(f.record)}]</span> <span class="badge">{esc(f.family)}</span>'
            f'<p class="message">{esc(f.line)}</p>{details("the whole message", body)}</li>')


def _failures(report: Report) -> str:
    found = report.failures
    if not found:
        return '<section id="failures"><h2>Failures</h2><p>No test failed.</p></section>'
    items = "".join(_failure(f) for f in found[:MAX_FAILURES])
    more = f'<p class="note">{len(found) - MAX_FAILURES} more are in the receipt.</p>' if len(found) > MAX_FAILURES else ""
    return f'<section id="failures"><h2>Failures ({len(found)})</h2><ol class="failures">{items}</ol>{more}</section>'


def _contents(report: Report) -> str:
    links = [f'<a href="#{family_id(s.family)}">{esc(s.family)}{f" ({s.failed} failed)" if s.failed else ""}</a>'
             for s in report.sections]
    links += ['<a href="#run">run</a>', '<a href="#pins-engines">pins and engines</a>', '<a href="#environment">environment</a>']
    return f'<nav id="contents">{"".join(links)}</nav>'


def _ok(value: Any) -> str:
    word, cls = {True: ("yes", "ok-yes"), False: ("NO", "ok-no"), None: ("-", "ok-none")}[value]
    return f'<span class="{cls}">{word}</span>'


def _check_rows(checks: list[tuple[str, dict[str, Any]]]) -> str:
    rows, classes = [], []
    for name, row in checks:
        failed = row["failed"]
        shown = ", ".join(failed[:6]) + (f" (+{len(failed) - 6})" if len(failed) > 6 else "")
        rows.append([f"<code>{esc(name)}</code>", _ok(row["ok"]), *(esc(row.get(k, 0)) for k in
                     ("passed", "xfailed", "skipped", "not_run")), esc(shown)])
        classes.append({False: "bad", None: "none"}.get(row["ok"], ""))
    return table(("check", "ok", "passed", "xfailed", "skipped", "not run", "failed records"), rows, classes=classes,
                 numeric=(2, 3, 4, 5), raw=True)


def _checks(section: Section) -> str:
    """The family's rows of the checks table; of a family of more than :data:`MAX_SHOWN_CHECKS` checks, those
    not ok are shown and the whole table folds out."""
    if len(section.checks) <= MAX_SHOWN_CHECKS:
        return _check_rows(section.checks) if section.checks else ""
    not_ok = [(name, row) for name, row in section.checks if row["ok"] is not True]
    shown = _check_rows(not_ok) if not_ok else ""
    return shown + details(f"all {len(section.checks)} checks ({len(section.checks) - len(not_ok)} ok)",
                           _check_rows(section.checks))


def _figure(report: Report, curve: Curve) -> str:
    if not curve.lines:
        drawn = ""
    else:
        drawn = report.svgs.get(curve.key, '<p class="note">(not drawn: see the notes at the end of the page)</p>')
    return (f'<figure id="fig-{esc(curve.key)}"><figcaption>{esc(curve.title)}</figcaption>{drawn}'
            f'<p class="note">{esc(curve.note)}</p></figure>')


def _records(t: RecordTable) -> str:
    classes = ["bad" if outcome in ("failed", "error", "crashed", "timeout", "xpassed") else "" for _, outcome, _ in t.rows]
    body = table(("record", "outcome", *t.columns), ([rec, outcome, *cells] for rec, outcome, cells in t.rows),
                 classes=classes)
    more = f'<p class="note">{t.left} more records are in the receipt.</p>' if t.left else ""
    return details(f"{t.check}: {len(t.rows) + t.left} records", body + more, open_=any(classes))


def _section(report: Report, s: Section) -> str:
    head = (f'<section id="{family_id(s.family)}" class="family" data-family="{esc(s.family)}"><h2>{esc(s.family)} '
            f'<span class="badge">{len(s.checks)} checks, {s.failed} failed, {len(s.records)} tests</span></h2>')
    figures = "".join(_figure(report, c) for c in s.curves)
    records = "".join(_records(t) for t in s.tables)
    return (head + _checks(s) + (f'<h3>Figures</h3><div class="figures">{figures}</div>' if figures else "")
            + (f"<h3>Records' figures</h3>{records}" if records else "") + "</section>")


def _listing(title: str, rows: list[dict[str, Any]], keys: tuple[str, ...]) -> str:
    if not rows:
        return ""
    return f"<h3>{esc(title)} ({len(rows)})</h3>" + table(keys, ([str(r.get(k, "")) for k in keys] for r in rows))


def _run(report: Report) -> str:
    r = report.loaded.receipt
    args = " ".join(str(a) for a in r.invocation.get("args", []))
    parts = [f"<p>pytest <code>{esc(args)}</code></p>", _listing("not run", r.not_run, ("nodeid", "reason")),
             _listing("pairs left out of the parametrization", r.left_out, ("engine", "pin", "reason")),
             _listing("collection errors", r.collection_errors, ("nodeid", "summary"))]
    for row in r.ran_nothing:
        parts.append(f"<p>engine <code>{esc(row.get('engine'))}</code> ran no check: {esc(row.get('tests'))} tests on "
                     f"{esc(', '.join(map(str, row.get('pins', []))))}</p>")
    if r.port_scope:
        parts.append(details("port scope (--port-records)", f"<pre>{esc(json.dumps(r.port_scope, indent=1))}</pre>"))
    if r.resumed_from:
        parts.append(f"<p>resumed from <code>{esc(r.resumed_from)}</code>; {len(r.resume_not_carried)} not carried</p>")
    return f'<section id="run"><h2>Run</h2>{"".join(parts)}</section>'


def _pins_engines(report: Report) -> str:
    r = report.loaded.receipt
    pins = {str(p.get("name")): p for p in r.pins}
    pin_rows = [[n, str(p.get("source", "")), str(p.get("digest", ""))[:16], str(p.get("bytes", "")), str(p.get("override", ""))]
                for n, p in sorted(pins.items())]
    engines: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in r.engines:
        engines.setdefault((str(e.get("name")), str(e.get("pin"))), []).append(e)
    engine_rows, described = [], []
    for (name, pin), loads in sorted(engines.items()):
        first = loads[0]
        versions = ", ".join(f"{k} {v}" for k, v in first.items() if isinstance(v, str) and k not in
                             ("name", "pin", "worker", "class", "engine", "file", "sha256") and v[:1].isdigit())
        seconds = sum(float(s) for e in loads for s in e.get("seconds", []))
        engine_rows.append([name, pin, str(sum(int(e.get("load_count", 0)) for e in loads)), f"{seconds:.1f}",
                            str(first.get("class", "")), str(first.get("dtype", "")), versions])
        extra = {k: v for k, v in first.items() if k not in ("seconds", "worker", "at", "load_count")}
        described.append(details(f"{name} on {pin}: describe()", f"<pre>{esc(json.dumps(extra, indent=1))}</pre>"))
    notes = "".join(f"<li>{esc(t)} <span class=\"badge\">({esc('; '.join(who))})</span></li>"
                    for t, who in report.translations.items())
    return ('<section id="pins-engines"><h2>Pins and engines</h2>'
            + table(("pin", "source", "digest", "bytes", "--snapshot"), pin_rows, numeric=(3,))
            + table(("engine", "pin", "loads", "load s", "class", "dtype", "versions"), engine_rows, numeric=(2, 3))
            + "".join(described)
            + (f"<h3>Translations the ports needed</h3><ul>{notes}</ul>" if notes else "<p>No port needed a translation.</p>")
            + "</section>")


def _environment(report: Report) -> str:
    env = report.loaded.receipt.environment
    blocks = []
    for key, value in env.items():
        if isinstance(value, dict):
            blocks.append(f"<h3>{esc(key)}</h3>" + table(("name", "value"), ([str(k), str(v)] for k, v in value.items())))
        else:
            blocks.append(f"<p>{esc(key)}: <code>{esc(value)}</code></p>")
    return f'<section id="environment"><h2>Environment</h2>{"".join(blocks)}</section>'


def render(report: Report) -> str:
    """The page of ``report`` as one HTML document (UTF-8 text)."""
    notes = "".join(f"<li>{esc(n)}</li>" for n in report.notes)
    body = (_verdict(report) + "<main>" + _failures(report) + _contents(report)
            + "".join(_section(report, s) for s in report.sections) + _run(report) + _pins_engines(report)
            + _environment(report) + (f'<section id="notes"><h2>Notes</h2><ul>{notes}</ul></section>' if notes else "")
            + f'<p class="note">oracles report of receipt schema {report.loaded.receipt.schema_version}</p></main>')
    title = f"{'PASS' if report.verdict.ok else 'FAIL'}: {report.loaded.path.name}"
    return page(title, body)
