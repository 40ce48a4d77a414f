"""The option table of pytest-oracles: every command-line option once, with its default, its help and
the parser that turns its value into a field of :class:`oracles.plugin.settings.Settings`.

``pytest_addoption`` declares each row (:func:`add_options`); the session parses every row once, at
activation (:meth:`oracles.plugin.settings.Settings.resolve`), and refuses a bad value or a conflict
there, naming the option. Options carry primitives only, so xdist hands them to its workers as given.

Imported in every pytest run (the plugin's options exist whether or not it is in use): the parsers
import what they need (the engine registry, pin stores) only when a session is activated.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple

import pytest

if TYPE_CHECKING:
    from oracles.pins.pin import PinStore
    from oracles.pins.project import Project

#: A receipt tag is one folder name under --receipts-dir: no separator, no '.' or '..'.
TAG = re.compile(r"[A-Za-z0-9._-]+")


class Resolving(NamedTuple):
    """What a parser may read: the fields parsed before it (table order) and the run's stores."""

    fields: Mapping[str, Any]
    project: "Project"


#: ``parse(value, resolving) -> {field: typed value}``; raises pytest.UsageError naming the option.
Parser = Callable[[Any, Resolving], Mapping[str, Any]]


class Option(NamedTuple):
    """One option: ``flag`` (``--pin``), ``default`` (the typed value when not given), ``help``.

    ``action``/``type``/``choices``/``metavar``: as argparse takes them. ``enables``: a value turns
    receipts on (pytest-oracles in use even without the ini's ``oracles = true``); argparse then keeps
    None for "not given" and the default applies at activation. ``activates``: a value other than the
    default activates the session at configure (a bad value is refused before any test). ``path``: the
    value is a path (see :func:`check_path_words`). ``parse``: value -> fields (default: the value
    itself under :attr:`dest`). ``shown``: the help's default in words, where ``default`` is no value.

    A named tuple, not a dataclass: the table is built in every pytest run, and making a dataclass
    costs about a millisecond here (the off path's budget: bench/plugin_overhead.py).
    """

    flag: str
    default: Any
    help: str
    metavar: str | None = None
    action: str | None = None
    type: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    enables: bool = False
    activates: bool = True
    path: bool = False
    parse: Parser | None = None
    shown: str | None = None

    @property
    def dest(self) -> str:
        """The attribute on ``config.option``: ``--port-records`` -> ``port_records``."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def stored_default(self) -> Any:
        """What argparse stores when the option is not given (None for an :attr:`enables` option)."""
        if self.enables:
            return None
        return list(self.default) if isinstance(self.default, tuple) else self.default

    def resolve(self, value: Any, resolving: Resolving) -> Mapping[str, Any]:
        """The fields this option's ``value`` (``config.option``'s, None meaning :attr:`default`) sets.

        Raises:
            pytest.UsageError: the value is refused (one line naming the option and what is expected).
        """
        if value is None and self.enables:
            value = self.default
        return {self.dest: value} if self.parse is None else self.parse(value, resolving)


def _usage(exc: Exception, prefix: str = "") -> pytest.UsageError:
    return pytest.UsageError(f"{prefix}{exc}")


def _pins(value: str | None, r: Resolving) -> Mapping[str, Any]:
    from oracles.errors import OracleError
    from oracles.pins.pin import pin_names

    names = pin_names(value)
    try:
        for name in names:  # unknown -> PinError listing the known pins and the folders searched
            r.project.pins.load(name)
    except OracleError as exc:
        raise _usage(exc, f"--pin {value}: ") from None
    return {"pins": names}


def parse_snapshot_options(values: list[str], where: "PinStore") -> dict[str, Path]:
    """``["NAME=PATH", ...]`` from ``--snapshot`` -> {name: absolute folder}, each NAME a pin of ``where``.

    Raises:
        PinError: ``"--snapshot 'VALUE': ..."``: a value without ``=``, a NAME with no pin file (known
            pins listed), a PATH that is not an existing folder (a snapshot is the folder holding the
            pinned files), or a NAME given twice with two folders.
    """
    from oracles.errors import PinError

    out: dict[str, Path] = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise PinError(f"--snapshot {value!r}: expected NAME=PATH")
        if where.path(name) is None:
            raise PinError(f"--snapshot {value!r}: unknown pin {name!r}; known pins: {', '.join(where.names())}")
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            what = "is not a folder" if root.exists() else "does not exist"
            raise PinError(f"--snapshot {value!r}: PATH {root} of pin {name!r} {what}; expected the snapshot folder "
                           "holding the pinned files")
        if out.get(name, root) != root:
            raise PinError(f"--snapshot {value!r}: pin {name!r} has folder {out[name]} already; one folder a pin")
        out[name] = root
    return out


def _snapshots(values: list[str], r: Resolving) -> Mapping[str, Any]:
    from oracles.errors import OracleError

    try:
        return {"snapshots": parse_snapshot_options(values, r.project.pins)}
    except OracleError as exc:
        raise _usage(exc) from None


def _reference(value: str, r: Resolving) -> Mapping[str, Any]:
    known = r.project.engines.table
    if not r.project.engines.knows(value):
        raise pytest.UsageError(f"--reference {value!r}: unknown engine; known: {', '.join(sorted(known))}, "
                                "recorded:DIR")
    _recorded([value], r, "--reference")
    return {"reference": value}


def _recorded(engines: Any, r: Resolving, flag: str) -> None:
    """Refuse a ``recorded:DIR`` engine whose store cannot serve this run (its pin, settings or versions)."""
    from oracles.engines import RECORDED

    for engine in engines:
        if engine.startswith(RECORDED):
            from oracles.engines.recorded.options import recorded_refusal

            if (why := recorded_refusal(engine, r.project.pins, r.fields["pins"])) is not None:
                raise pytest.UsageError(f"{flag} {engine}: {why}")


def _record(values: list[str], r: Resolving) -> Mapping[str, Any]:
    """``--record ENGINE=DIR`` (issue 26): each engine's answers written to its store."""
    if not values:
        return {"record": {}}
    from oracles.engines.recorded.options import parse_records
    from oracles.errors import OracleError

    try:
        out = parse_records(values, [r.fields["reference"], *r.fields["ports"]], Path.cwd())
    except OracleError as exc:
        raise _usage(exc) from None
    for engine, folder in out.items():
        r.project.engines.record(engine, folder)
    return {"record": out}


def _device(value: str, r: Resolving) -> Mapping[str, Any]:
    """Refuse a device the reference engine does not run on, or that cannot answer here."""
    from oracles.errors import OracleError

    if value != "cpu":
        reference = r.fields["reference"]
        try:
            cls = r.project.engines.engine_class(reference)
        except OracleError as exc:
            raise _usage(exc, f"--reference-device {value}: ") from None
        if value not in cls.devices:
            raise pytest.UsageError(f"--reference-device {value}: engine {reference} runs on {', '.join(cls.devices)} "
                                    "only")
        if (why := cls.device_unavailable(value)) is not None:
            raise pytest.UsageError(f"--reference-device {value}: {why}")
    return {"reference_device": value}


def _placement(flag: str, needs: str) -> Parser:
    """The parser of a reference placement option (:mod:`oracles.engines.torch.placement`): refused
    unless ``--reference-device`` is ``needs`` and the reference engine takes that placement."""

    def parse(value: str | None, r: Resolving) -> Mapping[str, Any]:
        dest = flag.removeprefix("--").replace("-", "_")
        if value is None:
            return {dest: None}
        from oracles.engines.torch.placement import parse_size
        from oracles.errors import OracleError

        device, reference = r.fields["reference_device"], r.fields["reference"]
        if device != needs:
            raise pytest.UsageError(f"{flag} {value} with --reference-device {device}: {flag} places the reference on "
                                    f"{needs} ({'CPU memory, then disk' if needs == 'cpu' else 'the visible GPUs'}); "
                                    "drop one of the two")
        try:
            cls = r.project.engines.engine_class(reference)
        except OracleError as exc:
            raise _usage(exc, f"{flag} {value}: ") from None
        if dest.removeprefix("reference_") not in getattr(cls, "placements", ()):
            raise pytest.UsageError(f"{flag} {value}: reference engine {reference} places its own weights (it takes "
                                    "no accelerate placement)")
        try:
            return {dest: parse_size(value) if dest == "reference_max_memory" else value}
        except ValueError as exc:
            raise _usage(exc, f"{flag} ") from None

    return parse


def _ports(value: str, r: Resolving) -> Mapping[str, Any]:
    from oracles.errors import OracleError

    try:
        ports = r.project.engines.resolve_ports(value, r.fields["reference"])
    except OracleError as exc:
        raise _usage(exc) from None
    _recorded(ports, r, "--port")
    return {"port": value, "ports": tuple(ports)}


def _port_pins(value: str | None, r: Resolving) -> Mapping[str, Any]:
    from oracles.errors import OracleError
    from oracles.families import CONVERSION_PINS
    from oracles.pins.pairing import parse_port_pins

    try:
        return {"port_pins": parse_port_pins(value, r.project.pins, () if r.fields["pins"] else CONVERSION_PINS),
                "port_pins_given": value is not None}
    except OracleError as exc:
        raise _usage(exc) from None


def _threads(value: int, r: Resolving) -> Mapping[str, Any]:
    if value < 0:
        raise pytest.UsageError(f"--oracle-threads {value}: expected 0 (library default) or a positive count")
    return {"oracle_threads": value}


def _deadline(value: float | None, r: Resolving) -> Mapping[str, Any]:
    # inf would pass "> 0" and then break the receipt (strict JSON holds no inf); nan fails any comparison.
    if value is not None and not (math.isfinite(value) and value > 0):
        raise pytest.UsageError(f"--deadline {value:g}: expected a finite positive number of seconds")
    return {"deadline": value}


def _tag(value: str, r: Resolving) -> Mapping[str, Any]:
    if not TAG.fullmatch(value) or value in (".", ".."):
        raise pytest.UsageError(f"--receipt-tag {value!r}: expected a folder name of letters, digits, '.', '_' and "
                                "'-' (not '.' or '..'): it names one folder under --receipts-dir")
    return {"receipt_tag": value}


def _scope(value: str, r: Resolving) -> Mapping[str, Any]:
    from oracles.families.port_scope import PortScope

    try:
        return {"port_scope": PortScope.parse(value)}
    except ValueError as exc:
        raise _usage(exc) from None


def _path(name: str) -> Parser:
    return lambda value, r: {name: None if value is None else Path(value)}


OPTIONS: tuple[Option, ...] = (
    Option("--runslow", False, "run tests marked slow (model loads, long oracles)", action="store_true",
           activates=False),
    Option("--pin", None, "the pins the families run on (each where it serves the model's kind)",
           metavar="NAME[,NAME]", parse=_pins, shown="each family's own default pins"),
    Option("--receipts-dir", "receipts", "folder receipts are written under, as DIR/TAG/<UTC time>-<run id>.json "
           "(turns receipts on); write --receipts-dir=DIR when DIR exists", metavar="DIR", enables=True, path=True,
           parse=_path("receipts_dir")),
    Option("--receipt-tag", "default", "sub-folder of --receipts-dir for this run (letters, digits, '.', '_', '-'; "
           "turns receipts on)", metavar="TAG", enables=True, parse=_tag),
    Option("--no-receipt", False, "write no receipt, partial log or npz sidecar", action="store_true",
           activates=False),
    Option("--snapshot", (), "use the local snapshot folder PATH for pin NAME, verified against the pin; repeatable",
           metavar="NAME=PATH", action="append", parse=_snapshots),
    Option("--reference", "torch", "engine id of the reference; recorded:DIR replays a recording (--record)",
           metavar="ENGINE", parse=_reference),
    Option("--reference-device", "cpu", "device the reference runs on, float32 (on CUDA with TF32 off for matmul "
           "and cuDNN), recorded in the receipt", choices=("cpu", "cuda", "mps"), parse=_device),
    Option("--reference-max-memory", None, "hold at most SIZE (500MB, 2GiB) of the reference's weights in CPU memory; "
           "accelerate reads the rest from disk as each layer runs (device_map='auto', outputs bit-identical)",
           metavar="SIZE", parse=_placement("--reference-max-memory", "cpu"), shown="all in memory"),
    Option("--reference-device-map", None, "'auto': accelerate spreads the reference's layers over the visible GPUs "
           "(with --reference-device cuda)", choices=("auto",), parse=_placement("--reference-device-map", "cuda"),
           shown="one device"),
    Option("--port", "auto", "engine id(s) of ports, comma-separated (one that cannot run here is refused); 'auto' = "
           "every registered engine but the reference that can run here, 'none' = no port", metavar="ENGINE",
           parse=_ports),
    Option("--port-pin", None, "converted artifacts the ports load, each held against a reference pin: REF=ARTIFACT, "
           "or ARTIFACT alone when its pin file names its reference; comma-separated; 'none' = no artifact pairs",
           metavar="[REF=]ARTIFACT", parse=_port_pins,
           shown="the built-in conversion pins when --pin is not given, else none"),
    Option("--oracle-threads", 0, "intra-op threads for engines (torch.set_num_threads); 0 leaves the library "
           "default", metavar="N", type=int, parse=_threads),
    Option("--deadline", None, "start no new test after SECONDS from session start; the rest are listed as not run "
           "and the session exits 2 (interrupted)", metavar="SECONDS", type=float, parse=_deadline),
    Option("--port-records", "sample", "records a port engine runs (the reference runs all): 'sample' (each "
           "family's budget sample), 'all', or N = records of at most N prompt tokens (see "
           "oracles/families/port_scope.py)", metavar="SCOPE", parse=_scope),
    Option("--resume", None, "a receipt or .partial.jsonl of a run with the same schema, --reference, --port and "
           "pins: skip the tests that passed there, carrying their records (turns receipts on); write "
           "--resume=RECEIPT", metavar="RECEIPT", enables=True, path=True, parse=_path("resume")),
    Option("--record", (), "write every answer of ENGINE (the reference or a port of this run) to the "
           "recording at DIR, which --reference recorded:DIR (or --port) replays; repeatable (docs/recordings.md)",
           metavar="ENGINE=DIR", action="append", parse=_record),
)
BY_FLAG = {o.flag: o for o in OPTIONS}


def add_options(parser: pytest.Parser) -> None:
    """Declare every row of :data:`OPTIONS` in the ``oracles`` group of ``parser``."""
    group = parser.getgroup("oracles", "numerical reference oracles (pytest-oracles)")
    for o in OPTIONS:
        shown = o.shown if o.shown is not None else repr(o.default if not isinstance(o.default, tuple) else [])
        kwargs: dict[str, Any] = {"default": o.stored_default, "help": f"{o.help}; default: {shown}"}
        for key in ("metavar", "action", "type", "choices"):
            if getattr(o, key) is not None:
                kwargs[key] = getattr(o, key)
        group.addoption(o.flag, **kwargs)


def enabled_by_options(opt: Any) -> bool:
    """Whether an :attr:`Option.enables` option was given (receipts on without the ini key)."""
    return any(getattr(opt, o.dest) is not None for o in OPTIONS if o.enables)


def asked(opt: Any) -> bool:
    """Whether an :attr:`Option.activates` option was given a value other than its default."""
    return any(getattr(opt, o.dest) != o.stored_default for o in OPTIONS if o.activates and not o.enables)


def check_path_words(args: list[str], invocation_dir: Path) -> None:
    """Refuse a path option (:attr:`Option.path`) given as two words whose value is an existing path.

    pytest picks rootdir and ini file before plugins load, from every argument that names an existing
    path: ``--resume /tmp/r.json`` as two words makes /tmp/r.json a "test path" for that choice
    (rootdir /tmp, pytest.ini dropped), though the value still reaches the option.

    Raises:
        pytest.UsageError: one line naming the option, the value and the ``--option=VALUE`` form to write.
    """
    flags = {o.flag for o in OPTIONS if o.path}
    for flag, value in zip(args, args[1:]):
        if flag in flags and value and not value.startswith("-") and (invocation_dir / value).exists():
            raise pytest.UsageError(
                f"{flag} {value}: write {flag}={value}: as two words, an existing path is read by pytest as a test "
                "path when it picks the rootdir and ini file (before plugins load), which can drop pytest.ini")
