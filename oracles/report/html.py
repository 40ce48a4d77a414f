"""HTML pieces of the report's page: escaping (every receipt string goes through :func:`esc`: a record id
or message holding ``<`` or ``&`` is text, never markup), tables, the page's frame and its style.

The page is self-contained: its Content-Security-Policy lets it load nothing (no script, no font, no
image but ``data:``), so what it shows is what the file holds, offline and forever.
"""

from __future__ import annotations

import html
from typing import Iterable, Sequence

#: Nothing from outside: no script, connection, font or frame; style and pictures only from the file.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"

STYLE = """
:root { --fail: #b3261e; --pass: #1b6e2b; --muted: #5f6368; --line: #dadce0; --bg: #f8f9fa; }
* { box-sizing: border-box; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; margin: 0; color: #202124; }
main { max-width: 1180px; margin: 0 auto; padding: 0 20px 40px; }
h1 { margin: 0; font-size: 28px; } h2 { margin: 28px 0 8px; font-size: 20px; } h3 { font-size: 15px; margin: 18px 0 6px; }
.verdict { padding: 18px 20px; color: #fff; }
.verdict.fail { background: var(--fail); } .verdict.pass { background: var(--pass); }
.verdict .headline { font-size: 16px; margin: 4px 0; } .verdict ul { margin: 6px 0 0; padding-left: 20px; }
.verdict .meta { font-size: 12px; opacity: .9; margin: 8px 0 0; word-break: break-all; }
ol.failures { padding-left: 24px; } li.failure { margin: 8px 0; }
.outcome { display: inline-block; font-size: 11px; font-weight: 600; text-transform: uppercase; padding: 1px 6px;
  border-radius: 3px; background: var(--fail); color: #fff; }
.record, code { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px; }
.message { margin: 2px 0; color: #3c4043; font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 12.5px;
  white-space: pre-wrap; word-break: break-word; }
pre { background: var(--bg); border: 1px solid var(--line); padding: 8px; overflow-x: auto; font-size: 12px;
  white-space: pre-wrap; word-break: break-word; }
nav { border-bottom: 1px solid var(--line); padding: 10px 0; font-size: 13px; }
nav a { margin-right: 14px; white-space: nowrap; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 12.5px; }
th, td { border: 1px solid var(--line); padding: 3px 7px; text-align: left; vertical-align: top; max-width: 520px;
  overflow-wrap: anywhere; }
th { background: var(--bg); font-weight: 600; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.bad td { background: #fce8e6; } tr.none td { color: var(--muted); }
.ok-yes { color: var(--pass); font-weight: 600; } .ok-no { color: var(--fail); font-weight: 600; }
.ok-none { color: var(--muted); }
section.family { border-top: 2px solid var(--line); }
.figures { display: grid; grid-template-columns: repeat(auto-fill, minmax(540px, 1fr)); gap: 4px 18px; }
figure { margin: 10px 0 14px; } figcaption { font-weight: 600; font-size: 13px; }
figure svg { max-width: 100%; height: auto; display: block; }
.note { color: var(--muted); font-size: 12px; margin: 2px 0; }
details > summary { cursor: pointer; margin: 4px 0; }
.badge { font-size: 12px; color: var(--muted); font-weight: normal; }
"""


NUM = ' class="num"'


def esc(value: object) -> str:
    """``value`` as HTML text (``<``, ``>``, ``&`` and both quotes escaped: safe in text and attributes)."""
    return html.escape(str(value), quote=True)


def table(head: Sequence[str], rows: Iterable[Sequence[str]], *, classes: Sequence[str] = (), numeric: Sequence[int] = (),
          raw: bool = False) -> str:
    """A ``<table>``: ``head`` and each row's cells escaped (``raw``: the cells are HTML already, made
    by this module); ``classes`` a class per row (``bad``, ``none``); ``numeric`` the columns set right."""
    cls = list(classes)
    out = ["<table><thead><tr>", *(f"<th>{esc(h)}</th>" for h in head), "</tr></thead><tbody>"]
    for i, row in enumerate(rows):
        attr = f' class="{esc(cls[i])}"' if i < len(cls) and cls[i] else ""
        cells = "".join(f"<td{NUM if j in numeric else ''}>{c if raw else esc(c)}</td>" for j, c in enumerate(row))
        out.append(f"<tr{attr}>{cells}</tr>")
    out.append("</tbody></table>")
    return "".join(out)


def details(summary: str, body: str, *, open_: bool = False) -> str:
    """A ``<details>``: ``summary`` escaped, ``body`` HTML made by this package."""
    return f"<details{' open' if open_ else ''}><summary>{esc(summary)}</summary>{body}</details>"


def page(title: str, body: str) -> str:
    """The whole document: doctype, UTF-8, the CSP, the style, ``title`` escaped, ``body`` as given."""
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            f'<meta http-equiv="Content-Security-Policy" content="{esc(CSP)}">'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{esc(title)}</title><style>{STYLE}</style></head>\n<body>{body}</body></html>\n")
