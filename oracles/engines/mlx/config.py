"""Config translation for mlx-lm: what it needs to read a transformers config.json as transformers
does, and whether it has a model module for one at all (asked at collection, without importing mlx).

transformers 5 writes the RoPE base as ``rope_parameters: {"rope_theta": ...}``, and mlx-lm 0.32's
Llama ``ModelArgs`` reads only the top-level ``rope_theta`` and otherwise defaults to 10,000. Loaded as
is, SmolLM2 (base 100,000) runs with the wrong rotary frequencies (measured on "ping": max |Δlogit|
9.96, argmax agreement 84%), so the adapter passes ``rope_theta`` (and a non-default ``rope_scaling``)
through mlx-lm's own ``model_config`` override (:func:`rope_overrides`).
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
from pathlib import Path
from typing import Any


def rope_overrides(config: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm ``model_config`` entries that carry a transformers-5 ``rope_parameters`` block over.

    Returns ``{}`` when the config already has a top-level ``rope_theta`` or no ``rope_parameters``.
    """
    params = config.get("rope_parameters")
    if "rope_theta" in config or not isinstance(params, dict) or "rope_theta" not in params:
        return {}
    out: dict[str, Any] = {"rope_theta": float(params["rope_theta"])}
    if params.get("rope_type", "default") != "default":
        out["rope_scaling"] = dict(params)
    return out


def missing_model_module(config: dict[str, Any], package: Path | None = None) -> str | None:
    """Why mlx-lm (installed at ``package``, default the one importable here) has no model module for
    this config.json, else None; None too when that cannot be told without importing mlx.

    Follows mlx-lm's ``utils._get_classes``: ``MODEL_ARCHITECTURE_REMAPPING`` by (model_type,
    architecture), else ``MODEL_REMAPPING``, then ``mlx_lm.models.<type>``. The tables are read from
    ``utils.py``'s source (importing it imports mlx), and the module is looked for as a file.
    """
    if package is None:
        spec = importlib.util.find_spec("mlx_lm")
        if spec is None or not spec.submodule_search_locations:
            return None
        package = Path(list(spec.submodule_search_locations)[0])
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        return "its config.json has no model_type"
    remap, arch_remap = _remappings(package / "utils.py")
    archs = config.get("architectures") or ()
    archs = (archs,) if isinstance(archs, str) else archs
    resolved = next((arch_remap[(model_type, a)] for a in archs if (model_type, a) in arch_remap),
                    remap.get(model_type, model_type))
    models = package / "models"
    if (models / f"{resolved}.py").is_file() or (models / resolved / "__init__.py").is_file():
        return None
    via = f" (mapped to {resolved!r})" if resolved != model_type else ""
    return (f"model_type {model_type!r}{via} has no model module in mlx-lm {_version('mlx-lm')} "
            f"(no {models.name}/{resolved}.py)")


@functools.lru_cache(maxsize=4)
def _remappings(utils: Path) -> tuple[dict[str, str], dict[tuple[str, str], str]]:
    """mlx-lm's ``MODEL_REMAPPING`` and ``MODEL_ARCHITECTURE_REMAPPING`` literals, empty where unreadable."""
    import ast

    found: dict[str, Any] = {}
    try:
        tree = ast.parse(utils.read_text())
    except (OSError, SyntaxError, ValueError):
        return {}, {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("MODEL_REMAPPING", "MODEL_ARCHITECTURE_REMAPPING"):
                try:
                    found[name] = ast.literal_eval(node.value)
                except ValueError:
                    pass
    remap, arch = found.get("MODEL_REMAPPING", {}), found.get("MODEL_ARCHITECTURE_REMAPPING", {})
    return (remap if isinstance(remap, dict) else {}), (arch if isinstance(arch, dict) else {})


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "?"


__all__ = ["missing_model_module", "rope_overrides"]
