"""What a report's figure is, before anything draws it: a :class:`Curve` (lines over positions, steps,
stages, layers, rounds or chunks, with limits), built from a receipt's data by
:mod:`oracles.report.series` and :mod:`oracles.report.positions`, drawn by :mod:`oracles.report.figures`.
Pure: no numpy, no matplotlib."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Sequence

#: At most this many lines in one figure (the failed records' first): a figure of more is unreadable,
#: and the records' figures are in the tables beside it.
MAX_LINES = 8
#: On a log scale a zero (bit-equal) is drawn here when the figure holds no positive value to place it
#: under (:func:`oracles.report.figures.floor_of`): below any float32 difference of two logits or its square.
LOG_FLOOR = 1e-18


@dataclass(frozen=True)
class Line:
    """One line of a figure: ``label``; ``y`` (None: no value there, a gap); ``x`` (None: 0, 1, ...);
    ``dashed`` (a budget or band drawn beside the figures it bounds); ``mark``: the index of a point
    drawn red (a stage a bisect named)."""

    label: str
    y: tuple[float | None, ...]
    x: tuple[float, ...] | None = None
    dashed: bool = False
    mark: int | None = None


@dataclass(frozen=True)
class Curve:
    """One figure: ``key`` (unique on the page: its anchor and the seed of its SVG ids), ``family`` (the
    section it sits in), ``title``, axis labels, ``lines``; ``log`` (a log y axis, values at or below 0
    drawn at the axis' foot: :func:`oracles.report.figures.floor_of`); ``ticks`` (names of the x
    positions 0, 1, ...: stages); ``limits`` (horizontal lines ``(y, label)``: a threshold, float16's
    largest value); ``note``: where its data comes from (the check and the field) and what it leaves out."""

    key: str
    family: str
    title: str
    xlabel: str
    ylabel: str
    lines: tuple[Line, ...]
    log: bool = False
    ticks: tuple[str, ...] = ()
    limits: tuple[tuple[float, str], ...] = ()
    note: str = ""


def slug(*parts: Any) -> str:
    """An HTML id from ``parts``: letters, digits and ``-`` only (a record id may hold anything)."""
    text = "-".join(str(p) for p in parts)
    return re.sub(r"[^A-Za-z0-9]+", "-", text).strip("-").lower() or "x"


def number(value: Any) -> float | None:
    """``value`` as a finite float, or None (not a number, a bool, NaN or infinite: nothing to draw)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    f = float(value)
    return f if math.isfinite(f) else None


def numbers(values: Any) -> tuple[float | None, ...] | None:
    """A JSON list as :func:`number` of each item, or None when it is not a list or holds no number."""
    if not isinstance(values, list):
        return None
    out = tuple(number(v) for v in values)
    return out if any(v is not None for v in out) else None


def capped(lines: Sequence[Line], what: str) -> tuple[tuple[Line, ...], str]:
    """At most :data:`MAX_LINES` of ``lines`` (in the order given: failed records first), and a note
    saying how many of ``what`` were left out ("" when none)."""
    kept = tuple(lines[:MAX_LINES])
    left = len(lines) - len(kept)
    return kept, (f" {left} more {what} are in the records' tables, not drawn." if left else "")
