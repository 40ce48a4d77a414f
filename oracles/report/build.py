"""A receipt's report, gathered once for the page and the Markdown: the verdict, the failures, a section
per family with its figures drawn, the pins and engines with the translations the ports needed."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from oracles.report.load import Loaded, read
from oracles.report.sections import Section, sections
from oracles.report.verdict import Failure, Verdict, failures, verdict


@dataclass
class Report:
    """Everything the page shows: ``loaded`` (the receipt), ``verdict``, ``failures`` (failed tests, then
    those not run), ``sections`` (one per family, each with its curves), ``svgs`` (curve key -> its
    ``<svg>``), ``translations`` (translation -> the engines and pins whose records name it) and
    ``notes`` (what the page could not show, one line each: no matplotlib, units left unpaired)."""

    loaded: Loaded
    verdict: Verdict
    failures: list[Failure]
    sections: list[Section]
    svgs: dict[str, str] = field(default_factory=dict)
    translations: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def translations(loaded: Loaded) -> dict[str, list[str]]:
    """Each translation a port needed to load (a record's ``translations``: the port's
    ``translation_notes()``), with the engines and pins whose records name it, sorted."""
    out: dict[str, set[str]] = {}
    for rec in loaded.records:
        found = rec.data.get("translations")
        if not isinstance(found, list):
            continue
        engine = rec.data.get("port") or rec.data.get("engine")
        pin = rec.data.get("port_pin") or rec.data.get("pin")
        who = f"{engine} on {pin}" if engine and pin else (str(engine) if engine else f"{rec.check} [{rec.record_id}]")
        for text in found:
            out.setdefault(str(text), set()).add(who)
    return {text: sorted(who) for text, who in sorted(out.items())}


def _add_curves(report: Report, with_arrays: bool) -> None:
    """Each section's curves: the JSON's (:mod:`oracles.report.series`), then the units' per-position
    ones (:mod:`oracles.report.positions`) when ``with_arrays``."""
    from oracles.report.series import curves

    by_family = {s.family: s for s in report.sections}
    for section in report.sections:
        section.curves += curves(section.family, section.records)
    if not with_arrays:
        return
    from oracles.report.positions import position_curves

    found, notes = position_curves(report.loaded, {r.nodeid: r for r in report.loaded.records})
    report.notes += notes
    for curve in found:
        home = by_family.get(curve.family)
        if home is None:
            home = by_family[curve.family] = Section(family=curve.family, checks=[], records=[], tables=[])
            report.sections.append(home)
        home.curves.append(curve)


def _draw(report: Report) -> None:
    """Every curve as SVG; where matplotlib cannot be imported, none, and one note saying so."""
    from oracles.report.draw import PlotsUnavailable
    from oracles.report.figures import svg

    try:
        for section in report.sections:
            for curve in section.curves:
                if curve.lines:  # a figure with nothing to draw is its note alone
                    report.svgs[curve.key] = svg(curve)
    except PlotsUnavailable as exc:
        report.svgs.clear()
        report.notes.append(str(exc))


def build(path: Path, *, draw: bool = True, with_arrays: bool = True) -> Report:
    """The report of the receipt at ``path``.

    Args:
        draw: draw the figures (matplotlib); False leaves ``svgs`` empty (the Markdown needs none).
        with_arrays: read the npz sidecar for the per-position figures.

    Raises:
        FixtureError: the receipt cannot be read (:func:`oracles.report.load.read`). A unit or sidecar
            that cannot be read is a note (``notes``), not an error: the page shows the rest.
    """
    loaded = read(path)
    report = Report(loaded=loaded, verdict=verdict(loaded), failures=failures(loaded), sections=sections(loaded),
                    translations=translations(loaded))
    _add_curves(report, with_arrays and draw)
    if draw:
        _draw(report)
    return report
