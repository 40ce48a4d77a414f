"""Builders of the tiny seeded twins: transformers config and model classes at tiny sizes, seeded weights.

Each builder makes its model and hands it to :func:`save_snapshot`, which writes what every twin's
snapshot holds the same way (so two builds of one seed are byte-identical): float32 safetensors with
the tensors in sorted order, a canonical ``config.json`` without the fields that name a path or a
library version, and a ``generation_config.json``.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Iterable

#: Fields of a transformers config dict that differ between two identical builds.
VOLATILE = ("_name_or_path", "transformers_version")


def write_json(path: Path, obj: Any) -> None:
    """``obj`` as sorted, indented JSON with a final newline (one text for one value)."""
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def save_snapshot(model: Any, out: Path, generation: dict[str, Any], *, tied: bool,
                  config_extra: dict[str, Any] | None = None) -> str:
    """Write ``model``'s weights, config and generation config into ``out``; return its class name.

    ``tied``: leave ``lm_head.weight`` out (transformers re-ties it from the embeddings on load);
    ``config_extra``: fields set on the top-level config after the volatile ones are dropped (from it and
    from any nested ``*_config`` dict).
    """
    from safetensors.torch import save_file

    tensors = {k: v.detach().contiguous().clone() for k, v in sorted(model.state_dict().items())
               if not (tied and k == "lm_head.weight")}
    save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = model.config.to_dict()
    for sub in [cfg, *(v for k, v in cfg.items() if k.endswith("_config") and isinstance(v, dict))]:
        for volatile in VOLATILE:
            sub.pop(volatile, None)
    cfg.update({"dtype": "float32", "architectures": [type(model).__name__], **(config_extra or {})})
    write_json(out / "config.json", cfg)
    write_json(out / "generation_config.json", generation)
    return type(model).__name__


def copy_tokenizer(root: Path, out: Path, names: Iterable[str]) -> None:
    """Copy the tokenizer files ``names`` from ``root`` byte for byte (a twin shares a pin's tokenizer).

    Raises:
        FileNotFoundError: a file is missing from ``root``.
    """
    for name in names:
        shutil.copyfile(root / name, out / name)
