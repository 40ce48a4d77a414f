"""Collection: the pin/engine parametrization and what the plugin does to collected items.

``pin``, ``engine_id`` and ``port_id`` are parameters the plugin fills (session scope, so an engine is
built once per worker):

* a test taking ``engine_id`` runs on every compatible (pin, engine) pair of its family: the reference
  and each port on each pin the family runs on (``pin`` comes with it);
* a test taking ``port_id`` runs on every compatible (pin, port) pair; one taking ``port_pin`` too (the
  ``port`` fixture does) also on each ``--port-pin`` pair, the port loading the artifact pin
  (:meth:`Settings.port_triples`; id ``PIN-PORT@ARTIFACT``);
* a test taking only ``pin`` runs on each of its family's pins;
* a test of a ``builtin_pin(NAME)`` module runs on that pin alone, with each engine or port that can load it.

Then a port engine's test of a record ``--port-records`` leaves out is deselected (counted per port for
the terminal summary and the receipt), each item gets its xdist group
(:func:`oracles.plugin.groups.record_group`), slow tests without ``--runslow``
and gpu tests without an accelerator are skipped, and tests that passed in a ``--resume`` source are
skipped as carried over.

Under ``-m EXPR``, a test function taking one of those parameters that EXPR cannot select whatever
marks its parameters could add is collected once, unparametrized (:func:`unexpanded`): pytest's own
``-m`` deselects it, and no pin, engine or record is looked at for it.

Imports stay light: this module loads pytest's own modules, the families table and the groups, no
numpy, engine or receipt module (:class:`Settings` is a type here only).
"""

from __future__ import annotations

import inspect
import sys
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from _pytest.mark import MarkMatcher, ParameterSet
from _pytest.mark.expression import Expression
from _pytest.mark.structures import get_unpacked_marks

from oracles.errors import TokensMissing
from oracles.families import Family, family_of
from oracles.families.port_scope import EXECUTION_SAMPLE_TOKENS, LeftOut
from oracles.plugin.groups import record_group
from oracles.plugin.names import PARAMETERS, TOKENS_MISSING

if TYPE_CHECKING:
    from oracles.plugin.settings import Settings

PACKAGE = Path(__file__).resolve().parents[1]


def _family(metafunc: pytest.Metafunc) -> Family | None:
    return family_of({m.name for m in metafunc.definition.iter_markers()})


#: Marks a parameter set whose pin lacks the family's token ids (refused after deselection, one line).
MISSING = TOKENS_MISSING


def parametrize(metafunc: pytest.Metafunc, settings: Settings) -> None:
    """Fill ``pin``, ``engine_id`` and ``port_id`` (module docstring)."""
    names = metafunc.fixturenames
    family = _family(metafunc)
    if (own := metafunc.definition.get_closest_marker("builtin_pin")) is not None:
        _parametrize_own_pin(metafunc, settings, str(own.args[0]))
    elif "port_pin" in names and "port_id" in names:
        triples = settings.port_triples(family)
        values = [_param((p, e, a), f"{p}-{e}" if a == p else f"{p}-{e}@{a}", family, p) for p, e, a in triples]
        metafunc.parametrize(("pin", "port_id", "port_pin"), values or [_none(settings, "port", 3)], scope="session")
    elif "engine_id" in names or "port_id" in names:
        name = "engine_id" if "engine_id" in names else "port_id"
        pairs = settings.pairs(family, settings.engines if name == "engine_id" else settings.ports)
        values = [_param((p, e), f"{p}-{e}", family, p) for p, e in pairs]
        metafunc.parametrize(("pin", name), values or [_none(settings, name.removesuffix("_id"), 2)], scope="session")
    elif "pin" in names:
        pins = settings.pins_for(family)
        if metafunc.definition.get_closest_marker("dry") is not None:
            pins = one_per_tokenizer(pins)
        values = [_param((p,), p, family, p) for p in pins]
        metafunc.parametrize("pin", values or [_none(settings, "pin", 1)], scope="session")


def _parametrize_own_pin(metafunc: pytest.Metafunc, settings: Settings, pin: str) -> None:
    """A ``builtin_pin(NAME)`` module's tests run on that pin alone (``--pin`` naming others deselects them):
    each compatible engine (``engine_id``) or port (``port_id``, with ``port_pin`` the pin itself) on it, or
    the pin alone. Its records are its own, so no family token ids are asked."""
    names = metafunc.fixturenames
    if "engine_id" in names or "port_id" in names:
        name = "engine_id" if "engine_id" in names else "port_id"
        engines = [e for e in (settings.engines if name == "engine_id" else settings.ports) if settings.compatible(e, pin)]
        args = ("pin", name, "port_pin") if name == "port_id" and "port_pin" in names else ("pin", name)
        values = [pytest.param(*(pin, e, pin)[:len(args)], id=f"{pin}-{e}") for e in engines]
        none = pytest.param(*("none",) * len(args), id="none", marks=pytest.mark.skip(
            reason=f"no {name.removesuffix('_id')} engine here can load pin {pin}; see the report header"))
        metafunc.parametrize(args, values or [none], scope="session")
    elif "pin" in names:
        metafunc.parametrize("pin", [pytest.param(pin, id=pin)], scope="session")


def one_per_tokenizer(pins: list[str]) -> list[str]:
    """The first pin of each tokenizer: a dry test reads a pin's tokenizer and token ids only, and pins
    with equal tokenizer files share both (SmolLM2 and its twins), so the same check is made once."""
    from oracles.pins.pin import load_pin

    seen: dict[str, str] = {}
    for name in pins:
        seen.setdefault(load_pin(name).tokenizer_sha256, name)
    return list(seen.values())


def _param(values: tuple[str, ...], ident: str, family: Family | None, pin: str) -> Any:
    """One parameter set; marked :data:`MISSING` (with the message) when the family keeps token ids
    and has none for the pin's tokenizer."""
    marks = []
    if family is not None and family.tokens:
        from oracles.families.records import family_tokens

        try:
            reason = family_tokens(family.tokens, pin).get("unsupported")
        except TokensMissing as exc:
            marks.append(getattr(pytest.mark, MISSING)(str(exc)))
        else:
            if reason:
                marks.append(pytest.mark.skip(reason=f"family {family.name} cannot run on pin {pin}: {reason}"))
    return pytest.param(*values, id=ident, marks=marks)


def refuse_missing_tokens(items: list[pytest.Item]) -> None:
    """After deselection: a selected test whose pin lacks its family's token ids stops the session.

    Raises:
        pytest.UsageError: one line naming pin, family and the command that writes the ids.
    """
    for item in items:
        mark = item.get_closest_marker(MISSING)
        if mark is not None:
            raise pytest.UsageError(str(mark.args[0]))


def _none(settings: Settings, what: str, arity: int) -> Any:
    """The one skipped parameter set (of ``arity`` values) of a test that has nothing to run on, saying why."""
    why = {"port": f"no port engine: --port resolved to none here (reference {settings.reference})",
           "engine": "no (pin, engine) pair can run here", "pin": "no pin of this family was selected"}[what]
    return pytest.param(*("none",) * arity, marks=pytest.mark.skip(reason=f"{why}; see the report header"), id="none")


def markers_of(item: pytest.Item) -> set[str]:
    """The names of an item's markers. Not ``item.keywords``: those hold the names of its parent nodes
    too, so a checkout in a folder named ``port`` or ``d1`` would put every test in that family."""
    return {m.name for m in item.iter_markers()}


_FAMILY = pytest.StashKey["Family | None"]()


def item_family(item: pytest.Item) -> Family | None:
    """The item's family (:func:`oracles.families.family_of` of :func:`markers_of`), worked out once
    per item: the port gate, the report of its set-up and the controller's collection list all ask."""
    if _FAMILY not in item.stash:
        item.stash[_FAMILY] = family_of(markers_of(item))
    return item.stash[_FAMILY]


def _ours(item: pytest.Item) -> bool:
    """A test of the shipped suite (its module lies inside the oracles package)."""
    return Path(str(item.path)).resolve().is_relative_to(PACKAGE)


def modify_items(config: pytest.Config, items: list[pytest.Item], settings: Settings, resume: dict[str, Any],
                 resume_path: str | None) -> LeftOut:
    """Groups, port scope, slow/gpu gates, resume (module docstring). Returns what the port scope left out."""
    from oracles.receipts.table import plain_nodeid

    deselect_other_pins(config, items, settings.pins)
    left_out = deselect_out_of_scope(config, items, settings)
    skip_slow = pytest.mark.skip(reason="slow: needs --runslow (loads a model or runs a long oracle)")
    runslow, gpu_reason = config.getoption("runslow"), None
    # xdist registers the xdist_group marker; without it the mark is unknown (an error under --strict-markers)
    grouped = config.pluginmanager.has_plugin("xdist")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        group = record_group(markers_of(item), params) if grouped else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        if not (settings.enabled or _ours(item)):
            continue
        if "slow" in item.keywords and not runslow:
            item.add_marker(skip_slow)
        if "gpu" in item.keywords:
            if gpu_reason is None:
                from oracles.engines.accel import probe_accelerator

                gpu_reason = probe_accelerator() or ""
            if gpu_reason:
                item.add_marker(pytest.mark.skip(reason=f"gpu: no accelerator answered ({gpu_reason})"))
        previous = resume.get(plain_nodeid(item.nodeid))
        if previous is not None and previous.outcome == "passed":
            item.add_marker(pytest.mark.skip(reason=f"resume: passed in {resume_path}"))
    return left_out


def deselect_out_of_scope(config: pytest.Config, items: list[pytest.Item], settings: Settings) -> LeftOut:
    """Deselect (in place, reported to pytest) each port engine's test of a record ``--port-records`` leaves
    out (:func:`scoped_out`): one choice of scope, not a skip per test. Returns them counted per port."""
    left_out, gone = LeftOut(settings.port_scope.setting), []
    for item in items:
        out = scoped_out(item, getattr(getattr(item, "callspec", None), "params", {}), settings)
        if out is not None:
            left_out.add(*out)
            gone.append(item)
    if gone:
        drop = set(map(id, gone))
        items[:] = [item for item in items if id(item) not in drop]
        config.hook.pytest_deselected(items=gone)
    return left_out


def deselect_other_pins(config: pytest.Config, items: list[pytest.Item], pins: tuple[str, ...]) -> None:
    """Deselect (in place, reported to pytest) the tests marked ``builtin_pin(NAME)`` whose ``NAME`` is not
    among the ``--pin`` pins: such a module runs its own built-in pin, so a run on the user's pins leaves it
    out as it leaves out every family's default pins. Without ``--pin`` (``pins`` empty) all stay."""
    if not pins:
        return
    gone = [item for item in items if (mark := item.get_closest_marker("builtin_pin")) is not None
            and mark.args[0] not in pins]
    if gone:
        drop = set(map(id, gone))
        items[:] = [item for item in items if id(item) not in drop]
        config.hook.pytest_deselected(items=gone)


def scoped_out(item: pytest.Item, params: dict[str, Any], settings: Settings) -> tuple[str, str, int] | None:
    """``(engine, record, tokens)`` when ``item`` is a port engine's test of a record ``--port-records`` leaves
    out (the reference runs every record), else None. A record is a parameter with ``port_tokens``
    (:class:`oracles.families.port_scope.ScopedRecord`)."""
    family = item_family(item)
    if family is None or not family.port_scoped:
        return None
    engine = params.get("port_id", params.get("engine_id"))
    pin = params.get("pin")
    if engine is None or engine == settings.reference or not isinstance(pin, str):
        return None
    if item.get_closest_marker("skip") is not None:  # skipped already: the placeholder of a test with no pair
        return None
    for value in params.values():
        tokens = getattr(value, "port_tokens", None)
        if tokens is None:
            continue
        try:
            size = tokens(pin)
        except TokensMissing:
            return None  # refused after deselection (refuse_missing_tokens)
        sample = int(getattr(value, "sample_tokens", EXECUTION_SAMPLE_TOKENS))
        if not settings.port_scope.selects(size, sample):
            return engine, str(value.id), size
    return None


#: The marks this module may give a test beyond its own: :func:`_param` and :func:`_none` (``skip``,
#: :data:`MISSING`), :func:`modify_items` (``skip``, ``xdist_group``).
PLUGIN_MARKS = frozenset({"skip", MISSING, "xdist_group"})
_EXPRESSION = pytest.StashKey["tuple[str, Expression | None]"]()


class Unexpanded(pytest.Function):
    """A test function collected once, without its parameters, because ``-m`` cannot select it
    (:func:`unexpanded`); pytest's ``-m`` deselects it. Its node id is the function's (no ``[...]``)."""

    def setup(self) -> None:
        """Refuse to run: only a mark given after collection (by another plugin or a conftest) can have
        selected this item, and it has no pin, engine or record to run with.

        Raises:
            pytest.fail.Exception: one line naming the test and the ``-m`` expression.
        """
        pytest.fail(f"{self.nodeid}: not parametrized: -m {self.config.option.markexpr!r} cannot select it by the "
                    "marks it and pytest-oracles give it, but a mark added after collection did; give it that mark "
                    "in its module, or select it without -m", pytrace=False)


def unexpanded(collector: pytest.Module | pytest.Class, name: str, obj: object) -> list[pytest.Item] | None:
    """Under ``-m EXPR``: ``[Unexpanded item]`` for a test function that takes ``pin``, ``engine_id`` or
    ``port_id`` (itself or through a fixture) and that EXPR cannot select, else None (pytest collects
    it as usual, every parameter set). ``obj`` is ``collector``'s attribute ``name``.

    "Cannot select": EXPR is false for the function's own marks (its decorators, its class's and
    module's ``pytestmark``) together with any of the marks a parameter set could bring
    (``pytest.param(..., marks=...)`` in its ``parametrize`` marks or its fixtures' params) or this
    plugin add (:data:`PLUGIN_MARKS`). Such an item would be deselected whichever parameters it had, so
    the pin x engine x record product is not computed for it: ``pytest -m dry`` reports fewer
    deselected tests, and the (engine, pin) pairs left out (report header, receipt) are those of the
    tests ``-m`` may select. ``-k`` plays no part: it matches parametrized ids, which only the expansion makes.
    A function whose parameters come from elsewhere (a ``pytest_generate_tests`` in a conftest, its
    module or class, another plugin) or from an iterator is always expanded: their marks are unknown
    until then.

    Raises:
        Nothing: a function this cannot judge is left to pytest's own collection, errors and warnings.
    """
    expression = _expression(collector.config)
    func = getattr(obj, "__func__", obj)
    if expression is None or not _plain_test_function(collector, name, obj, func):
        return None
    marks = [*get_unpacked_marks(func), *collector.iter_markers()]
    free = _parametrize_marks(marks)
    if free is None or can_select(expression, marks, PLUGIN_MARKS | free) or not _known_generators(collector):
        return None
    item = Unexpanded.from_parent(collector, name=name)
    if PARAMETERS.isdisjoint(item.fixturenames):
        return None
    fixture_marks = _fixture_param_marks(item)
    if fixture_marks is None or can_select(expression, marks, PLUGIN_MARKS | free | fixture_marks):
        return None
    return [item]


#: One query of ``-m`` on a mark: its name and the keyword arguments asked, sorted.
_Query = tuple[str, tuple[tuple[str, Any], ...]]


class _Branch:
    """A matcher for ``Expression.evaluate``: ``marks`` present, the free queries in ``fixed`` as given,
    any other free query absent and noted in ``reached`` (to be branched on)."""

    def __init__(self, present: MarkMatcher, free: Collection[str], fixed: dict[_Query, bool]) -> None:
        self.present, self.free, self.fixed = present, free, fixed
        self.reached: list[_Query] = []

    def __call__(self, name: str, /, **kwargs: str | int | bool | None) -> bool:
        if self.present(name, **kwargs):
            return True
        query = (name, tuple(sorted(kwargs.items())))
        if name not in self.free or query in self.fixed:
            return self.fixed.get(query, False)
        self.reached.append(query)
        return False


def can_select(expression: Expression, marks: Iterable[pytest.Mark], free: Collection[str]) -> bool:
    """Whether ``expression`` (a compiled ``-m``) is true for an item holding ``marks`` and any of the
    marks named in ``free``, with any arguments. Each distinct query of a free name (``skip``,
    ``skip(reason="x")``) is an unknown, searched both absent and present (``not slow`` is not monotone
    in the marks), branching only on the unknowns an evaluation reaches; a mark in ``marks`` is never
    taken away. Pure.
    """
    present = MarkMatcher.from_markers(marks)
    pending: list[dict[_Query, bool]] = [{}]
    while pending:
        fixed = pending.pop()
        branch = _Branch(present, free, fixed)
        if expression.evaluate(branch):
            return True
        if branch.reached:  # that evaluation took its first unknown absent: fix it either way, go on
            first = branch.reached[0]
            pending += [{**fixed, first: False}, {**fixed, first: True}]
    return False


def _expression(config: pytest.Config) -> Expression | None:
    """The ``-m`` expression compiled once per session; None without ``-m`` or when it does not compile
    (pytest's own ``-m`` handling then refuses it, one line)."""
    raw = getattr(config.option, "markexpr", "") or ""
    cached = config.stash.get(_EXPRESSION, None)
    if cached is None or cached[0] != raw:
        try:
            compiled = Expression.compile(raw) if raw else None
        except SyntaxError:
            compiled = None
        cached = config.stash[_EXPRESSION] = (raw, compiled)
    return cached[1]


def _plain_test_function(collector: pytest.Collector, name: str, obj: object, func: object) -> bool:
    """What pytest's own ``pytest_pycollect_makeitem`` collects as one test function without a warning
    or an error of its own (it keeps those: a non-function, ``__test__ = False``, a generator)."""
    if not isinstance(collector, pytest.Module | pytest.Class) or not collector.istestfunction(obj, name):
        return False
    return inspect.isfunction(func) and bool(getattr(func, "__test__", True)) and not inspect.isgeneratorfunction(func)


def _known_generators(collector: pytest.Module | pytest.Class) -> bool:
    """Whether the only ``pytest_generate_tests`` for ``collector``'s tests are pytest's own (parametrize
    marks, fixture params) and this plugin's: no conftest, module, class or other plugin adds parameters
    (and marks with them) that are unknown before they are made."""
    module = collector.getparent(pytest.Module)
    cls = collector.getparent(pytest.Class)
    if any(hasattr(node.obj, "pytest_generate_tests") for node in (module, cls) if node is not None):
        return False
    manager = collector.config.pluginmanager
    # the plugin module itself, looked up rather than imported (it imports this module)
    known = (manager.get_plugin("python"), manager.get_plugin("funcmanage"), sys.modules.get("oracles.plugin"))
    return all(any(impl.plugin is k for k in known) for impl in collector.ihook.pytest_generate_tests.get_hookimpls())


def _param_set_marks(values: object) -> set[str] | None:
    """The mark names the parameter sets among ``values`` carry; None when ``values`` is not a
    collection (an iterator read here would be empty for pytest)."""
    if not isinstance(values, Collection):
        return None
    return {mark.name for value in values if isinstance(value, ParameterSet) for mark in value.marks}


def _parametrize_marks(marks: Iterable[pytest.Mark]) -> set[str] | None:
    """The mark names the parameter sets of the ``parametrize`` marks among ``marks`` carry (None: unknown)."""
    names: set[str] = set()
    for mark in marks:
        if mark.name != "parametrize":
            continue
        values = _param_set_marks(mark.args[1] if len(mark.args) > 1 else mark.kwargs.get("argvalues", ()))
        if values is None:
            return None
        names |= values
    return names


def _fixture_param_marks(item: pytest.Function) -> set[str] | None:
    """The mark names the params of the fixtures ``item`` uses carry (None: unknown)."""
    names: set[str] = set()
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        for definition in definitions:
            values = _param_set_marks(definition.params) if definition.params is not None else set()
            if values is None:
                return None
            names |= values
    return names
