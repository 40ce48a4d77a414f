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
from typing import TYPE_CHECKING, Any, Callable

import pytest

from oracles.families.callables import Engines, Runs

if TYPE_CHECKING:
    from oracles.engines.base import Engine
    from oracles.families.execution.judged import Judge
    from oracles.pins.pin import Pin
    from oracles.plugin.memo import RunMemo
    from oracles.receipts.table import Receipt

# The library is imported inside the fixtures, not here: the plugin registers this module in every
# pytest run, and a run that uses none of these fixtures must not pay for numpy or the engine registry.


@pytest.fixture(scope="session")
def snapshot_overrides(pytestconfig: pytest.Config) -> dict[str, Path]:
    """``--snapshot NAME=PATH`` as {pin name: folder}."""
    from oracles.plugin.state import settings_of

    return dict(settings_of(pytestconfig).snapshots)


class PinCache:
    """Pins by name, each pin file read and validated once (:func:`oracles.pins.pin.load_pin`); the
    session's is the ``pins`` fixture, which every fixture below looks a pin up through."""

    def __init__(self, load: Callable[[str], Pin] | None = None) -> None:
        self.load = load
        self.loaded: dict[str, Pin] = {}

    def __call__(self, name: str) -> Pin:
        """The pin ``name``, read on its first call.

        Raises:
            PinError: as :func:`oracles.pins.pin.load_pin` (an unknown name, a malformed file), raised again
                on every call (nothing is kept of a pin that did not load).
        """
        if name not in self.loaded:
            from oracles.pins.pin import load_pin

            self.loaded[name] = (self.load or load_pin)(name)
        return self.loaded[name]


@pytest.fixture(scope="session")
def pins(pytestconfig: pytest.Config) -> PinCache:
    """``pins(name) -> Pin``: the parsed pin file of ``name``, read once per session (:class:`PinCache`)."""
    from oracles.plugin.state import settings_of

    settings_of(pytestconfig)  # the session is active: the project's pin store is the one searched
    return PinCache()


@pytest.fixture(scope="session")
def verified_snapshot(pytestconfig: pytest.Config, snapshot_overrides: dict[str, Path],
                      pins: PinCache) -> Callable[[str], Path]:
    """``verified_snapshot(pin_name) -> Path``: verify the snapshot against its pin once per session.

    Every pinned file's bytes are read and hashed before any weights load; a mismatch fails every
    test that needs that pin with the file and both digests.
    """
    from oracles.errors import OracleError
    from oracles.pins.pin import snapshot_dir, verify_snapshot
    from oracles.plugin.state import emit

    done: dict[str, Path | OracleError] = {}

    def get(name: str) -> Path:
        if name not in done:
            try:
                pin = pins(name)
                root = snapshot_overrides.get(name) or snapshot_dir(pin)
                figures = verify_snapshot(pin, root, origin="--snapshot" if name in snapshot_overrides else None)
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
def engines(pytestconfig: pytest.Config, verified_snapshot: Callable[[str], Path], pins: PinCache) -> Engines:
    """``engines(engine_id, pin)``: the engine on the pin of that name, built once per session per worker
    (skipped, naming why, where it cannot run here; a failed build fails every test of the pair:
    :class:`EngineLoader`)."""
    from oracles.plugin.state import emit, settings_of

    settings = settings_of(pytestconfig)
    return EngineLoader(verified_snapshot, pytestconfig.getoption("oracle_threads"), settings.engine_kwargs,
                        lambda event, **fields: emit(pytestconfig, event, **fields), pins).get


class EngineLoader:
    """Engines by (engine id, pin name), each built at most once, as ``Class(root, pin, threads)`` with
    the verified snapshot folder and the loaded :class:`oracles.pins.pin.Pin` (from ``pins``: the
    session's :class:`PinCache`; a loader of its own when not given).

    A build that fails (an architecture the engine cannot load, a member of the engine contract missing,
    a tokenizer that disagrees with the pin's recorded ids: :func:`oracles.pins.tokenizer.canary_disagreement`)
    is remembered as one line, and every test of that (engine, pin) fails with it (no traceback) without
    loading the weights again: a pin no engine can load would otherwise cost a load and a traceback per test.
    """

    def __init__(self, verified_snapshot: Callable[[str], Path], threads: int,
                 engine_kwargs: Callable[[str], dict[str, Any]], emit: Callable[..., None],
                 pins: Callable[[str], Pin] | None = None) -> None:
        self.verified_snapshot, self.threads, self.engine_kwargs, self.emit = (verified_snapshot, threads,
                                                                               engine_kwargs, emit)
        self.pins = pins or PinCache()
        self.built: dict[tuple[str, str, tuple[tuple[str, Any], ...]], Engine | str] = {}

    def get(self, engine_id: str, pin: str, **options: Any) -> Engine:
        """The engine ``engine_id`` on the pin named ``pin``; ``options`` are constructor arguments of its
        own (the band engine: ``dtype="bfloat16"``), each set of them one more engine.

        Raises:
            pytest.skip.Exception: the engine cannot run here (its reason).
            pytest.fail.Exception: the snapshot does not verify, or the build failed (:meth:`build`'s line).
        """
        from oracles.engines import engine_class, unavailable_reason
        from oracles.pins.pin import snapshot_dir

        key = (engine_id, pin, tuple(sorted(options.items())))
        if key not in self.built:
            reason = unavailable_reason(engine_id)
            if reason:
                pytest.skip(f"engine {engine_id}: {reason}")
            cls = engine_class(engine_id)
            root = self.verified_snapshot(pin) if cls.reads_snapshot else snapshot_dir(self.pins(pin))
            self.built[key] = self.build(cls, root, self.pins(pin), **options)
        result = self.built[key]
        if isinstance(result, str):
            pytest.fail(result, pytrace=False)
        return result

    def build(self, cls: "type[Engine]", root: Path, pin: Pin, **options: Any) -> "Engine | str":
        """The engine, or the one line every test of this (engine, pin) fails with: the class leaves a
        core method abstract (:func:`oracles.engines.contract.abstract_refusal`, before anything loads),
        its construction failed, it lacks a member the contract requires
        (:func:`oracles.engines.contract.contract_refusal`), or its tokenizer disagrees with the pin's
        (:meth:`tokenizer_refusal`). What the engine returns is checked on every call from then on
        (:func:`oracles.engines.contract.install_checks`)."""
        from oracles.engines.contract import abstract_refusal, contract_refusal, install_checks
        from oracles.errors import OracleError

        cannot = f"engine {cls.id} cannot load pin {pin.name}"
        if (abstract := abstract_refusal(cls)) is not None:
            return f"{cannot}: {abstract}; tried once per run"
        start = time.perf_counter()
        try:
            engine = cls(root, pin, self.threads, **self.engine_kwargs(cls.id), **options)
        except Exception as exc:  # noqa: BLE001 - any load error, kept as one line for every test of the pair
            where = "" if isinstance(exc, OracleError) else f" (raised at {_raised_at(exc)})"
            return f"{cannot}: {_one_line(exc)}{where}; tried once per run"
        seconds = time.perf_counter() - start
        if (broken := contract_refusal(engine, pin.modality != "text")) is not None:
            return f"{cannot}: {broken}; tried once per run"
        try:
            refusal = self.tokenizer_refusal(engine, root, pin)
        except Exception as exc:  # noqa: BLE001 - the engine's own tokenizer failing, one line as above
            return (f"{cannot}: its tokenizer's encode(text, add_special_tokens=False) "
                    f"raised {_one_line(exc)} (at {_raised_at(exc)}); tried once per run")
        if refusal is not None:
            return refusal
        install_checks(engine)
        # the conversion that made the artifact is part of every verdict on it, as the runtime's settings are
        made = {"artifact_recipe": pin.recipe} if pin.recipe else {}
        self.emit("engine_loaded", name=engine.id, pin=pin.name, seconds=round(seconds, 4), **made, **engine.describe())
        return engine

    @staticmethod
    def tokenizer_refusal(engine: "Engine", root: Path, pin: Pin) -> str | None:
        """The canary check (:func:`oracles.pins.tokenizer.canary_disagreement`) where recorded token ids are
        fed to the engine: a text pin (every engine has a ``tokenizer``: the contract checks it). A vision
        pin's families tokenize through the engine's own processor at run time (Qwen3.5's transformers
        tokenizer splits the canary unlike its tokenizer.json, and nothing recorded is fed to it)."""
        from oracles.pins.tokenizer import canary_disagreement

        if pin.modality != "text":
            return None
        return canary_disagreement(engine.tokenizer, root, engine.id, pin.name)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _raised_at(exc: BaseException) -> str:
    """``file:line`` of the innermost frame that raised ``exc`` (the traceback is not printed)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    if tb is None:
        return "?"
    path = Path(tb.tb_frame.f_code.co_filename)
    return f"{'/'.join(path.parts[-2:])}:{tb.tb_lineno}"


@pytest.fixture
def engine(engines: Engines, engine_id: str, pin: str, receipt: Receipt, request: pytest.FixtureRequest) -> Engine:
    """This test's engine (the reference or a port, parameter ``engine_id``) on this test's pin; what its
    adapter translated to load the artifact is in the test's record (``translations``), so every verdict
    that needed it names it, and a failure measured on its library for this test is expected
    (:func:`_expect_known_gap`)."""
    built = engines(engine_id, pin)
    _note_translations(built, receipt)
    _expect_known_gap(built, request)
    return built


def _note_translations(built: Engine, receipt: Receipt) -> None:
    if notes := built.translation_notes():
        receipt["translations"] = list(notes)


def _expect_known_gap(built: Engine, request: pytest.FixtureRequest) -> None:
    """A failure of ``built``'s library measured for this very test (:meth:`Engine.known_gap` asked with the
    test's name and parameters, ``test_decode_vs_reference[...]``) is a strict xfail quoting the figure, so a
    fixed library fails the run and the note is removed."""
    if gap := built.known_gap(request.node.name):
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"{built.id} on {built.pin}: {gap}"))


@pytest.fixture
def reference(engines: Engines, pytestconfig: pytest.Config, pin: str) -> Engine:
    """The reference engine (``--reference``, default torch) on this test's pin."""
    from oracles.plugin.state import settings_of

    return engines(settings_of(pytestconfig).reference, pin)


@pytest.fixture
def port(engines: Engines, port_id: str, pin: str, port_pin: str, receipt: Receipt,
         request: pytest.FixtureRequest) -> Engine:
    """This test's port engine (parameter ``port_id``) on its port pin: this test's pin, or the
    ``--port-pin`` artifact paired with it (:mod:`oracles.pins.pairing`); its translations in the test's
    record and its measured gaps expected, as :func:`engine`. ``pin`` is asked for although unused here:
    the plugin parametrizes (pin, port_id, port_pin) together, so a test taking ``port`` alone must have
    all three."""
    del pin
    built = engines(port_id, port_pin)
    _note_translations(built, receipt)
    _expect_known_gap(built, request)
    return built


@pytest.fixture
def judge(engines: Engines, pytestconfig: pytest.Config, pins: PinCache, pin: str, port_pin: str,
          port: Engine) -> Judge:
    """How this port test holds the port on its port pin against the reference on its pin
    (:func:`oracles.pins.pairing.judgment_of`): exactly, or within the band of the reference run in the
    port's dtype (built on first use), naming the port's translations in every verdict."""
    from oracles.errors import PinError
    from oracles.families.execution.judged import Judge
    from oracles.pins.pairing import judgment_of
    from oracles.plugin.state import settings_of

    try:
        judgment = judgment_of(pins(pin), pins(port_pin))
    except PinError as exc:
        pytest.fail(str(exc), pytrace=False)
    reference = settings_of(pytestconfig).reference
    band = None if judgment.exact else (lambda: engines(reference, pin, dtype=judgment.dtype))
    return Judge(judgment, port.tolerance(), band, port.translation_notes())


@pytest.fixture
def pin_file(pins: PinCache, pin: str) -> Pin:
    """The parsed pin file (:class:`oracles.pins.pin.Pin`) of this test's pin, read once per session."""
    return pins(pin)


@pytest.fixture(scope="session")
def run_memo() -> RunMemo:
    """The session's :class:`oracles.plugin.memo.RunMemo` (one per worker)."""
    from oracles.plugin.memo import RunMemo

    return RunMemo()


@pytest.fixture
def runs(run_memo: RunMemo, request: pytest.FixtureRequest) -> Runs:
    """``runs(key, fn)``: ``fn()`` once per session per key, memoised (exceptions too, re-raised); in an
    xdist worker under ``--dist loadgroup``, dropped once this test's group is done (:mod:`oracles.plugin.memo`)."""
    from oracles.plugin.memo import group_of

    run_memo.enter(group_of(request.node, request.config))
    return run_memo


@pytest.fixture
def receipt(request: pytest.FixtureRequest) -> Receipt:
    """Attach JSON-safe data to this test's record in the session receipt (see :class:`Receipt`)."""
    from oracles.plugin.state import DATA_KEY, state_of
    from oracles.receipts.table import Receipt, plain_nodeid

    data: dict[str, Any] = {}
    request.node.user_properties.append((DATA_KEY, data))
    return Receipt(data, state_of(request.config).staging, plain_nodeid(request.node.nodeid))
