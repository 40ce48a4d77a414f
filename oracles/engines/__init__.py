"""Engine registry: built-in adapters plus any a user plugs in through the entry-point group
``oracles.engines`` (``name = "package.module:Class"``). The class is built as
``Class(root: Path, pin: str, threads: int)`` and must follow :class:`oracles.engines.base.Engine`.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import platform
from typing import Any

from oracles.errors import OracleError

BUILTIN: dict[str, str] = {
    "torch": "oracles.engines.torch_ref:TorchReference",
    "mlx": "oracles.engines.mlx_port:MlxPort",
    "mlx-vlm": "oracles.engines.mlx_vlm_port:MlxVlmPort",
    "mtplx": "oracles.engines.mtplx_port:MtplxPort",
}


def registry() -> dict[str, str]:
    """Engine id -> "module:Class", built-ins first, entry points may add (not replace) ids."""
    out = dict(BUILTIN)
    for ep in importlib.metadata.entry_points(group="oracles.engines"):
        out.setdefault(ep.name, ep.value)
    return out


def unavailable_reason(engine_id: str) -> str | None:
    """Why ``engine_id`` cannot run here (None when it can), found without importing it."""
    table = registry()
    if engine_id not in table:
        return f"unknown engine {engine_id!r}; known: {', '.join(sorted(table))}"
    module = table[engine_id].split(":")[0]
    if engine_id == "mlx" and importlib.util.find_spec("mlx_lm") is None:
        return "mlx-lm is not installed (pip install 'pytest-oracles[mlx]')"
    if engine_id == "mlx-vlm" and importlib.util.find_spec("mlx_vlm") is None:
        return "mlx-vlm is not installed (make setup; or pip install 'pytest-oracles[mlx-vlm]' && pip install --no-deps mlx-vlm==0.7.10)"
    if engine_id == "mtplx":
        if not (platform.system() == "Darwin" and platform.machine() == "arm64"):
            return f"mtplx imports only on macOS arm64, this is {platform.system()} {platform.machine()}"
        if importlib.util.find_spec("mtplx") is None:
            return "mtplx is not installed"
    if engine_id == "torch" and importlib.util.find_spec("transformers") is None:
        return "transformers is not installed (pip install 'pytest-oracles[torch]')"
    try:
        if importlib.util.find_spec(module) is None:
            return f"module {module} is not importable"
    except ModuleNotFoundError as exc:
        return f"module {module} is not importable: {exc}"
    return None


def engine_class(engine_id: str) -> Any:
    """Import and return the adapter class of ``engine_id``.

    Raises:
        OracleError: unknown id, or the module cannot be imported (reason named).
    """
    reason = unavailable_reason(engine_id)
    if reason:
        raise OracleError(f"engine {engine_id!r}: {reason}")
    module, _, cls = registry()[engine_id].partition(":")
    return getattr(importlib.import_module(module), cls)


def resolve_ports(value: str, reference: str) -> list[str]:
    """``--port`` -> engine ids: 'none' -> [], 'auto' -> each of mlx, mtplx that can run here."""
    if value == "none":
        return []
    if value == "auto":
        return [e for e in ("mlx", "mtplx") if e != reference and unavailable_reason(e) is None]
    return [v.strip() for v in value.split(",") if v.strip() and v.strip() != reference]
