"""The one way this package draws: matplotlib's non-interactive Agg backend, a figure returned as PNG
bytes (a command writes them exclusively) or as SVG text (the report's page holds it inline).
matplotlib is imported when a figure is made.

matplotlib comes with the ``plots`` extra (and the ``torch`` and ``dev`` extras, which bring the
commands that draw). Where it cannot be imported a command writes everything but its figures and says
so in one line (:func:`unavailable`): a figure is a view of the JSON, never the verdict.
"""

from __future__ import annotations

import io
from typing import Any

from oracles.errors import OracleError

#: How to get matplotlib: the extra that brings it alone.
INSTALL = "pip install 'pytest-oracles[plots]'"


class PlotsUnavailable(OracleError):
    """matplotlib cannot be imported here; the message is the one line a command prints instead of a figure."""


def pyplot(missing: str = "PNG not written") -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display is needed or touched).

    Args:
        missing: what the caller does without it, the message's first words.

    Raises:
        PlotsUnavailable: matplotlib is not installed, or fails to import (its error's first line).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        if exc.name == "matplotlib":
            raise PlotsUnavailable(f"{missing}: matplotlib is not installed ({INSTALL})") from None
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PlotsUnavailable(f"{missing}: matplotlib cannot be imported: {type(exc).__name__}: {first} "
                               f"({INSTALL})") from None
    return plt


def unavailable(missing: str = "PNG not written") -> str | None:
    """None when figures can be drawn here (matplotlib imported), else the one line a command prints
    instead (``missing``, what is missing and the pip command that brings it)."""
    try:
        pyplot(missing)
    except PlotsUnavailable as exc:
        return str(exc)
    return None


def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    """``fig`` rendered as PNG bytes, then closed (pyplot keeps every open figure otherwise)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    return buf.getvalue()


def svg_text(fig: Any, salt: str) -> str:
    """``fig`` as one ``<svg>`` element (no XML declaration or doctype: it sits inside an HTML page), then
    closed. Text stays text (``svg.fonttype`` ``none``: the page's font draws it, a third of the bytes
    of glyph paths); ``salt`` seeds the element ids matplotlib writes (clip paths), so figures of one
    page never share an id and the same figure is the same text on every run (no date either)."""
    from matplotlib import rc_context

    buf = io.StringIO()
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", metadata={"Date": None})
    pyplot().close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):].strip()
