"""The one session object: what pytest-oracles is in a pytest session once it is in use.

:meth:`OracleSession.start` is called from one place, the plugin (:mod:`oracles.plugin`): at configure
when pytest-oracles is on (the ini's ``oracles = true`` or a receipt option), when an oracles option is
given, on an xdist worker of such a run; otherwise at the first moment a test needs it (a test taking
``pin`` / ``engine_id`` / ``port_id`` is parametrized, a collected test uses one of the plugin's
fixtures or belongs to the shipped suite). A run that never needs it pays for none of this: no option
parsing (which imports the engine adapters and reads entry points), no stores, no per-test hook.

Starting parses and validates every option once (:meth:`oracles.plugin.settings.Settings.resolve`),
opens the project's stores (:class:`oracles.pins.project.Project`: pins, records, the engine registry)
and enters them for the session, makes the run state (:mod:`oracles.plugin.state`, where readers find
it), opens the partial log and the ``--resume`` source, and registers the hooks an active session
needs. Only an enabled run writes a receipt or a partial log; a session started because a test needs
the fixtures registers the per-test hooks (an engine's missing capability is a skip, a bad input one
line) and nothing else. :meth:`OracleSession.close` (at unconfigure) leaves the stores again, so a
session nested in another (pytester, in-process) changes nothing of the outer one's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from oracles.errors import OracleError
from oracles.ini import DEFAULTS, PINS_KEY, RECORDS_KEY
from oracles.pins.project import Project, ProjectDirs
from oracles.plugin import collect
from oracles.plugin.activation import ActiveHooks, DeadlineHooks
from oracles.plugin.options import check_path_words
from oracles.plugin.receipt_hooks import ReceiptHooks
from oracles.plugin.settings import Settings
from oracles.plugin.state import RunState, keep

#: pytest options under which no test body runs: a receipt would list every test as passed or not run.
NO_RUN_OPTIONS = ("collectonly", "showfixtures", "show_fixtures_per_test", "markers", "help", "version",
                  "setuponly", "setupplan")


def project_path(config: pytest.Config, key: str) -> Path:
    """An ini path option of the project (``oracles_pins``, ``oracles_records``): as pytest resolved it
    (relative to the ini file's folder), else its default beside the ini file (else the rootdir)."""
    values = config.getini(key)
    if values:
        return Path(values[0]).resolve()
    base = config.inipath.parent if config.inipath else config.rootpath
    return (base / DEFAULTS[key]).resolve()


class OracleSession:
    """pytest-oracles in one pytest session: ``settings`` (every option, parsed once; its ``project``
    holds the stores the session reads) and ``state`` (what the receipt is made of)."""

    def __init__(self, config: pytest.Config, settings: Settings, state: RunState) -> None:
        self.config, self.settings, self.state = config, settings, state

    @property
    def project(self) -> Project:
        """The stores the session reads (pins, records, the engine registry)."""
        assert self.settings.project is not None  # resolve() always sets it
        return self.settings.project

    @classmethod
    def start(cls, config: pytest.Config, enabled: bool) -> "OracleSession":
        """Parse the options, open the stores, make the state, register the hooks (module docstring).

        Raises:
            pytest.UsageError: a bad option value or two that conflict, an unreadable or mismatched
                ``--resume`` source, a receipts folder that cannot be made (one line naming the option).
        """
        opt, worker = config.option, getattr(config, "workerinput", None)
        if worker is None:  # a worker gets the controller's args, checked there
            check_path_words(list(config.invocation_params.args), Path(config.invocation_params.dir))
        dirs = ProjectDirs(project_path(config, PINS_KEY), project_path(config, RECORDS_KEY), config.inipath)
        try:
            project = Project.open(dirs)
        except OracleError as exc:  # issue 25 (wire): a malformed oracles_wire line of the ini
            raise pytest.UsageError(str(exc)) from None
        settings = Settings.resolve(opt, enabled, project)
        writes = enabled and not settings.no_receipt and not any(getattr(opt, n, False) for n in NO_RUN_OPTIONS)
        receipts_dir = settings.receipts_dir.resolve() if writes else None
        if worker is not None:
            state = _worker_state(worker.get("oracles", {}), settings, receipts_dir)
        else:
            state = RunState.new(receipts_dir, settings.receipt_tag, settings.deadline, controller=True)
            _open_receipt(config, settings, state, enabled)
        session = cls(config, settings, state)
        keep(config, state, settings)
        config.pluginmanager.register(ActiveHooks(settings, state), "oracles-active")
        if settings.deadline is not None:
            config.pluginmanager.register(DeadlineHooks(state), "oracles-deadline")
        if worker is None and (enabled or settings.deadline is not None):  # a cut run exits non-zero without a receipt too
            config.pluginmanager.register(ReceiptHooks(config, settings, state), "oracles-receipts")
        session.project.enter()
        return session

    def close(self) -> None:
        """Leave the session's stores (at unconfigure): code asking by name reads the outer run's again; the
        far sides its wire engines started are closed (issue 25: none outlives the session)."""
        self.project.engines.close()
        self.project.leave()

    # -- what the plugin's hooks delegate to ----------------------------------------------------
    def parametrize(self, metafunc: pytest.Metafunc) -> None:
        """Fill ``pin``, ``engine_id`` and ``port_id`` (:func:`oracles.plugin.collect.parametrize`)."""
        collect.parametrize(metafunc, self.settings)

    def modify_items(self, items: list[pytest.Item]) -> None:
        """xdist groups, the port scope, the slow and gpu gates, resumed passes."""
        left_out = collect.modify_items(self.config, items, self.settings, self.state.resume, self.state.resume_path)
        self.state.port_scope = left_out.to_json() if left_out.tests else {}

    def refuse_missing_tokens(self, items: list[pytest.Item]) -> None:
        """A selected test whose pin has no token ids for its family stops the run, naming the command.

        Raises:
            pytest.UsageError: one line naming pin, family and the command that writes the ids.
        """
        collect.refuse_missing_tokens(items)

    def header_lines(self) -> list[str]:
        """The receipt's path, the engines and pins."""
        import sys

        state = self.state
        off = "off (--no-receipt)" if self.settings.no_receipt else "off (this invocation runs no test)"
        where = off if state.folder is None else f"{state.folder}/{state.stem}.json"
        return [f"oracles: receipt {where}; python {sys.version.split()[0]}", self.settings.header_line()]

    def collection_lines(self) -> list[str]:
        """The (engine, pin) pairs left out of the parametrization, with reasons (never silently)."""
        return self.settings.left_out_lines()


def _worker_state(shared: dict[str, Any], settings: Settings, receipts_dir: Path | None) -> RunState:
    """An xdist worker's state: the controller's run id and start; the ``--resume`` passes it skips
    (the controller carries their records), less those the controller runs again."""
    from oracles.receipts.table import load_records

    state = RunState.new(receipts_dir, settings.receipt_tag, settings.deadline, controller=False,
                         run_id=shared.get("run_id"), started_wall=shared.get("started_wall"))
    if shared.get("resume"):
        state.resume, state.resume_path = load_records(Path(shared["resume"])), str(settings.resume)
        for nodeid in shared.get("resume_rerun", ()):
            state.resume.pop(nodeid, None)
    return state


def _open_receipt(config: pytest.Config, settings: Settings, state: RunState, enabled: bool) -> None:
    """The controller's side of an enabled run: the ``--resume`` source, the partial log, the probe.

    Raises:
        pytest.UsageError: as :func:`_open_resume`, or ``--receipts-dir: ...`` when its folder or the
            partial log cannot be created.
    """
    from oracles.receipts.environment import EnvironmentProbe
    from oracles.receipts.resume import partial_header, reference_setting

    if enabled and settings.resume is not None:
        _open_resume(state, settings)
    if state.receipts_dir is None:
        return
    try:
        state.open_partial(partial_header(reference_setting(settings.reference, settings.reference_device),
                                          settings.port, settings.pins))
    except OracleError as exc:
        raise pytest.UsageError(f"--receipts-dir: {exc}") from None
    state.environment_probe = EnvironmentProbe(config.rootpath, settings.oracle_threads)


def _open_resume(state: RunState, settings: Settings) -> None:
    """Load the ``--resume`` source and hold it to this run's setting.

    Raises:
        pytest.UsageError: ``--resume: ...`` the source cannot be read, or ``--resume PATH: ...`` it is
            of another setting (the field named).
    """
    from oracles.receipts.resume import check_resume_source, plan_carry, reference_setting
    from oracles.receipts.table import load_records

    path = settings.resume
    assert path is not None
    try:
        state.resume = load_records(path)
    except OracleError as exc:
        raise pytest.UsageError(f"--resume: {exc}") from None
    try:
        reference = reference_setting(settings.reference, settings.reference_device)
        state.resume_unchecked = check_resume_source(path, reference, settings.port, settings.pins,
                                                     settings.pin_store)
        source, not_carried = plan_carry(path, state.resume)
    except OracleError as exc:
        raise pytest.UsageError(f"--resume {path}: {exc}; resume only from a run of the same setting") from None
    for row in not_carried:  # run again rather than carry a record naming arrays the new receipt would lack
        del state.resume[row["nodeid"]]
    state.resume_arrays, state.resume_not_carried = source, not_carried
    state.resume_path = str(path)
