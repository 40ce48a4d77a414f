"""What a project adds through the hooks of :mod:`oracles.plugin.hookspecs`: families at configure,
receipt fields when the receipt is built. Each plugin's implementation is called on its own, so what
it gives is held to the rules under its own name (a conftest.py by its path from the rootdir).

Imported at configure only when some plugin implements ``pytest_oracles_families``, and with the
receipt.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import oracles.families as families
from oracles.families import Family


def each_plugin(config: pytest.Config, hook_name: str) -> list[tuple[str, Any]]:
    """``(plugin label, result)`` of each plugin's implementation of hook ``hook_name``, called with the
    arguments it names from ``{"config": config}`` (wrappers left out), in pytest's call order."""
    out = []
    for impl in reversed(getattr(config.hook, hook_name).get_hookimpls()):  # pluggy calls the last registered first
        if impl.hookwrapper or getattr(impl, "wrapper", False):
            continue
        out.append((plugin_label(config, impl.plugin_name), impl.function(**{a: config for a in impl.argnames})))
    return out


def plugin_label(config: pytest.Config, name: str) -> str:
    """A plugin's registered name; a conftest (registered by its file path) as the path from the rootdir."""
    path = Path(name)
    if path.is_absolute() and path.is_relative_to(config.rootpath):
        return str(path.relative_to(config.rootpath))
    return name


def add_families(config: pytest.Config) -> tuple[Family, ...]:
    """Append the families plugins give (``pytest_oracles_families``) to ``oracles.families.FAMILIES``,
    ``BY_NAME`` and ``TOKENIZED``, after the built-in ones; returns those added (for
    :func:`remove_families`).

    Raises:
        pytest.UsageError: a plugin gave something other than a sequence of Family, or a family whose
            name is taken (by a built-in family or another plugin's), naming plugin and family.
    """
    added: list[Family] = []
    owner = {f.name: "pytest-oracles" for f in families.FAMILIES}
    for label, result in each_plugin(config, "pytest_oracles_families"):
        for family in _given(result, label):
            if family.name in owner:
                raise pytest.UsageError(f"pytest_oracles_families of {label}: family {family.name!r} is taken (by "
                                        f"{owner[family.name]}); give it another name")
            if not family.name.isidentifier():
                raise pytest.UsageError(f"pytest_oracles_families of {label}: family name {family.name!r} is not a "
                                        "marker name (letters, digits, '_')")
            owner[family.name] = label
            added.append(family)
    _set(families.FAMILIES + tuple(added))
    return tuple(added)


def remove_families(added: tuple[Family, ...]) -> None:
    """Take the families :func:`add_families` added out again (the session ends)."""
    _set(tuple(f for f in families.FAMILIES if not any(f is a for a in added)))


def _given(result: Any, label: str) -> list[Family]:
    """The families one plugin returned (None: none).

    Raises:
        pytest.UsageError: not a sequence of Family (plugin and what it returned named).
    """
    if result is None:
        return []
    given = list(result) if isinstance(result, (list, tuple)) else None
    if given is None or not all(isinstance(f, Family) for f in given):
        what = type(result).__name__ if given is None else next(type(f).__name__ for f in given if not isinstance(f, Family))
        raise pytest.UsageError(f"pytest_oracles_families of {label}: expected a list of oracles.families.Family, got "
                                f"a {what}")
    return given


def _set(listed: tuple[Family, ...]) -> None:
    """Make ``listed`` the families, and the tables derived from them agree."""
    families.FAMILIES = listed
    families.BY_NAME.clear()
    families.BY_NAME.update({f.name: f for f in listed})
    families.TOKENIZED = tuple(dict.fromkeys(f.tokens for f in listed if f.tokens))


def project_fields(config: pytest.Config) -> dict[str, dict[str, Any]]:
    """What each plugin's ``pytest_oracles_receipt_fields(config)`` returns, under its label, each held
    to the receipt's JSON rules.

    Raises:
        TypeError: a plugin returned something other than a dict or None, or a value strict JSON
            cannot hold (plugin and key named).
    """
    from oracles.receipts.schema import check_plugin_fields

    out: dict[str, dict[str, Any]] = {}
    for label, value in each_plugin(config, "pytest_oracles_receipt_fields"):
        fields = check_plugin_fields(label, value)
        if fields is not None:
            out[label] = fields
    return dict(sorted(out.items()))
