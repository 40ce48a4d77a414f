"""``oracles pin NAME --dequantize-from PIN|DIR|FILE.gguf``: the float32 snapshot of a quantized artifact
(:mod:`oracles.pins.dequantize`) built under ``$ORACLES_HOME/snapshots/NAME`` and its pin written, source
``dequantize:PIN`` or ``dequantize:local:PATH``, so ``oracles materialize NAME`` can rebuild it.
"""

from __future__ import annotations

from pathlib import Path

from oracles.pins.convert import TOOL_DISTRIBUTIONS, building, built_fields, versions
from oracles.pins.dequantize import dequantize_snapshot
from oracles.pins.materialize import source_of
from oracles.pins.pin import Pin, PinStore, oracles_home, store, verify_snapshot
from oracles.pins.precision import gguf_type
from oracles.pins.writer import check_name, write_pin_file


def pin_dequantized(name: str, spec: str, pins_dir: Path | None = None, *, trained: bool = True) -> Pin:
    """``oracles pin NAME --dequantize-from SPEC``: build the float32 snapshot of ``spec`` (a pin name, a
    quantized MLX folder or a ``.gguf`` file) into ``$ORACLES_HOME/snapshots/NAME`` and write its pin
    (source ``dequantize:PIN`` or ``dequantize:local:PATH``, the source's digest, the recipe, the precision
    with ``dequantized_from`` or ``gguf_type``; ``"trained": false`` unless ``trained``) in ``pins_dir``
    (default: the active store's first folder).

    Returns the written pin, verified against the built snapshot.

    Raises:
        PinError: a bad or taken name, a source that does not exist or is not quantized, config and
            weights that disagree, or the pin cannot be written; nothing is left half-written (the
            snapshot is built in a temporary folder, the pin created whole, then the folder renamed).
    """
    where = store() if pins_dir is None else PinStore.with_project(pins_dir)
    check_name(name, where)
    is_pin = "/" not in spec and where.path(spec) is not None
    source = f"dequantize:{spec}" if is_pin else f"dequantize:local:{Path(spec).expanduser().resolve()}"
    draft = Pin(name=name, source=source, source_sha256=None, model_class="", files={}, safetensors_headers={},
                built_with={}, path=(pins_dir or where.dirs[0]) / f"{name}.json")
    root, digest, called = source_of(draft)
    tool = "transformers.gguf" if root.is_file() else "mx.dequantize"
    dist = TOOL_DISTRIBUTIONS[tool]
    extra = {"gguf_type": gguf_type(root)} if root.is_file() else {"dequantized_from": called}
    dest = oracles_home() / "snapshots" / name
    with building(dest) as tmp:
        model_class = dequantize_snapshot(root, tmp)
        doc = {"name": name, "source": source, **built_fields(tmp, model_class, digest, tool, extra),
               "recipe": {"tool": tool, "version": versions((dist,)).get(dist, ""), "arguments": {}}}
        if is_pin:
            doc["converted_from"] = spec
        if not trained:
            doc["trained"] = False
        pin = write_pin_file(draft.path, doc)
    verify_snapshot(pin, dest)
    return pin
