"""Drawing a :class:`~oracles.report.curves.Curve` as inline SVG (:func:`oracles.report.draw.svg_text`):
one axis, a line per :class:`~oracles.report.curves.Line` (dashed ones grey-toned beside the figures they
bound), a point marked red where a line names one, horizontal limits, a log scale with zeros drawn a
decade under the figure's smallest positive value (:func:`floor_of`), and said so in the axes' corner.
matplotlib is imported when a figure is drawn."""

from __future__ import annotations

from typing import Any

from oracles.report.curves import LOG_FLOOR, Curve, Line

#: Inches: wide enough for a decoder's stages named under the axis, short enough for a page of them.
WIDTH, HEIGHT = 7.5, 3.4


def _text(label: str) -> str:
    """``label`` as matplotlib draws it literally: a ``$`` would start its math text (a record id may hold one)."""
    return label.replace("$", r"\$")


def floor_of(curve: Curve) -> float:
    """Where a log axis draws a value at or below 0: a decade under the smallest positive value the figure
    holds (its lines and limits), so a bit-equal stage or row sits at the axis' foot and the rest keeps
    its scale; :data:`LOG_FLOOR` when it holds none."""
    positive = [v for line in curve.lines for v in line.y if v is not None and v > 0]
    positive += [y for y, _ in curve.limits if y > 0]
    return min(positive) / 10 if positive else LOG_FLOOR


def _points(line: Line, floor: float | None) -> tuple[list[float], list[float]]:
    """x and y of a line, a gap (NaN) where a value is missing, values at or below 0 at ``floor`` (a log axis)."""
    xs = list(line.x) if line.x is not None else [float(i) for i in range(len(line.y))]
    ys = [float("nan") if v is None else (max(v, floor) if floor is not None else v) for v in line.y]
    return xs, ys


def _draw_line(ax: Any, line: Line, floor: float | None) -> None:
    xs, ys = _points(line, floor)
    style = {"linestyle": "--", "linewidth": 1.0} if line.dashed else {"marker": "o", "markersize": 3, "linewidth": 1.2}
    ax.plot(xs, ys, label=_text(line.label), **style)
    if line.mark is not None and 0 <= line.mark < len(xs):
        ax.plot([xs[line.mark]], [ys[line.mark]], "o", color="red", markersize=7, zorder=5)
        ax.axvline(xs[line.mark], color="red", alpha=0.35, linewidth=1)


def svg(curve: Curve) -> str:
    """``curve`` drawn as one ``<svg>`` element (its ids seeded by ``curve.key``).

    Raises:
        PlotsUnavailable: matplotlib cannot be imported (:func:`oracles.report.draw.pyplot`).
    """
    from oracles.report.draw import pyplot, svg_text

    plt = pyplot("figures not drawn")
    fig, ax = plt.subplots(figsize=(WIDTH, HEIGHT))
    floor = floor_of(curve) if curve.log else None
    for line in curve.lines:
        _draw_line(ax, line, floor)
    if floor is not None and any(v is not None and v <= 0 for line in curve.lines for v in line.y):
        ax.text(0.01, 0.01, f"0 drawn at {floor:.0e}", transform=ax.transAxes, fontsize=6, color="grey")
    for y, label in curve.limits:
        ax.axhline(y, color="black", linestyle=":", linewidth=1, label=_text(label))
    if curve.log:
        ax.set_yscale("log")
    if curve.ticks:
        ax.set_xticks(range(len(curve.ticks)), [_text(t) for t in curve.ticks],
                      rotation=90 if len(curve.ticks) > 12 else 0, fontsize=7)
    ax.set_xlabel(_text(curve.xlabel), fontsize=8)
    ax.set_ylabel(_text(curve.ylabel), fontsize=8)
    ax.tick_params(labelsize=7)
    ax.grid(True, alpha=0.25)
    ax.legend(fontsize=6.5, loc="best", framealpha=0.8)
    rotated = len(curve.ticks) > 12
    # Fixed margins, in inches: the y tick labels on the left, tick labels and the axis label below (stage names
    # turned upright need more). tight_layout would measure them instead, at more than half a figure's time.
    fig.subplots_adjust(left=0.8 / WIDTH, right=1 - 0.15 / WIDTH, top=1 - 0.12 / HEIGHT,
                        bottom=(1.0 if rotated else 0.55) / HEIGHT)
    return svg_text(fig, curve.key)
