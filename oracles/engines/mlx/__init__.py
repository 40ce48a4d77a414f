"""The MLX engines: mlx-lm (:mod:`.lm`, with hybrid models in :mod:`.hybrid`, cohort decode in
:mod:`.cohort`, layer taps in :mod:`.taps`), mlx-vlm (:mod:`.vlm`) and mtplx on macOS (:mod:`.mtplx`). mlx
is imported when an engine is built, never at import."""

from __future__ import annotations

import importlib.util
import platform


def mlx_vlm_unavailable() -> str | None:
    """Why no mlx-vlm engine can run here (mlx or mlx_vlm not importable, with the install line), or None;
    the ``unavailable_reason`` of the mlx-vlm engines (:mod:`.vlm`, :mod:`.d1`, :mod:`.deepseek_v4`; :mod:`.mtp`
    asks mlx-audio too)."""
    if importlib.util.find_spec("mlx") is None or importlib.util.find_spec("mlx_vlm") is None:
        extra = "mlx[cpu]" if platform.system() == "Linux" else "mlx"
        return (f"mlx-vlm is not installed (pip install 'pytest-oracles[mlx-vlm]', which brings {extra}, then "
                f"pip install --no-deps mlx-vlm==0.7.10)")
    return None
