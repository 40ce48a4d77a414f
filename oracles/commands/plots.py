"""The one way the commands draw, as PNG bytes: :mod:`oracles.report.draw` (matplotlib's Agg backend,
imported when a plot is made), so a command writes its PNG exclusively, like its JSON.

Where matplotlib cannot be imported a command writes everything but its PNG, says so in one line
(:func:`unavailable`), and exits as its result decides: a PNG is a view of the JSON, never the verdict.
"""

from __future__ import annotations

from oracles.report.draw import INSTALL, PlotsUnavailable, png_bytes, pyplot, unavailable

__all__ = ["INSTALL", "PlotsUnavailable", "png_bytes", "pyplot", "unavailable"]
