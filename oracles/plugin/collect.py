"""Collection: the pin/engine parametrization and what the plugin does to collected items.

``pin``, ``engine_id`` and ``port_id`` are parameters the plugin fills (session scope, so an engine is
built once per worker):

* a test taking ``engine_id`` runs on every compatible (pin, engine) pair of its family: the reference
  and each port on each pin the family runs on (``pin`` comes with it);
* a test taking ``port_id`` runs on every compatible (pin, port) pair;
* a test taking only ``pin`` runs on each of its family's pins.

Then each item gets its xdist group (:func:`oracles.plugin.groups.record_group`), a port engine's test of a
record ``--port-records`` leaves out is skipped naming the setting, slow tests without ``--runslow``
and gpu tests without an accelerator are skipped, and tests that passed in a ``--resume`` source are
skipped as carried over. Imports stay light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracles.errors import TokensMissing
from oracles.families import Family, family_of
from oracles.plugin.groups import record_group
from oracles.plugin.settings import Settings
from oracles.receipts.table import plain_nodeid

PACKAGE = Path(__file__).resolve().parents[1]


def _family(metafunc: pytest.Metafunc) -> Family | None:
    return family_of({m.name for m in metafunc.definition.iter_markers()})


#: Marks a parameter set whose pin lacks the family's token ids (refused after deselection, one line).
MISSING = "oracles_tokens_missing"


def parametrize(metafunc: pytest.Metafunc, settings: Settings) -> None:
    """Fill ``pin``, ``engine_id`` and ``port_id`` (module docstring)."""
    names = metafunc.fixturenames
    family = _family(metafunc)
    if "engine_id" in names or "port_id" in names:
        name = "engine_id" if "engine_id" in names else "port_id"
        pairs = settings.pairs(family, settings.engines if name == "engine_id" else settings.ports)
        values = [_param((p, e), f"{p}-{e}", family, p) for p, e in pairs]
        metafunc.parametrize(("pin", name), values or [_none(settings, name.removesuffix("_id"))], scope="session")
    elif "pin" in names:
        pins = settings.pins_for(family)
        if metafunc.definition.get_closest_marker("dry") is not None:
            pins = one_per_tokenizer(pins)
        values = [_param((p,), p, family, p) for p in pins]
        metafunc.parametrize("pin", values or [_none(settings, "pin")], scope="session")


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
            marks.append(pytest.mark.oracles_tokens_missing(str(exc)))
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


def _none(settings: Settings, what: str) -> Any:
    """The one skipped parameter set of a test that has nothing to run on, saying why."""
    why = {"port": f"no port engine: --port resolved to none here (reference {settings.reference})",
           "engine": "no (pin, engine) pair can run here", "pin": "no pin of this family was selected"}[what]
    values = ("none",) if what == "pin" else ("none", "none")
    return pytest.param(*values, marks=pytest.mark.skip(reason=f"{why}; see the report header"), id="none")


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
                 resume_path: str | None) -> None:
    """Groups, port scope, slow/gpu gates, resume (module docstring)."""
    skip_slow = pytest.mark.skip(reason="slow: needs --runslow (loads a model or runs a long oracle)")
    runslow, gpu_reason = config.getoption("runslow"), None
    # xdist registers the xdist_group marker; without it the mark is unknown (an error under --strict-markers)
    grouped = config.pluginmanager.has_plugin("xdist")
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        group = record_group(markers_of(item), params) if grouped else None
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        _gate_port(item, params, settings)
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


def _gate_port(item: pytest.Item, params: dict[str, Any], settings: Settings) -> None:
    """Skip a port engine's test of a record ``--port-records`` leaves out (the reference runs it)."""
    family = item_family(item)
    if family is None or not family.port_scoped:
        return
    engine = params.get("port_id", params.get("engine_id"))
    pin = params.get("pin")
    if engine is None or engine == settings.reference or not isinstance(pin, str):
        return
    if item.get_closest_marker("skip") is not None:  # skipped already: the placeholder of a test with no pair
        return
    for value in params.values():
        tokens = getattr(value, "port_tokens", None)
        if tokens is None:
            continue
        try:
            size = tokens(pin)
        except TokensMissing:
            return  # refused after deselection (refuse_missing_tokens)
        if not settings.port_scope.selects(size, family_sample(family)):
            item.add_marker(pytest.mark.skip(reason=settings.port_scope.skip_reason(engine, value.id, size)))


def family_sample(family: Family) -> int:
    """The sample size (prompt tokens) of a port-scoped family under ``--port-records sample``."""
    from oracles.plugin.port_scope import EXECUTION_SAMPLE_TOKENS

    return EXECUTION_SAMPLE_TOKENS
