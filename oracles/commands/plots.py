"""The one way the commands draw: matplotlib's non-interactive Agg backend, figures returned as PNG
bytes (so a command writes them exclusively, like its JSON). matplotlib is imported when a plot is made.

matplotlib comes with the ``plots`` extra (and the ``torch`` and ``dev`` extras, which bring the
commands that draw). Where it cannot be imported a command writes everything but its PNG, says so in
one line (:func:`unavailable`), and exits as its result decides: a PNG is a view of the JSON, never
the verdict.
"""

from __future__ import annotations

import io
from typing import Any

from oracles.errors import OracleError

#: How to get matplotlib: the extra that brings it alone.
INSTALL = "pip install 'pytest-oracles[plots]'"


class PlotsUnavailable(OracleError):
    """matplotlib cannot be imported here; the message is the one line a command prints instead of a PNG."""


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display is needed or touched).

    Raises:
        PlotsUnavailable: matplotlib is not installed, or fails to import (its error's first line).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        if exc.name == "matplotlib":
            raise PlotsUnavailable(f"PNG not written: matplotlib is not installed ({INSTALL})") from None
        first = (str(exc).strip().splitlines() or [""])[0]
        raise PlotsUnavailable(f"PNG not written: matplotlib cannot be imported: {type(exc).__name__}: {first} "
                               f"({INSTALL})") from None
    return plt


def unavailable() -> str | None:
    """None when plots can be drawn here (matplotlib imported), else the one line a command prints
    instead of writing its PNG (what is missing and the pip command that brings it)."""
    try:
        pyplot()
    except PlotsUnavailable as exc:
        return str(exc)
    return None


def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    """``fig`` rendered as PNG bytes, then closed (pyplot keeps every open figure otherwise)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    return buf.getvalue()
