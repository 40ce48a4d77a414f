"""The input guards every adapter calls, and the pinned config it may read at collection. numpy-free.

Re-exported by :mod:`oracles.engines.base` (``from oracles.engines.base import check_fits`` works).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

from oracles.engines.types import ContextTooShort

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


class Guarded(Protocol):
    """What the guards read of an engine (every :class:`oracles.engines.base.Engine` has it): its id, its pin's
    name, its context (``max_position_embeddings``; 0: no limit) and a cache's length."""

    @property
    def id(self) -> str: ...
    @property
    def pin(self) -> str: ...
    @property
    def max_context(self) -> int: ...
    def cache_length(self, cache: Any) -> int: ...


def pinned_config(pin: Pin) -> dict[str, Any] | None:
    """``pin``'s config.json, read from its snapshot folder when that file is the pinned one (equal
    digest), else None (not materialised yet, or another file: the load will judge). Small and read
    without any framework, so an adapter's :meth:`oracles.engines.base.Engine.unsupported_pin` may ask it at collection."""
    import json

    from oracles.pins.pin import sha256_file, snapshot_dir

    digest = pin.files.get("config.json")
    try:
        path = snapshot_dir(pin) / "config.json"
        if digest is None or not path.is_file() or sha256_file(path) != digest.sha256:
            return None
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


#: The file kinds a runtime loads as one file (llama.cpp a GGUF, LiteRT a flatbuffer, ONNX Runtime a graph and its
#: external data, ExecuTorch a program), not a model folder.
SINGLE_FILE_ARTIFACTS = (".gguf", ".tflite", ".onnx", ".pte")  # .pte: issue 27


def single_file_artifact(pin: Pin) -> str | None:
    """The pinned file a single-file runtime loads (``"model.gguf"``, by :data:`SINGLE_FILE_ARTIFACTS`)
    when ``pin``'s files hold one and no safetensors weights (so a folder loader such as transformers
    or mlx-lm has nothing to read; tokenizer files and a config may sit beside it), else None. From the
    pin file alone."""
    if any(n.endswith(".safetensors") for n in pin.files):
        return None
    found = sorted(n for n in pin.files if n.endswith(SINGLE_FILE_ARTIFACTS))
    return found[0] if found else None


def check_forward_length(engine: Guarded, cached: int, new: int) -> None:
    """Refuse an empty forward, or one whose ``cached + new`` positions pass ``engine.max_context``
    (the model config's ``max_position_embeddings``; 0 means no limit).

    Raises:
        ValueError: naming both counts, the context and the pin.
    """
    if new == 0:
        raise ValueError("forward: no token ids")
    if engine.max_context and cached + new > engine.max_context:
        raise ValueError(f"forward: {cached} cached + {new} new tokens exceed the context of "
                         f"{engine.max_context} (max_position_embeddings of {engine.pin})")


def check_fits(engine: Guarded, record_id: str, n: int) -> None:
    """Refuse a prompt of ``n`` ids that does not fit ``engine``'s context, naming the record and the
    first position past the context: the pin's model cannot run that record, so its tests skip.

    Raises:
        ContextTooShort: ``n > engine.max_context`` (when the engine has one).
    """
    if engine.max_context and n > engine.max_context:
        raise ContextTooShort(engine.id, f"run record {record_id!r} ({n} prompt tokens)",
                              f"the context of pin {engine.pin} is {engine.max_context}; position "
                              f"{engine.max_context} is past its end")


def check_cohort(engine: Guarded, tokens: Sequence[int], caches: Sequence[Any]) -> None:
    """Refuse a decode cohort that cannot run: ``len(tokens) != len(caches)``, no lanes, a missing
    cache, one cache object given for two lanes (both would append to it), or a lane whose one new
    token would pass ``engine.max_context`` (:func:`check_forward_length` per lane).

    Raises:
        ValueError: naming the counts, or the lane and its cached length.
    """
    if len(tokens) != len(caches):
        raise ValueError(f"decode_cohort: {len(tokens)} tokens for {len(caches)} caches "
                         f"(one token a lane, one cache a lane)")
    if not tokens:
        raise ValueError("decode_cohort: empty cohort (B = 0 lanes)")
    seen: dict[int, int] = {}
    for b, cache in enumerate(caches):
        if cache is None:
            raise ValueError(f"decode_cohort: lane {b} has no cache (None); make one with make_cache/forward")
        if id(cache) in seen:
            raise ValueError(f"decode_cohort: lanes {seen[id(cache)]} and {b} share one cache object")
        seen[id(cache)] = b
        try:
            check_forward_length(engine, engine.cache_length(cache), 1)
        except ValueError as exc:
            raise ValueError(f"decode_cohort: lane {b}: {exc}") from None


__all__ = ["check_cohort", "check_fits", "check_forward_length", "pinned_config"]
