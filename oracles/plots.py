"""The one way the commands draw: matplotlib's non-interactive Agg backend, figures returned as PNG
bytes (so a command writes them exclusively, like its JSON). matplotlib is imported when a plot is made."""

from __future__ import annotations

import io
from typing import Any


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend (no display is needed or touched)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_bytes(fig: Any, dpi: int = 110) -> bytes:
    """``fig`` rendered as PNG bytes, then closed (pyplot keeps every open figure otherwise)."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    pyplot().close(fig)
    return buf.getvalue()
