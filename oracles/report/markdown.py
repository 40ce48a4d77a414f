"""The report as a Markdown summary short enough for a pull request: the verdict, the failed tests with
their one-line messages (at most :data:`MAX_FAILURES`), a line per family, the pins and engines, and the
translations the ports needed. Receipt strings are put in code spans (or escaped), so a record id
holding ``|``, ``<`` or a backtick breaks no table and makes no markup."""

from __future__ import annotations

import re

from oracles.report.build import Report

#: Failures listed one by one; the rest are counted (the page lists them all).
MAX_FAILURES = 15


def code(text: object) -> str:
    """``text`` as an inline code span that holds any characters: fenced by one more backtick than its
    longest run of them, padded when it starts or ends with one; ``|`` escaped for tables; one line."""
    s = " ".join(str(text).split()).replace("|", "\\|")
    longest = max((len(m) for m in re.findall(r"`+", s)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if s.startswith("`") or s.endswith("`") or not s else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def plain(text: object) -> str:
    """``text`` as Markdown text on one line: the characters that make emphasis, code, links, tables and
    strike-through escaped, ``<``, ``>`` and ``&`` as entities."""
    s = " ".join(str(text).split())
    s = s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    return re.sub(r"([\\`*_\[\]|~])", r"\\\1", s)


def render(report: Report, html_name: str | None = None) -> str:
    """The summary (UTF-8 text ending in a newline); ``html_name``: the page written beside it, named last."""
    v, r = report.verdict, report.loaded.receipt
    lines = [f"## oracles report: {'PASS' if v.ok else 'FAIL'}", "", plain(v.headline), ""]
    lines += [f"- {plain(x)}" for x in v.reasons]
    if v.reasons:
        lines.append("")
    if report.failures:
        lines += [f"### Failures ({len(report.failures)})", "", "| outcome | check | record | message |", "|---|---|---|---|"]
        lines += [f"| {f.outcome} | {code(f.check)} | {code(f.record)} | {code(f.line)} |"
                  for f in report.failures[:MAX_FAILURES]]
        if len(report.failures) > MAX_FAILURES:
            lines.append(f"| | | | {len(report.failures) - MAX_FAILURES} more in the page |")
        lines.append("")
    lines += ["| family | checks | failed | tests |", "|---|---|---|---|"]
    lines += [f"| {code(s.family)} | {len(s.checks)} | {s.failed} | {len(s.records)} |" for s in report.sections if s.checks]
    engines = sorted({f"{e.get('name')} on {e.get('pin')}" for e in r.engines})
    lines += ["", f"Pins: {', '.join(code(p) for p in sorted({str(p.get('name')) for p in r.pins})) or 'none'}.",
              f"Engines: {', '.join(code(e) for e in engines) or 'none'}."]
    if report.translations:
        lines.append("Translations the ports needed: " + "; ".join(code(t) for t in report.translations) + ".")
    versions = r.environment.get("versions")
    if isinstance(versions, dict):
        lines.append("Versions: " + ", ".join(f"{plain(k)} {plain(val)}" for k, val in versions.items()) + ".")
    lines += ["", f"Receipt {code(report.loaded.path.name)}, run {code(r.run_id)}, {r.seconds:.0f} s"
              + (f"; the whole report: {code(html_name)}." if html_name else ".")]
    return "\n".join(lines) + "\n"
