"""pytest hooks and options of pytest-oracles.

Installed, the plugin changes nothing in a project that did not ask for it: it registers its options,
markers and fixtures (inert until a test asks), and nothing else happens (no receipt, partial log,
environment variable or terminal section) unless the project's ini file says ``oracles = true`` or the
run passes a receipt option (``--receipts-dir``, ``--receipt-tag``, ``--resume``). The tests of the
shipped suite (``oracles.suite``) keep their slow and gpu gates either way.

What a session does once in use lives in :mod:`oracles.plugin.activation`, imported and registered only
then (:func:`oracles.plugin.activation.activate`): a run that never asks for pytest-oracles imports this
module and :mod:`oracles.families` and runs no hook per test. Imports here stay light (no numpy, no
torch, transformers or mlx): ``pytest -m dry`` must not load the heavy ones.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracles.families import FAMILIES, OTHER_MARKERS
from oracles.pins.project import DEFAULTS, PINS_KEY, RECORDS_KEY

pytest_plugins = ["oracles.plugin.fixtures"]

#: Set once a session is active (:func:`oracles.plugin.activation.activate`); ENABLED_KEY: pytest-oracles is on.
ACTIVE_KEY = pytest.StashKey[bool]()
ENABLED_KEY = pytest.StashKey[bool]()
#: The parameters the plugin fills, and the fixtures it gives: a test using one activates the session.
PARAMETERS = frozenset({"pin", "engine_id", "port_id"})
FIXTURES = frozenset({"engines", "engine", "reference", "port", "pin_file", "runs", "receipt", "verified_snapshot",
                      "snapshot_overrides"}) | PARAMETERS
PACKAGE = str(Path(__file__).resolve().parents[1])
#: The option values that mean "not asked for": any other value activates the session at configure.
DEFAULT_OPTIONS: dict[str, Any] = {"pin": None, "snapshot": [], "reference": "torch", "reference_device": "cpu", "port": "auto",
                   "oracle_threads": 0, "deadline": None, "port_records": "sample"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("oracles", "numerical reference oracles (pytest-oracles)")
    group.addoption("--runslow", action="store_true", default=False,
                    help="run tests marked slow (model loads, long oracles); default: %(default)r")
    group.addoption("--pin", default=None, metavar="NAME[,NAME]",
                    help="the pins the families run on (each where it serves the model's kind); default: each "
                         "family's own default pins")
    group.addoption("--receipts-dir", default=None, metavar="DIR",
                    help="folder receipts are written under, as DIR/TAG/<UTC time>-<run id>.json (turns receipts "
                         "on); write --receipts-dir=DIR when DIR exists; default: 'receipts'")
    group.addoption("--receipt-tag", default=None, metavar="TAG",
                    help="sub-folder of --receipts-dir for this run (letters, digits, '.', '_', '-'; turns receipts "
                         "on); default: 'default'")
    group.addoption("--no-receipt", action="store_true", default=False,
                    help="write no receipt, partial log or npz sidecar; default: %(default)r")
    group.addoption("--snapshot", action="append", default=[], metavar="NAME=PATH",
                    help="use the local snapshot folder PATH for pin NAME, verified against the pin; repeatable; "
                         "default: %(default)r")
    group.addoption("--reference", default="torch", metavar="ENGINE",
                    help="engine id of the reference; default: %(default)r")
    group.addoption("--reference-device", default="cpu", choices=("cpu", "cuda", "mps"),
                    help="device the reference runs on, float32 (on CUDA with TF32 off for matmul and cuDNN), "
                         "recorded in the receipt; default: %(default)r")
    group.addoption("--port", default="auto", metavar="ENGINE",
                    help="engine id(s) of ports, comma-separated (one that cannot run here is refused); 'auto' = every "
                         "registered engine but the reference that can run here, 'none' = no port; default: %(default)r")
    group.addoption("--oracle-threads", type=int, default=0, metavar="N",
                    help="intra-op threads for engines (torch.set_num_threads); 0 leaves the library default; "
                         "default: %(default)r")
    group.addoption("--deadline", type=float, default=None, metavar="SECONDS",
                    help="start no new test after SECONDS from session start; the rest are listed as not run and the "
                         "session exits 2 (interrupted); default: %(default)r")
    group.addoption("--port-records", default="sample", metavar="SCOPE",
                    help="records a port engine runs (the reference runs all): 'sample' (each family's budget "
                         "sample), 'all', or N = records of at most N prompt tokens (see oracles/plugin/port_scope.py); "
                         "default: %(default)r")
    group.addoption("--resume", default=None, metavar="RECEIPT",
                    help="a receipt or .partial.jsonl of a run with the same schema, --reference, --port and pins: "
                         "skip the tests that passed there, carrying their records (turns receipts on); write "
                         "--resume=RECEIPT; default: %(default)r")
    parser.addini("oracles", type="bool", default=False,
                  help="turn pytest-oracles on for this project: receipts, partial logs and the slow gate")
    parser.addini(PINS_KEY, type="paths", default=[],
                  help=f"the project's pins folder, before the built-in pins (default {DEFAULTS[PINS_KEY]})")
    parser.addini(RECORDS_KEY, type="paths", default=[],
                  help=f"the project's records folder for per-tokenizer token ids (default {DEFAULTS[RECORDS_KEY]})")


#: Our options whose value is a path. pytest picks rootdir and ini file before plugins load, from every
#: argument that names an existing path: ``--resume /tmp/r.json`` as two words makes /tmp/r.json a "test
#: path" for that choice (rootdir /tmp, pytest.ini dropped), though the value still reaches the option.
PATH_OPTIONS = ("--resume", "--receipts-dir")


def _check_path_words(args: list[str], invocation_dir: Path) -> None:
    """Refuse a path option given as two words whose value is an existing path (see :data:`PATH_OPTIONS`).

    Raises:
        pytest.UsageError: one line naming the option, the value and the ``--option=VALUE`` form to write.
    """
    for flag, value in zip(args, args[1:]):
        if flag in PATH_OPTIONS and value and not value.startswith("-") and (invocation_dir / value).exists():
            raise pytest.UsageError(
                f"{flag} {value}: write {flag}={value}: as two words, an existing path is read by pytest as a test "
                "path when it picks the rootdir and ini file (before plugins load), which can drop pytest.ini")


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _enabled(config: pytest.Config) -> bool:
    opt = config.option
    return bool(config.getini("oracles")) or any(v is not None for v in (opt.receipts_dir, opt.receipt_tag, opt.resume))


def _asked(opt: Any) -> bool:
    """An oracles option was given a value other than its default (checked at configure, not at first use)."""
    return any(getattr(opt, name) != default for name, default in DEFAULT_OPTIONS.items())


def pytest_configure(config: pytest.Config) -> None:
    for family in FAMILIES:
        config.addinivalue_line("markers", f"{family.name}: {family.help}")
    for name, text in OTHER_MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    # oracles.plugin.collect.MISSING, written out: that module is imported only once a session is active.
    config.addinivalue_line("markers", "oracles_tokens_missing(message): internal: the pin lacks the family's token ids")
    opt = config.option
    enabled = _enabled(config)
    config.stash[ENABLED_KEY] = enabled
    opt.receipts_dir = "receipts" if opt.receipts_dir is None else opt.receipts_dir
    opt.receipt_tag = "default" if opt.receipt_tag is None else opt.receipt_tag
    if not _is_worker(config):  # a worker gets the controller's args after the controller made --receipts-dir
        _check_path_words(list(config.invocation_params.args), Path(config.invocation_params.dir))
    shared = getattr(config, "workerinput", {}).get("oracles")
    if enabled or _asked(opt) or shared is not None:
        from oracles.plugin.activation import activate

        activate(config, enabled)


def _active(config: pytest.Config) -> bool:
    return config.stash.get(ACTIVE_KEY, False)


def ensure_active(config: pytest.Config) -> None:
    """Activate the session now if it is not (the first use: :mod:`oracles.plugin.activation`)."""
    from oracles.plugin.activation import activate

    activate(config, config.stash.get(ENABLED_KEY, False))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrize ``pin``, ``engine_id`` and ``port_id`` over the compatible (pin, engine) pairs."""
    if PARAMETERS.isdisjoint(metafunc.fixturenames):
        return
    from oracles.plugin import collect
    from oracles.plugin.state import settings_of

    ensure_active(metafunc.config)
    collect.parametrize(metafunc, settings_of(metafunc.config))


def pytest_pycollect_makeitem(collector: pytest.Module | pytest.Class, name: str, obj: object) -> list[pytest.Item] | None:
    """Under ``-m``, a test of ours the expression cannot select is collected unparametrized
    (:func:`oracles.plugin.collect.unexpanded`)."""
    if not (collector.config.option.markexpr and _active(collector.config)):
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
    if not _active(config):
        if not _needs_us(items):
            return
        ensure_active(config)
    from oracles.plugin import collect
    from oracles.plugin.state import settings_of, state_of

    state = state_of(config)
    collect.modify_items(config, items, settings_of(config), state.resume, state.resume_path)


@pytest.hookimpl(trylast=True, specname="pytest_collection_modifyitems")  # after -m / -k deselection
def pytest_collection_modifyitems_selected(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A selected test whose pin has no token ids for its family stops the run, naming the command."""
    if _active(config):
        from oracles.plugin import collect

        collect.refuse_missing_tokens(items)


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
    if not config.stash.get(ENABLED_KEY, False) or _is_worker(config):
        return []
    import sys

    from oracles.plugin.state import settings_of, state_of

    settings, state = settings_of(config), state_of(config)
    off = "off (--no-receipt)" if config.option.no_receipt else "off (this invocation runs no test)"
    where = off if state.folder is None else f"{state.folder}/{state.stem}.json"
    return [f"oracles: receipt {where}; python {sys.version.split()[0]}", settings.header_line()]


def pytest_report_collectionfinish(config: pytest.Config, start_path: Path, items: list[pytest.Item]) -> list[str]:
    """The (engine, pin) pairs left out of the parametrization, with reasons (never silently)."""
    if not config.stash.get(ENABLED_KEY, False):
        return []
    from oracles.plugin.state import settings_of

    return settings_of(config).left_out_lines()
