"""Project fixtures shared by tests/: verified snapshots, engines loaded once per session per worker,
and a session-scoped run cache so each expensive run happens once per record.

Heavy imports (torch, transformers, mlx) happen inside the engine modules, when a fixture first asks
for an engine, never at collection: ``pytest -m dry`` imports none of them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from oracles.engines import engine_class, resolve_ports, unavailable_reason
from oracles.errors import OracleError
from oracles.groups import record_group
from oracles.pins import DEFAULT_PIN, load_pin, parse_snapshot_options, snapshot_dir, verify_snapshot
from oracles.plugin import emit
from oracles.port_scope import EXECUTION_SAMPLE_TOKENS, PortScope

# tests/unit drive the plugin through pytester; pytest refuses pytest_plugins in a non-root conftest.
pytest_plugins = ["pytester"]


_ENGINE_IDS = pytest.StashKey[list[str]]()


def engine_ids(config: pytest.Config) -> list[str]:
    """The reference's engine id, then each port's (``--reference``, ``--port``).

    Resolved once per session: each resolution scans the installed entry points (~20 ms), and
    every test module that takes ``engine_id`` asks (1 s of ``pytest -m dry`` collection otherwise).
    """
    if _ENGINE_IDS not in config.stash:
        reference = config.getoption("reference")
        config.stash[_ENGINE_IDS] = [reference, *resolve_ports(config.getoption("port"), reference)]
    return list(config.stash[_ENGINE_IDS])


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``engine_id`` parametrizes over the reference and the ports; ``port_id`` over the ports only."""
    config = metafunc.config
    if "engine_id" in metafunc.fixturenames:
        metafunc.parametrize("engine_id", engine_ids(config), scope="session")
    if "port_id" in metafunc.fixturenames:
        ports = engine_ids(config)[1:]
        metafunc.parametrize("port_id", ports or [pytest.param("none", marks=pytest.mark.skip(
            reason=f"no port engine: --port {config.getoption('port')!r} resolved to none here "
                   f"(mlx: {unavailable_reason('mlx') or 'available'})"))], scope="session")


@pytest.hookimpl(tryfirst=True)  # before xdist's worker hook turns the marks into nodeid suffixes
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Oracle tests get their xdist group (:func:`oracles.groups.record_group`); a port engine's
    execution-family test of a record ``--port-records`` leaves out is skipped, naming the setting
    (the reference still runs it). A record's size is ``len(record.ids)`` or its ``budget_tokens``;
    d1 applies the same scope to its rows (tests/oracles/test_d1.py)."""
    for item in items:
        group = record_group(item.keywords, getattr(getattr(item, "callspec", None), "params", {}))
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    scope = PortScope.parse(config.getoption("port_records"))
    reference = config.getoption("reference")
    for item in items:
        if not any(m in item.keywords for m in ("mtplx", "mtplx_chat", "port")):
            continue
        params = getattr(getattr(item, "callspec", None), "params", {})
        engine = params.get("port_id", params.get("engine_id"))
        if engine is None or engine == reference:
            continue
        for value in params.values():
            size = len(value.ids) if hasattr(value, "ids") else getattr(value, "budget_tokens", None)
            if size is not None and not scope.selects(size, EXECUTION_SAMPLE_TOKENS):
                item.add_marker(pytest.mark.skip(reason=scope.skip_reason(engine, getattr(value, "id", str(value)), size)))


@pytest.fixture(scope="session")
def snapshot_overrides(pytestconfig: pytest.Config) -> dict[str, Path]:
    try:
        return parse_snapshot_options(pytestconfig.getoption("snapshot"))
    except OracleError as exc:
        raise pytest.UsageError(str(exc)) from None


@pytest.fixture(scope="session")
def verified_snapshot(pytestconfig: pytest.Config, snapshot_overrides: dict[str, Path]) -> Callable[[str], Path]:
    """``verified_snapshot(pin_name) -> Path``: verify the snapshot against its pin once per session.

    Every pinned file's bytes are read and hashed before any weights load; a mismatch fails every
    test that needs that pin with the file and both digests.
    """
    done: dict[str, Path | OracleError] = {}

    def get(name: str) -> Path:
        if name not in done:
            try:
                pin = load_pin(name)
                root = snapshot_overrides.get(name) or snapshot_dir(pin)
                figures = verify_snapshot(pin, root)
                emit(pytestconfig, "pin_verified", **figures, source=pin.source,
                     override=name in snapshot_overrides)
                done[name] = root
            except OracleError as exc:
                done[name] = exc
        result = done[name]
        if isinstance(result, OracleError):
            pytest.fail(f"pin {name}: {result}", pytrace=False)
        return result

    return get


@pytest.fixture(scope="session")
def engines(pytestconfig: pytest.Config, verified_snapshot: Callable[[str], Path]) -> Callable[..., Any]:
    """``engines(engine_id, pin=DEFAULT_PIN)``: the loaded engine, built once per session per worker."""
    loaded: dict[tuple[str, str], Any] = {}
    threads = pytestconfig.getoption("oracle_threads")

    def get(engine_id: str, pin: str = DEFAULT_PIN) -> Any:
        key = (engine_id, pin)
        if key not in loaded:
            reason = unavailable_reason(engine_id)
            if reason:
                pytest.skip(f"engine {engine_id}: {reason}")
            root = verified_snapshot(pin)
            cls = engine_class(engine_id)
            start = time.perf_counter()
            engine = cls(root, pin, threads)
            seconds = time.perf_counter() - start
            describe = engine.describe() if hasattr(engine, "describe") else {}
            emit(pytestconfig, "engine_loaded", name=engine_id, pin=pin, seconds=round(seconds, 4), **describe)
            loaded[key] = engine
        return loaded[key]

    return get


@pytest.fixture(scope="session")
def reference(engines: Callable[..., Any], pytestconfig: pytest.Config) -> Any:
    """The reference engine (``--reference``, default torch) on the default pin."""
    return engines(pytestconfig.getoption("reference"))


@pytest.fixture
def engine(engines: Callable[..., Any], engine_id: str) -> Any:
    """The engine of this test's ``engine_id`` parameter (the reference or a port), loaded once."""
    return engines(engine_id)


@pytest.fixture(scope="session")
def runs() -> Callable[..., Any]:
    """``runs(key, fn)``: ``fn()`` once per session per key, memoised (exceptions too, re-raised)."""
    cache: dict[Any, Any] = {}

    def once(key: Any, fn: Callable[[], Any]) -> Any:
        if key not in cache:
            try:
                cache[key] = ("ok", fn())
            except Exception as exc:  # noqa: BLE001 - re-raised for every test sharing the run
                cache[key] = ("error", exc)
        kind, value = cache[key]
        if kind == "error":
            raise value
        return value

    return once
