"""What the runs in progress have entered: one stack per kind of store (pins, records, the engine
registry), so code that asks by name (``load_pin(name)``) reads the store of the run it is in.

A run enters its stores when it starts and leaves them when it ends (:class:`oracles.pins.project.Project`:
a pytest session at configure and unconfigure, an ``oracles`` command for its call). A run nested in
another (an in-process pytester session, the ``oracles`` command called from a test) sees its own, and
the outer one's again once it ends: nothing is reset by hand. A plain list, not a context variable, so
threads a test starts see the run's stores too.
"""

from __future__ import annotations

from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class Active(Generic[T]):
    """The values entered by the runs in progress, innermost last."""

    def __init__(self) -> None:
        self._stack: list[T] = []

    def enter(self, value: T) -> None:
        """Make ``value`` the current one until :meth:`leave`."""
        self._stack.append(value)

    def leave(self, value: T) -> None:
        """Undo :meth:`enter` of ``value`` (the innermost entry of it); a value not entered is ignored."""
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i] is value:
                del self._stack[i]
                return

    def current(self, outside: Callable[[], T]) -> T:
        """The innermost value entered, else ``outside()`` (what is read outside any run)."""
        return self._stack[-1] if self._stack else outside()
