"""Config translation for mlx-lm: what it needs to read a transformers config.json as transformers
does, and whether it has a model module for one at all (asked at collection, without importing mlx).

transformers 5 writes the RoPE base as ``rope_parameters: {"rope_theta": ...}``, and mlx-lm 0.32's
Llama ``ModelArgs`` reads only the top-level ``rope_theta`` and otherwise defaults to 10,000. Loaded as
is, SmolLM2 (base 100,000) runs with the wrong rotary frequencies (measured on "ping": max |Δlogit|
9.96, argmax agreement 84%), so the adapter passes ``rope_theta`` (and a non-default ``rope_scaling``)
through mlx-lm's own ``model_config`` override (:func:`rope_overrides`).

No translation is silent: each is a :class:`Translation` (field, what mlx-lm reads without it, what
transformers reads, how it was applied), the engine's ``translations``; and the artifact as the user
loads it (``mlx_lm.load(path)``, no override: :func:`load_as_shipped`) is held against transformers'
reading field by field (:func:`reading_differences`) by ``oracles/suite/test_as_shipped.py``.

The functions that read a config as mlx-lm does import mlx-lm (hence mlx) inside them
(:func:`mlx_reading`, :func:`load_as_shipped`); the rest is pure.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.metadata
import importlib.util
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

#: mlx-lm ``ModelArgs`` fields that transformers 5 reads under another key of config.json (dotted).
TRANSFORMERS_KEYS = {"rope_theta": "rope_parameters.rope_theta", "rope_scaling": "rope_parameters",
                     "full_attention_interval": "layer_types"}


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


@dataclass(frozen=True)
class Translation:
    """One config field the adapter translates for mlx-lm: ``mlx_lm_reads`` is what mlx-lm reads from
    the artifact's config.json without it (its ``ModelArgs`` value, or its refusal quoted),
    ``transformers_reads`` what transformers reads (at ``transformers_key``), ``applied`` how the
    translation was made."""

    field: str
    mlx_lm_reads: Any
    transformers_key: str
    transformers_reads: Any
    applied: str

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def note(self) -> str:
        """One line for a verdict: ``"rope_theta 100000.0 from rope_parameters.rope_theta (mlx-lm reads 10000.0)"``."""
        return f"{self.field} {self.transformers_reads!r} from {self.transformers_key} (mlx-lm reads {self.mlx_lm_reads!r})"


def keyed(config: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted ``key`` (``"rope_parameters.rope_theta"``) in ``config``."""
    node: Any = config
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def transformers_key(config: Mapping[str, Any], field: str) -> str:
    """Where transformers 5 reads mlx-lm's ``field`` in ``config``: the field itself when the config
    has it at the top, else :data:`TRANSFORMERS_KEYS`' key for it (the field's own name otherwise)."""
    return field if field in config else TRANSFORMERS_KEYS.get(field, field)


def translations(config: Mapping[str, Any], overrides: Mapping[str, Any],
                 mlx_reads: Mapping[str, Any]) -> list[Translation]:
    """One :class:`Translation` per ``model_config`` override the adapter passes for ``config`` (its
    config.json); ``mlx_reads[field]`` is mlx-lm's reading without the override (:func:`mlx_reading`)."""
    out = []
    for field, value in overrides.items():
        key = transformers_key(config, field)
        found, read = keyed(config, key)
        out.append(Translation(field=field, mlx_lm_reads=mlx_reads.get(field), transformers_key=key,
                               transformers_reads=read if found else None,
                               applied=f"mlx_lm.load(path, model_config={{{field!r}: {value!r}}})"))
    return out


def mlx_reading(config: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """What mlx-lm reads for each of ``fields`` from ``config`` as is: its ``ModelArgs.from_dict``
    attributes (mlx-lm's ``utils._get_classes`` picks the class), or, where mlx-lm refuses the config,
    that refusal quoted (``"refused: ..."``) for every field. Imports mlx-lm."""
    from mlx_lm.utils import _get_classes

    try:
        args = _get_classes(config=config)[1].from_dict(config)
    except (ValueError, TypeError, KeyError) as exc:
        return {f: f"refused: {exc}" for f in fields}
    return {f: getattr(args, f, None) for f in fields}


@dataclass(frozen=True)
class Difference:
    """One field mlx-lm reads otherwise than transformers: mlx-lm's value, transformers' key and value."""

    field: str
    mlx_lm_reads: Any
    transformers_key: str
    transformers_reads: Any

    def line(self) -> str:
        return (f"{self.field}: mlx-lm reads {self.mlx_lm_reads!r}, transformers reads {self.transformers_reads!r} "
                f"({self.transformers_key})")


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return float(a) == float(b)
    return bool(a == b)


def reading_differences(mlx_reads: Mapping[str, Any], transformers_reads: Mapping[str, Any]) -> list[Difference]:
    """The fields mlx-lm reads (``mlx_reads``: its ``ModelArgs`` fields and values, or
    ``{"model_type": "refused: ..."}`` where it refuses the config) whose value differs from
    transformers' reading (``transformers_reads``: ``PretrainedConfig.to_dict()``, at
    :func:`transformers_key`). A field mlx-lm leaves None (derived in its model code) or transformers
    does not hold is not compared. Numbers compare by value (1e5 == 100000.0), booleans by identity.
    """
    out = []
    for field, value in mlx_reads.items():
        if value is None:
            continue
        key = transformers_key(transformers_reads, field)
        found, read = keyed(transformers_reads, key)
        if found and not _same(value, read):
            out.append(Difference(field, value, key, read))
    return out


@dataclass
class AsShipped:
    """The artifact as ``mlx_lm.load(path)`` builds it: the model (None where mlx-lm refuses the
    folder) and mlx-lm's reading of each ``ModelArgs`` field (``{"model_type": "refused: ..."}`` then)."""

    model: Any
    reads: dict[str, Any]

    def logits(self, ids: Sequence[int]) -> Any:
        """float32 numpy ``[T, V]`` logits of one cold forward of ``ids``.

        Raises:
            ValueError: mlx-lm refused the folder (there is no model).
        """
        import mlx.core as mx
        import numpy as np

        if self.model is None:
            raise ValueError(f"mlx-lm refused the folder: {self.reads}")
        out = self.model(mx.array([list(ids)], dtype=mx.int32))[0]
        mx.eval(out)
        return np.array(out.astype(mx.float32), dtype=np.float32)


def load_as_shipped(root: Path) -> AsShipped:
    """The artifact as its user loads it: exactly ``mlx_lm.load(str(root))`` (no ``model_config``), and
    mlx-lm's reading of every ``ModelArgs`` field (``model.args``); a refusal (mlx-lm's ``ValueError``,
    an unsupported ``model_type``, say) is kept as the reading of ``model_type``. Imports mlx-lm."""
    from mlx_lm import load

    try:
        model = load(str(root))[0]
    except ValueError as exc:
        return AsShipped(None, {"model_type": f"refused: {exc}"})
    return AsShipped(model, {f.name: getattr(model.args, f.name) for f in dataclasses.fields(model.args)})


__all__ = ["AsShipped", "Difference", "Translation", "keyed", "load_as_shipped", "missing_model_module", "mlx_reading",
           "reading_differences", "rope_overrides", "transformers_key", "translations"]
