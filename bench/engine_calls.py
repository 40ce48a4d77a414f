"""Tally the engine calls a run makes, so a bench can show that two runs it compares made the same ones.

Each engine's public calls (:data:`COUNTED`) are wrapped on the instance: one tally entry per
``(engine id, pin, method)`` with the number of calls and, for ``forward``, the token ids fed. As a
pytest plugin (``-p engine_calls`` with this folder on ``PYTHONPATH``) it wraps every engine the
session's loader builds and writes the tally as JSON to ``$ORACLES_BENCH_CALLS`` at the end of the
session; :func:`count_calls` does the same for a script's own engines.
"""

from __future__ import annotations

import functools
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable

#: The engine methods tallied: the work a family asks of an engine (a method an engine lacks is skipped).
COUNTED = ("forward", "plain_logits", "lm_head", "final_norm", "taps", "make_cache", "trim", "snapshot", "restore",
           "generate", "speculative", "chat_ids")
#: Where the plugin writes its tally (the bench sets it per run).
ENV = "ORACLES_BENCH_CALLS"

Tally = Counter[str]


def _tokens(args: tuple[Any, ...]) -> int:
    prompt = args[0] if args else None
    ids = getattr(prompt, "ids", prompt)
    return len(ids) if isinstance(ids, (list, tuple)) else 0


def count_calls(engine: Any, tally: Tally) -> Any:
    """Wrap ``engine``'s :data:`COUNTED` methods on the instance so each call adds to ``tally``
    (``"ENGINE@PIN.method"``: calls; ``"ENGINE@PIN.forward tokens"``: ids fed); returns ``engine``."""
    where = f"{engine.id}@{engine.pin}"
    for name in COUNTED:
        method = getattr(engine, name, None)
        if method is None:
            continue

        def counted(*args: Any, _m: Callable[..., Any] = method, _n: str = name, **kwargs: Any) -> Any:
            tally[f"{where}.{_n}"] += 1
            if _n == "forward":
                tally[f"{where}.forward tokens"] += _tokens(args)
            return _m(*args, **kwargs)

        setattr(engine, name, functools.wraps(method)(counted))
    return engine


TALLY: Tally = Counter()


def pytest_configure(config: Any) -> None:
    """Wrap what the session's engine loader builds (after its contract checks are installed)."""
    from oracles.plugin.fixtures import EngineLoader

    build = EngineLoader.build

    def counted_build(self: EngineLoader, cls: Any, root: Path, pin: Any, **options: Any) -> Any:
        engine = build(self, cls, root, pin, **options)
        return engine if isinstance(engine, str) else count_calls(engine, TALLY)

    EngineLoader.build = counted_build  # type: ignore[method-assign]


def pytest_unconfigure(config: Any) -> None:
    """Write the tally where :data:`ENV` says (nothing when it is not set)."""
    if path := os.environ.get(ENV):
        Path(path).write_text(json.dumps(dict(sorted(TALLY.items())), indent=1) + "\n")
