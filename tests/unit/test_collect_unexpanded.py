"""Under ``-m``, a test taking a parameter the plugin fills that the expression cannot select is collected
once, unparametrized, and deselected by pytest's own ``-m`` (:func:`oracles.plugin.collect.unexpanded`):
the selected tests are the same as with every parametrization made, a deselected test's parametrization
is never computed and its set-up never runs, and a test whose parameters could bring a selecting mark
is expanded as before.

Not ``dry``: each inner pytest session costs a second or more (the shipped suite's collection several).
"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import pytest

import oracles.plugin.collect as collect

PROJECT = """
import pytest

@pytest.fixture(scope="session")
def heavy_setup(pytestconfig):
    (pytestconfig.rootpath / "heavy-setup-ran").write_text("ran")

@pytest.mark.dry
@pytest.mark.parametrize("record", ["a", "b", "c"])
def test_light(pin, record):
    assert pin

@pytest.mark.slow
@pytest.mark.parametrize("record", ["a", "b", "c"])
def test_heavy(pin, record, heavy_setup):
    assert pin

@pytest.mark.slow
@pytest.mark.parametrize("record", ["a", pytest.param("b", marks=pytest.mark.dry)])
def test_one_record_dry(pin, record):
    assert pin

@pytest.fixture(params=["x", pytest.param("y", marks=pytest.mark.dry)])
def flavour(request):
    return request.param

@pytest.mark.slow
def test_fixture_param_dry(pin, flavour):
    assert pin

@pytest.mark.slow
@pytest.mark.parametrize("i", range(3))
def test_not_ours(i):
    pass
"""
#: A conftest whose own parametrization could carry any mark: nothing beside it is judged early.
GENERATES = """
def pytest_generate_tests(metafunc):
    if "extra" in metafunc.fixturenames:
        metafunc.parametrize("extra", [1])
"""
#: A conftest that gives a mark after collection, which no judgement at collection can foresee.
MARKS_LATER = """
import pytest

def pytest_collection_modifyitems(items):
    for item in items:
        if item.originalname == "test_heavy":
            item.add_marker(pytest.mark.dry)
"""


class Seen:
    """The selected and deselected node ids of one inner session, and its Unexpanded items."""

    def __init__(self) -> None:
        self.selected: list[str] = []
        self.deselected: list[str] = []
        self.unexpanded: list[str] = []

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected += [i.nodeid for i in items]
        self.unexpanded += [i.nodeid for i in items if isinstance(i, collect.Unexpanded)]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.selected = [i.nodeid for i in session.items]


def collect_ids(pytester: pytest.Pytester, *args: str) -> Seen:
    seen = Seen()
    result = pytester.inline_run("--collect-only", "-q", "--no-receipt", *args, plugins=[seen])
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED), result.ret
    return seen


def without_shortcut(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every test expanded, as before the shortcut (the baseline each comparison needs)."""
    monkeypatch.setattr(collect, "unexpanded", lambda collector, name, obj: None)


def both(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, *args: str) -> tuple[Seen, Seen]:
    fast = collect_ids(pytester, *args)
    with monkeypatch.context() as patch:
        without_shortcut(patch)
        full = collect_ids(pytester, *args)
    return fast, full


def test_a_deselected_test_is_collected_once_and_deselected(pytester: pytest.Pytester,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_project=PROJECT)
    fast, full = both(pytester, monkeypatch, "-m", "dry")
    assert fast.selected == full.selected  # test_light's three, the dry record, the dry fixture param
    assert fast.unexpanded == ["test_project.py::test_heavy"]  # one node, its plain name, deselected
    heavy = [n for n in full.deselected if "test_heavy" in n]
    assert len(heavy) == 3 and heavy[0].startswith("test_project.py::test_heavy[")  # the control: expanded
    assert len(full.deselected) - len(fast.deselected) == len(heavy) - 1  # the count says so


def test_a_selected_test_keeps_every_parameter_set(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ids of a test ``-m`` selects are those without the shortcut, one per pin and record; and tests
    whose parameter sets could bring the mark (a ``pytest.param``, a fixture param) are expanded."""
    pytester.makepyfile(test_project=PROJECT)
    fast, full = both(pytester, monkeypatch, "-m", "dry")
    light = [n for n in fast.selected if "test_light" in n]
    assert light == [n for n in full.selected if "test_light" in n] and len(light) == 3, light
    assert any("test_one_record_dry[" in n and n.endswith("-b]") for n in fast.selected), fast.selected
    assert any("test_fixture_param_dry[y-" in n for n in fast.selected), fast.selected
    assert not any("test_one_record_dry" in n or "test_fixture_param_dry" in n for n in fast.unexpanded)


def test_a_test_without_the_plugins_parameters_is_left_to_pytest(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_project=PROJECT)
    seen = collect_ids(pytester, "-m", "dry")
    assert [n for n in seen.deselected if "test_not_ours" in n] == [f"test_project.py::test_not_ours[{i}]" for i in range(3)]


def test_a_deselected_tests_parametrization_is_never_computed(pytester: pytest.Pytester,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``collect.parametrize`` (pins, engines, token ids) is called for what ``-m`` may select, only."""
    calls: Counter[str] = Counter()
    real = collect.parametrize

    def counting(metafunc: pytest.Metafunc, settings: Any) -> None:
        calls[metafunc.function.__name__] += 1
        real(metafunc, settings)

    monkeypatch.setattr(collect, "parametrize", counting)
    pytester.makepyfile(test_project=PROJECT)
    collect_ids(pytester, "-m", "dry")
    assert set(calls) == {"test_light", "test_one_record_dry", "test_fixture_param_dry"}, calls
    calls.clear()
    collect_ids(pytester)  # the control: without -m every one of ours is parametrized
    assert set(calls) == {"test_light", "test_heavy", "test_one_record_dry", "test_fixture_param_dry"}, calls


def test_a_deselected_tests_setup_never_runs(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_project=PROJECT)
    flag = pytester.path / "heavy-setup-ran"
    result = pytester.runpytest("-m", "dry", "--no-receipt")
    result.assert_outcomes(passed=3, skipped=2)  # the dry parameter sets of slow tests: slow gate
    assert not flag.exists()
    result = pytester.runpytest("-m", "slow and not dry", "--no-receipt", "--runslow", "-k", "heavy")
    result.assert_outcomes(passed=3)  # the control: selected, its set-up runs
    assert flag.exists()


def test_a_conftest_that_parametrizes_turns_the_shortcut_off(pytester: pytest.Pytester,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_project=PROJECT)
    pytester.makeconftest(GENERATES)
    fast, full = both(pytester, monkeypatch, "-m", "dry")
    assert fast.unexpanded == [] and fast.deselected == full.deselected


def test_a_mark_given_after_collection_fails_the_unexpanded_test(pytester: pytest.Pytester) -> None:
    """The one case no judgement at collection sees: the item, selected, refuses to set up, one line."""
    pytester.makepyfile(test_project=PROJECT)
    pytester.makeconftest(MARKS_LATER)
    flag = pytester.path / "heavy-setup-ran"
    result = pytester.runpytest("-m", "dry", "--no-receipt", "--runslow")  # no slow gate's skip before set-up
    result.assert_outcomes(passed=5, errors=1)
    result.stdout.fnmatch_lines(["*test_project.py::test_heavy: not parametrized: -m 'dry' cannot select it by the "
                                 "marks it and pytest-oracles give it, but a mark added after collection did;*"])
    assert not flag.exists()


SUITE_SELECTIONS = [
    ("-m", "dry"),
    ("-m", "not slow"),
    ("-m", "dry and mtplx"),
    ("-m", "port"),
    ("-k", "hybrid"),
    ("-m", "mtplx or port", "-k", "hybrid and not readme"),
]


@pytest.mark.parametrize("args", SUITE_SELECTIONS, ids=" ".join)
def test_the_shipped_suite_selects_the_same_tests(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch,
                                                  args: tuple[str, ...]) -> None:
    """The suite's selected node ids with and without the shortcut; ``-k`` alone never takes it. Their order
    may differ: pytest orders by session-scoped parameters (the pin) before ``-m`` deselects, and the
    deselected tests it sees are fewer."""
    fast, full = both(pytester, monkeypatch, "--pyargs", "oracles.suite", *args)
    assert sorted(fast.selected) == sorted(full.selected) and full.selected
    assert bool(fast.unexpanded) is ("-m" in args), fast.unexpanded  # the control: the shortcut was taken
    assert set(fast.deselected) <= set(full.deselected) | set(fast.unexpanded)


def test_the_plugin_adds_no_mark_beyond_those_the_shortcut_allows_for(pytester: pytest.Pytester) -> None:
    """Every mark a shipped test's item holds beyond its function's, its parents' and its parametrize
    marks' parameter sets is one of :data:`collect.PLUGIN_MARKS` (else ``-m`` on it could be misjudged)."""
    from _pytest.mark.structures import get_unpacked_marks

    added: set[str] = set()

    class Marks:
        @pytest.hookimpl(trylast=True)
        def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
            for item in items:
                assert isinstance(item, pytest.Function)
                own = [*get_unpacked_marks(item.function), *item.parent.iter_markers()] if item.parent else []
                names = {m.name for m in own} | (collect._parametrize_marks(own) or set())
                added.update(m.name for m in item.iter_markers() if m.name not in names)

    pytester.inline_run("--collect-only", "-q", "--no-receipt", "--pyargs", "oracles.suite", plugins=[Marks()])
    assert added and added <= collect.PLUGIN_MARKS, added


def test_off_under_m_imports_no_collection_module(pytester: pytest.Pytester) -> None:
    """Installed and not enabled, ``-m`` costs the plugin one option read per collected name: the
    shortcut is for a session in use, and its module is not imported."""
    pytester.makeini("[pytest]\n")
    pytester.makepyfile(test_plain="import pytest\n\n@pytest.mark.slow\ndef test_x():\n    pass\n")
    probe = ("import sys, pytest\ncode = pytest.main(['-q', '-m', 'not slow', '-p', 'no:cacheprovider', "
             "'-W', 'ignore::pytest.PytestUnknownMarkWarning'])\nprint('collect' if 'oracles.plugin.collect' in sys.modules "
             "else 'light', int(code))\n")
    result = pytester.run(sys.executable, "-c", probe)
    assert result.outlines[-1] == "light 5", result.outlines  # 5: no tests ran (all deselected)


def test_left_out_pairs_are_those_of_tests_m_may_select(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """The header's (and receipt's) "left out" pairs come from the parametrization: under ``-m port`` the
    pairs of the pins only deselected families take (the vision pin's, clef's; the DeepSeek-V4 twin's,
    cohort's; the MTP twin's, mtplx's MTP module; the LFM2-VL twin's, d1's System One module) are no longer
    reported."""
    def left_out() -> list[str]:
        result = pytester.runpytest("--pyargs", "oracles.suite", "-m", "port", "--collect-only", "-q", "--no-receipt")
        return [line for line in result.outlines if line.startswith("oracles: engine ")]

    fast = left_out()
    with monkeypatch.context() as patch:
        without_shortcut(patch)
        full = left_out()
    assert fast and set(fast) < set(full), (fast, full)
    only_deselected = ("qwen35-vl-twin", "deepseek-v4-twin", "mtp-twin", "lfm2-vl-d1-twin")
    assert all(any(pin in line for pin in only_deselected) for line in set(full) - set(fast)), full
