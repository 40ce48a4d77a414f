"""The run memo behind the ``runs`` fixture: each run made once per session per key, and dropped once the
group of tests that shares it is done.

Under ``--dist loadgroup`` a group is every test that shares runs (:func:`oracles.plugin.groups.record_group`:
one family's namespace, pin and record), and xdist sends a group to one worker whole, whose tests run one
after another. So when a worker starts a test of another group, the runs the previous groups made are read
by no later test: they are dropped. Kept, they are what fills a worker: a cohort's lanes hold one loaded
program or llama.cpp context each (hundreds of MB apiece), and a session of make test kept 13 GB in one
worker before its runs were dropped. Outside such a worker (a serial run, even with xdist installed and
the groups marked) or for a test of no family, nothing is dropped: a serial run visits a group's tests
interleaved with others', and a dropped run would be made again.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from typing import Any, Callable, Hashable, TypeVar

import pytest

T = TypeVar("T")


def group_of(item: pytest.Item, config: pytest.Config) -> str | None:
    """The name of ``item``'s ``xdist_group`` when ``config`` is an xdist worker's whose controller runs
    ``--dist loadgroup`` (``workerinput["oracles"]["loadgroup"]``, handed over by the plugin: a worker's own
    ``dist`` option reads ``no``); None otherwise (nothing to drop by)."""
    if not getattr(config, "workerinput", {}).get("oracles", {}).get("loadgroup"):
        return None
    mark = item.get_closest_marker("xdist_group")
    return str(mark.args[0]) if mark is not None and mark.args else None


class RunMemo:
    """``memo(key, fn)``: ``fn()``'s value (or the exception it raised, raised again) once per key, while the
    group that made it runs; :meth:`enter` names the group of the test about to run."""

    def __init__(self) -> None:
        self.made: dict[Hashable, tuple[str, Any]] = {}
        self.group: str | None = None
        self.dropped = 0

    def enter(self, group: str | None) -> None:
        """The next test belongs to ``group`` (its ``xdist_group`` name; ``None``: no group, nothing dropped).
        Entering another group than the last drops every run made so far and hands the freed memory back."""
        if group is None or group == self.group:
            return
        previous, self.group = self.group, group
        if previous is None or not self.made:
            return
        self.dropped += len(self.made)
        self.made.clear()
        _trim_heap()

    def __call__(self, key: Hashable, fn: Callable[[], T], /) -> T:
        if key not in self.made:
            try:
                self.made[key] = ("ok", fn())
            except Exception as exc:  # noqa: BLE001 - re-raised for every test sharing the run
                self.made[key] = ("error", exc)
        kind, value = self.made[key]
        if kind == "error":
            raise value
        return value


def _trim_heap() -> None:
    """glibc's ``malloc_trim(0)``: the freed small blocks of the heap returned to the system (a no-op where
    the C library is not glibc). Large blocks (a logits row, a cache) are their own mappings and go back on
    free; the many small ones a run leaves (tokenizer strings, Python objects) otherwise keep the heap's
    pages resident."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    trim = getattr(ctypes.CDLL(name), "malloc_trim", None)
    if trim is not None:
        trim(0)
