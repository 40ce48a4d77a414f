"""The fixtures pytest-oracles gives every project (registered by the plugin; inert until a test asks):
verified snapshots, engines built once per session per worker, the run memo, the receipt.

A project's own oracle test, in full::

    import pytest

    @pytest.mark.slow
    def test_next_token_is_stable(engine, runs, receipt):
        step = runs(("ping", engine.id, engine.pin), lambda: engine.forward(engine.chat_ids(
            [{"role": "user", "content": "ping"}]), keep=1))
        again = engine.forward(engine.chat_ids([{"role": "user", "content": "ping"}]), keep=1)
        receipt["next_token"] = int(step.logits[-1].argmax())
        assert (again.logits == step.logits).all()

Run with ``pytest --runslow --pin my-model --port my-port``: ``engine`` is each engine (the reference,
then the ports) on each pin. Heavy imports (torch, transformers, mlx) happen when a fixture first
builds an engine, never at collection: ``pytest -m dry`` imports none of them.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Hashable, Protocol, TypeVar

import pytest

if TYPE_CHECKING:
    from oracles.engines.base import Engine
    from oracles.pins import Pin
    from oracles.receipts import Receipt

# The library is imported inside the fixtures, not here: the plugin registers this module in every
# pytest run, and a run that uses none of these fixtures must not pay for numpy or the engine registry.
Engines = Callable[[str, str], "Engine"]
T = TypeVar("T")


class Runs(Protocol):
    """The ``runs`` fixture: ``runs(key, fn)`` is ``fn()``'s value (or exception), once per session per key."""

    def __call__(self, key: Hashable, fn: Callable[[], T], /) -> T: ...


@pytest.fixture(scope="session")
def snapshot_overrides(pytestconfig: pytest.Config) -> dict[str, Path]:
    """``--snapshot NAME=PATH`` as {pin name: folder}."""
    from oracles.errors import OracleError
    from oracles.pins import parse_snapshot_options
    from oracles.state import settings_of

    settings_of(pytestconfig)  # the session is active: the project's pin store is the one searched
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
    from oracles.errors import OracleError
    from oracles.pins import load_pin, snapshot_dir, verify_snapshot
    from oracles.state import emit

    done: dict[str, Path | OracleError] = {}

    def get(name: str) -> Path:
        if name not in done:
            try:
                pin = load_pin(name)
                root = snapshot_overrides.get(name) or snapshot_dir(pin)
                figures = verify_snapshot(pin, root)
                emit(pytestconfig, "pin_verified", **figures, source=pin.source, override=name in snapshot_overrides)
                done[name] = root
            except OracleError as exc:
                done[name] = exc
        result = done[name]
        if isinstance(result, OracleError):
            pytest.fail(f"pin {name}: {result}", pytrace=False)
        return result

    return get


@pytest.fixture(scope="session")
def engines(pytestconfig: pytest.Config, verified_snapshot: Callable[[str], Path]) -> Engines:
    """``engines(engine_id, pin)``: the engine, built once per session per worker (skipped, naming
    why, where it cannot run here)."""
    from oracles.engines import engine_class, unavailable_reason
    from oracles.state import emit, settings_of

    loaded: dict[tuple[str, str], Engine] = {}
    threads = pytestconfig.getoption("oracle_threads")
    settings = settings_of(pytestconfig)

    def get(engine_id: str, pin: str) -> Engine:
        key = (engine_id, pin)
        if key not in loaded:
            reason = unavailable_reason(engine_id)
            if reason:
                pytest.skip(f"engine {engine_id}: {reason}")
            root = verified_snapshot(pin)
            cls = engine_class(engine_id)
            start = time.perf_counter()
            engine = cls(root, pin, threads, **settings.engine_kwargs(engine_id))
            seconds = time.perf_counter() - start
            emit(pytestconfig, "engine_loaded", name=engine_id, pin=pin, seconds=round(seconds, 4), **engine.describe())
            loaded[key] = engine
        return loaded[key]

    return get


@pytest.fixture
def engine(engines: Engines, engine_id: str, pin: str) -> Engine:
    """This test's engine (the reference or a port, parameter ``engine_id``) on this test's pin."""
    return engines(engine_id, pin)


@pytest.fixture
def reference(engines: Engines, pytestconfig: pytest.Config, pin: str) -> Engine:
    """The reference engine (``--reference``, default torch) on this test's pin."""
    from oracles.state import settings_of

    return engines(settings_of(pytestconfig).reference, pin)


@pytest.fixture
def port(engines: Engines, port_id: str, pin: str) -> Engine:
    """This test's port engine (parameter ``port_id``) on this test's pin."""
    return engines(port_id, pin)


@pytest.fixture
def pin_file(pin: str) -> Pin:
    """The parsed pin file (:class:`oracles.pins.Pin`) of this test's pin."""
    from oracles.pins import load_pin

    return load_pin(pin)


@pytest.fixture(scope="session")
def runs() -> Runs:
    """``runs(key, fn)``: ``fn()`` once per session per key, memoised (exceptions too, re-raised)."""
    cache: dict[Hashable, tuple[str, Any]] = {}

    def once(key: Hashable, fn: Callable[[], T], /) -> T:
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


@pytest.fixture
def receipt(request: pytest.FixtureRequest) -> Receipt:
    """Attach JSON-safe data to this test's record in the session receipt (see :class:`Receipt`)."""
    from oracles.receipts import Receipt, plain_nodeid
    from oracles.state import DATA_KEY, state_of

    data: dict[str, Any] = {}
    request.node.user_properties.append((DATA_KEY, data))
    return Receipt(data, state_of(request.config).staging, plain_nodeid(request.node.nodeid))
