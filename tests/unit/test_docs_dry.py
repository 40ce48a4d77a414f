"""The README and docs/ name only what exists (the checker: :mod:`docs_check`), tell no history, and the
README stays a quick start."""

from __future__ import annotations

from pathlib import Path

import pytest
from docs_check import README_SECTIONS, ROOT, Facts, Findings, check_page, history_of, layout_missing, pages, read_facts

pytestmark = pytest.mark.dry


@pytest.fixture(scope="module")
def facts(pytestconfig: pytest.Config) -> Facts:
    return read_facts(pytestconfig)


@pytest.fixture(scope="module")
def findings(facts: Facts) -> Findings:
    found = Findings()
    for page in pages():
        check_page(page.read_text(encoding="utf-8"), page, facts, found)
    return found


def test_docs_name_what_exists(findings: Findings) -> None:
    assert not findings.problems, f"{len(findings.problems)} names in the docs do not exist:\n" + "\n".join(findings.problems)


def test_docs_are_read(findings: Findings, facts: Facts) -> None:
    """The check above is not vacuous: the pages exist, each kind of name was found and judged, every
    subcommand of the CLI is named by some page."""
    assert (ROOT / "docs").is_dir() and len(pages()) >= 10, pages()
    for kind, least in (("path", 30), ("subcommand", 9), ("option", 30), ("make target", 3), ("marker", 5),
                        ("module name", 10), ("link", 10)):
        assert findings.judged[kind] >= least, f"only {findings.judged[kind]} {kind}s judged: {dict(findings.judged)}"
    text = "\n".join(p.read_text(encoding="utf-8") for p in pages())
    assert not [c for c in facts.commands if f"oracles {c}" not in text], sorted(facts.commands)


def test_layout_names_every_module() -> None:
    """docs/layout.md has a line for every module of oracles/ and every package by its folder; the check
    reports a module or package it does not name (a positive control)."""
    modules = [p.relative_to(ROOT) for p in sorted((ROOT / "oracles").rglob("*.py"))]
    assert layout_missing("`oracles/a.py` **oracles/b/**", [Path("oracles/c.py"), Path("oracles/d/__init__.py"),
                                                          Path("oracles/a.py"), Path("oracles/b/__init__.py")]) == [
        "oracles/c.py", "oracles/d/__init__.py"]
    missing = layout_missing((ROOT / "docs" / "layout.md").read_text(encoding="utf-8"), modules)
    assert not missing, f"docs/layout.md names none of: {missing}"


def test_docs_tell_no_history() -> None:
    """No page tells history; the check finds each phrase (a positive control) and takes no seeded twin."""
    control = "A seeded twin.\nAs the\tseed's map.\nMeasured this\tsession.\nSlower before this\twork.\n"
    assert [line.split(":")[0] for line in history_of(control)] == ["2", "3", "4"], history_of(control)
    found = {str(p.relative_to(ROOT)): history_of(p.read_text(encoding="utf-8")) for p in pages()}
    assert not any(found.values()), {k: v for k, v in found.items() if v}


def test_readme_is_a_quick_start() -> None:
    """The README stays a page a user starts from: at most 220 lines, its sections in order."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 220, f"README.md has {len(lines)} lines; the rest belongs under docs/"
    titles = [line[3:].strip() for line in lines if line.startswith("## ")]
    assert titles == list(README_SECTIONS), titles


BAD_PAGE = """\
See `oracles/checks/no_such_module.py` and `checks/port.py`, and [the page](no_such_page.md).

```sh
oracles frobnicate receipts/x.json
oracles compare A.json B.json --no-such-option
oracles compare A.json B.json --runslow
pytest -m "port or no_such_marker" --no-such-pytest-option
make no-such-target
```

```python
from oracles.checks.tolerance import FLOAT32, NO_SUCH_BOUND
```

A lone `--no-such-lone-option`, and `oracles.checks.tolerance.NO_SUCH_NAME`, `oracles.no_such_package.x`.
"""
GOOD_PAGE = """\
See `oracles/checks/port.py`, `docs/`, `pytest.ini`, `receipts/default/x.json` and [the README](../README.md).

```sh
oracles compare A.json B.json --require-all --out=cmp.json
pytest --pyargs oracles.suite -m "port or mtplx" --runslow -n 2 --dist loadgroup --resume=receipts/r.json
make test PYTEST_ARGS="-m mtplx"
pip install --no-deps mlx-vlm==0.7.10
```

A lone `--pin NAME[,NAME]`, `oracles.checks.tolerance.FLOAT32`, `oracles.engines.base.Engine.forward`, `torch/version.py`.
"""


def test_checker_names_every_missing_thing(facts: Facts) -> None:
    """Positive control: a page naming one missing thing of each kind fails once for each, naming it; and
    a page of real names (placeholders, generated paths, other programs' options) passes."""
    found = check_page(BAD_PAGE, ROOT / "docs" / "bad.md", facts, Findings())
    text = "\n".join(found.problems)
    for name in ("oracles/checks/no_such_module.py", "checks/port.py", "no_such_page.md", "oracles frobnicate",
                 "--no-such-option", "compare --runslow", "no_such_marker", "--no-such-pytest-option",
                 "make no-such-target", "NO_SUCH_BOUND", "--no-such-lone-option", "NO_SUCH_NAME",
                 "oracles.no_such_package.x"):
        assert name in text, f"{name!r} not reported; problems:\n{text}"
    assert len(found.problems) == 13, text
    good = check_page(GOOD_PAGE, ROOT / "docs" / "good.md", facts, Findings())
    assert not good.problems, "\n".join(good.problems)
    assert good.judged["option"] >= 7 and good.judged["path"] >= 3, dict(good.judged)
