"""pytest hooks and options of pytest-oracles.

Installed, the plugin changes nothing in a project that did not ask for it: it registers its options
(:mod:`oracles.plugin.options`), hooks (:mod:`oracles.plugin.hookspecs`), markers and fixtures (inert
until a test asks), and nothing else happens (no receipt, partial log, environment variable or
terminal section) unless the project's ini file says ``oracles = true`` or the run passes a receipt
option (``--receipts-dir``, ``--receipt-tag``, ``--resume``). The tests of the shipped suite
(``oracles.suite``) keep their slow and gpu gates either way.

What a session does once in use is one object, :class:`oracles.plugin.session.OracleSession`, made here
and only here (:func:`session_of`, the first time a hook needs it) and imported only then: a run that
never asks for pytest-oracles imports this module, its options, hookspecs and :mod:`oracles.families`,
and runs no hook per test. Each hook below delegates to that object. Imports here stay light (no numpy,
no torch, transformers or mlx): ``pytest -m dry`` must not load the heavy ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

import oracles.families as families
from oracles.ini import DEFAULTS, PINS_KEY, RECORDS_KEY
from oracles.plugin.names import FIXTURES, PARAMETERS, TOKENS_MISSING
from oracles.plugin.options import add_options, asked, enabled_by_options

if TYPE_CHECKING:
    from oracles.families import Family
    from oracles.plugin.session import OracleSession

pytest_plugins = ["oracles.plugin.fixtures"]

#: pytest-oracles is on for this run (the ini's ``oracles = true`` or a receipt option).
ENABLED_KEY = pytest.StashKey[bool]()
#: The session object, once made (:func:`session_of`).
SESSION_KEY = pytest.StashKey["OracleSession"]()
#: The families plugins added at configure, taken out again at unconfigure.
ADDED_KEY = pytest.StashKey[tuple["Family", ...]]()
PACKAGE = str(Path(__file__).resolve().parents[1])


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    """Register the hooks a project may implement (:mod:`oracles.plugin.hookspecs`)."""
    from oracles.plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


def pytest_addoption(parser: pytest.Parser) -> None:
    """The option table's options (:mod:`oracles.plugin.options`) and the ini keys."""
    add_options(parser)
    parser.addini("oracles", type="bool", default=False,
                  help="turn pytest-oracles on for this project: receipts, partial logs and the slow gate")
    parser.addini(PINS_KEY, type="paths", default=[],
                  help=f"the project's pins folder, before the built-in pins (default {DEFAULTS[PINS_KEY]})")
    parser.addini(RECORDS_KEY, type="paths", default=[],
                  help=f"the project's records folder for per-tokenizer token ids (default {DEFAULTS[RECORDS_KEY]})")
    # issue 25 (wire): the far sides the project runs as engines wire:NAME (oracles/engines/wire/config.py)
    parser.addini("oracles_wire", type="linelist", default=[],
                  help="far sides run as engines wire:NAME: 'NAME = COMMAND', 'NAME = tcp://HOST:PORT', "
                       "'NAME.pins = PIN,...', 'NAME.same-as = ENGINE', 'NAME.timeout = SECONDS' (docs/wire.md)")


def session_of(config: pytest.Config) -> OracleSession:
    """The session object of ``config``, made now if this is the first need (the one place it is made).

    Raises:
        pytest.UsageError: making it refused an option (:meth:`OracleSession.start`).
    """
    session = config.stash.get(SESSION_KEY, None)
    if session is None:
        from oracles.plugin.session import OracleSession

        session = config.stash[SESSION_KEY] = OracleSession.start(config, config.stash.get(ENABLED_KEY, False))
    return session


def pytest_configure(config: pytest.Config) -> None:
    """The families plugins add, the markers; the session at once where pytest-oracles is on or asked for."""
    if config.hook.pytest_oracles_families.get_hookimpls():
        from oracles.plugin.extend import add_families

        config.stash[ADDED_KEY] = add_families(config)
    for family in families.FAMILIES:
        config.addinivalue_line("markers", f"{family.name}: {family.help}")
    for name, text in families.OTHER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.addinivalue_line("markers", f"{TOKENS_MISSING}(message): internal: the pin lacks the family's token ids")
    enabled = bool(config.getini("oracles")) or enabled_by_options(config.option)
    config.stash[ENABLED_KEY] = enabled
    if enabled or asked(config.option) or "oracles" in getattr(config, "workerinput", {}):
        session_of(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session leaves its stores, and the families plugins added are taken out again."""
    if (session := config.stash.get(SESSION_KEY, None)) is not None:
        session.close()
    if (added := config.stash.get(ADDED_KEY, None)) is not None:
        from oracles.plugin.extend import remove_families

        remove_families(added)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``pin``, ``engine_id`` and ``port_id`` over the compatible (pin, engine) pairs."""
    if not PARAMETERS.isdisjoint(metafunc.fixturenames):
        session_of(metafunc.config).parametrize(metafunc)


def pytest_pycollect_makeitem(collector: pytest.Module | pytest.Class, name: str, obj: object) -> list[pytest.Item] | None:
    """Under ``-m``, a test of ours the expression cannot select is collected unparametrized
    (:func:`oracles.plugin.collect.unexpanded`)."""
    if not (collector.config.option.markexpr and SESSION_KEY in collector.config.stash):
        return None
    from oracles.plugin import collect

    return collect.unexpanded(collector, name, obj)


def _needs_us(items: list[pytest.Item]) -> bool:
    """Whether a collected test uses the plugin's fixtures or belongs to the shipped suite."""
    seen: set[Any] = set()
    for item in items:
        if not FIXTURES.isdisjoint(getattr(item, "fixturenames", ())):
            return True
        if item.path not in seen:
            seen.add(item.path)
            if str(item.path).startswith(PACKAGE):
                return True
    return False


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook turns the marks into nodeid suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """xdist groups, the port scope, the slow and gpu gates, and resumed passes (an active session only)."""
    if SESSION_KEY in config.stash or _needs_us(items):
        session_of(config).modify_items(items)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -m / -k deselection
def pytest_collection_modifyitems_selected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A selected test whose pin has no token ids for its family stops the run, naming the command."""
    if (session := config.stash.get(SESSION_KEY, None)) is not None:
        session.refuse_missing_tokens(items)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector) -> Any:
    """A record or pin file that breaks collection is reported in one line (the message names file and field)."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None and crash.message.startswith("oracles.errors.") and collector.config.option.tbstyle == "auto":
        report.longrepr = crash.message.removeprefix("oracles.errors.")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The receipt's path, the engines and pins (only where pytest-oracles is on)."""
    if not config.stash.get(ENABLED_KEY, False) or hasattr(config, "workerinput"):
        return []
    return session_of(config).header_lines()


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
    """The (engine, pin) pairs left out of the parametrization, with reasons (never silently)."""
    if not config.stash.get(ENABLED_KEY, False):
        return []
    return session_of(config).collection_lines()
