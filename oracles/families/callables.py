"""The two callables a family's runs are given by the session, typed here so that the families need not
import the plugin (whose fixtures of the same names make them: :mod:`oracles.plugin.fixtures`).

- :data:`Engines`: ``engines(engine_id, pin_name, **constructor options) -> Engine``, each engine built once
  per session per worker;
- :class:`Runs`: ``runs(key, fn)`` is ``fn()``'s value (or exception), once per session per key.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Hashable, Protocol, TypeVar

if TYPE_CHECKING:
    from oracles.engines.base import Engine

Engines = Callable[..., "Engine"]  # (engine id, pin name, **constructor options) -> Engine
T = TypeVar("T")


class Runs(Protocol):
    """The ``runs`` fixture: ``runs(key, fn)`` is ``fn()``'s value (or exception), once per key while the tests
    sharing it run (:mod:`oracles.plugin.memo`)."""

    def __call__(self, key: Hashable, fn: Callable[[], T], /) -> T: ...
