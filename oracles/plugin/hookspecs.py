"""Hooks a project implements (in its ``conftest.py`` or a plugin) to extend pytest-oracles.

Registered by the plugin with ``pluginmanager.add_hookspecs`` in every run, so an implementation in a
conftest is checked against its spec. Adding an engine needs no hook: it is an entry point of the
group ``oracles.engines`` (:mod:`oracles.engines`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import pytest

if TYPE_CHECKING:
    from oracles.families import Family


@pytest.hookspec()
def pytest_oracles_receipt_fields(config: pytest.Config) -> dict[str, Any] | None:
    """Add JSON-safe fields to the session receipt, under the plugin's own key of ``plugin_fields``.

    Called once, on the controller, as the receipt is built at session end. Return a dict (strict
    JSON only: str, int, finite float, bool, None, lists and str-keyed dicts of them), or None to add
    nothing. A value JSON cannot hold (a set, a numpy scalar, NaN) keeps the receipt from being
    written: the run exits with an internal error naming the plugin and the key. A conftest.py is
    keyed by its path from the rootdir, any other plugin by its registered name.

    Example (``conftest.py``)::

        import platform

        def pytest_oracles_receipt_fields(config):
            return {"board": platform.node(), "firmware": "2.4.1"}

    gives, in the receipt, ``"plugin_fields": {"conftest.py": {"board": "...", "firmware": "2.4.1"}}``.
    """
    raise NotImplementedError  # a specification: pytest calls the implementations, never this


@pytest.hookspec()
def pytest_oracles_families() -> Sequence[Family]:
    """Add oracle families: each works like a built-in one (:data:`oracles.families.FAMILIES`).

    Called once, at configure, in every process of the run (xdist workers too). The families returned
    are appended to ``oracles.families.FAMILIES`` for the session, after the built-in ones (a test with
    several family markers belongs to the first): the marker is registered with its help text, a test
    marked with it that takes ``pin`` / ``engine_id`` / ``port_id`` runs on its ``default_pins`` (or
    ``--pin``), its records share an xdist group under its ``runs`` namespace, and its tests are counted
    under its name in the receipt's checks table. A name already taken, by a built-in family or another
    plugin's, stops the run with a usage error naming both.

    Example (``conftest.py``)::

        from oracles.families import Family

        def pytest_oracles_families():
            return [Family("asr", "speech oracle family: transcripts of the reference and the port agree",
                           runs="asr", default_pins=("smollm2-135m-instruct",))]

    and a test ``@pytest.mark.asr def test_transcript(engine, pin): ...`` runs on each engine and pin.
    """
    raise NotImplementedError  # a specification: pytest calls the implementations, never this
