"""The far sides a project names: its ini file's ``oracles_wire`` lines, each one an engine ``wire:NAME``.

::

    [pytest]
    oracles_wire =
        c-llama = harness/build/oracles-wire-llama       # a command: started on the suite's machine, over stdio
        c-llama.pins = smollm2-gguf-f32                  # the pins it runs on (default: every pin)
        c-llama.families = port, mtplx, cohort           # the families it runs in (default: every family)
        c-llama.same-as = llamacpp                       # an in-process engine it must equal bit for bit
        gpu-box = tcp://10.0.0.7:7070                    # a far side already listening (oracles serve --listen)
        gpu-box.timeout = 1800                           # seconds a call may take (default 600)

A command is split as a POSIX shell would split it (``shlex``), never run through a shell, and started in
the ini file's folder; ``tcp://HOST:PORT`` connects instead. Pure: the standard library only.
"""

from __future__ import annotations

import shlex
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

from oracles.errors import OracleError
from oracles.ini import ini_options

#: The ini key.
KEY = "oracles_wire"
#: The engine id prefix.
PREFIX = "wire:"
#: Seconds a call may take unless the line says (a served reference's 64-token generation on SmolLM2
#: takes ~10 s on this machine's CPU; a 4,096-token prefill of a 7B model on a CPU, minutes).
TIMEOUT = 600.0
#: The settings a NAME.KEY line may give.
SETTINGS = ("pins", "families", "timeout", "same-as", "hello-timeout")


@dataclass(frozen=True)
class Target:
    """One far side: ``name`` (the engine is ``wire:NAME``), ``address`` (a command line or
    ``tcp://HOST:PORT``), ``base`` (the folder a command starts in), ``pins`` (the only pins it runs on;
    empty: any), ``families`` (the only families it runs in; empty: all), ``timeout`` (seconds per call),
    ``hello_timeout`` (seconds for the handshake, which loads the model), ``same_as`` (the in-process engine
    id it is held to bit for bit), ``origin`` (where the line was written)."""

    name: str
    address: str
    base: Path
    pins: tuple[str, ...] = ()
    families: tuple[str, ...] = ()
    timeout: float = TIMEOUT
    hello_timeout: float = TIMEOUT
    same_as: str | None = None
    origin: str = ""

    @property
    def engine_id(self) -> str:
        return PREFIX + self.name

    @property
    def tcp(self) -> tuple[str, int] | None:
        """(host, port) of a ``tcp://`` address, else None."""
        if not self.address.startswith("tcp://"):
            return None
        host, _, port = self.address.removeprefix("tcp://").rpartition(":")
        return host.strip("[]"), int(port)

    def argv(self) -> list[str]:
        """The command's words, its program resolved against :attr:`base` when it is a relative path."""
        words = shlex.split(self.address)
        if words and "/" in words[0] and not Path(words[0]).is_absolute():
            words[0] = str(self.base / words[0])
        return words

    def unavailable_reason(self) -> str | None:
        """Why this far side cannot be reached here: a command whose program does not exist (or is not
        executable), or a host that refuses a connection within 2 s; else None."""
        if (hostport := self.tcp) is not None:
            try:
                socket.create_connection(hostport, timeout=2.0).close()
            except OSError as exc:
                return f"{self.origin}: nothing accepts a connection at {self.address}: {exc.strerror or exc}"
            return None
        program = self.argv()[0]
        if shutil.which(program) is None:
            hint = " (build it: make -C harness)" if "harness" in program else ""
            return f"{self.origin}: command {program} is not an executable file here{hint}"
        return None


def parse_lines(lines: list[str], base: Path, origin: str) -> dict[str, Target]:
    """``wire:NAME`` -> :class:`Target` from the ``oracles_wire`` lines (module docstring).

    Raises:
        OracleError: a line without ``=``, a bad NAME, an unknown setting, a setting of an undeclared NAME,
            a bad number or ``tcp://`` address (``origin`` and the line named).
    """
    found: dict[str, dict[str, str]] = {}
    order: list[str] = []
    for raw in lines:
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        key, sep, value = line.partition("=")
        key, value = key.strip(), value.strip()
        name, _, setting = key.partition(".")
        if not sep or not name or not value or not all(c.isalnum() or c in "-_" for c in name):
            raise OracleError(f"{origin}: {KEY} line {raw.strip()!r}: expected NAME = COMMAND, NAME = tcp://HOST:PORT "
                              f"or NAME.SETTING = VALUE (NAME of letters, digits, '-', '_')")
        if setting and setting not in SETTINGS:
            raise OracleError(f"{origin}: {KEY} line {raw.strip()!r}: unknown setting {setting!r}; known: "
                              f"{', '.join(SETTINGS)}")
        if name not in found:
            found[name], order = {}, [*order, name]
        found[name][setting or "address"] = value
    return {PREFIX + name: _target(name, found[name], base, origin) for name in order}


def _target(name: str, given: dict[str, str], base: Path, origin: str) -> Target:
    where = f"{origin}: {KEY} {name}"
    if "address" not in given:
        raise OracleError(f"{where}: settings without a line {name} = COMMAND or {name} = tcp://HOST:PORT")
    try:
        timeout = float(given.get("timeout", TIMEOUT))
        hello = float(given.get("hello-timeout", given.get("timeout", TIMEOUT)))
    except ValueError:
        raise OracleError(f"{where}.timeout: {given.get('timeout')!r} is not a number of seconds") from None
    if not (timeout > 0 and hello > 0):
        raise OracleError(f"{where}.timeout: expected a positive number of seconds")
    pins = tuple(p.strip() for p in given.get("pins", "").split(",") if p.strip())
    families = tuple(f.strip() for f in given.get("families", "").split(",") if f.strip())
    target = Target(name, given["address"], base, pins, families, timeout, hello, given.get("same-as"), origin)
    if target.address.startswith("tcp://"):
        host, _, port = target.address.removeprefix("tcp://").rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise OracleError(f"{where}: {target.address!r} is not tcp://HOST:PORT")
    elif not shlex.split(target.address):
        raise OracleError(f"{where}: empty command")
    return target


def read_ini(ini: Path | None) -> dict[str, Target]:
    """The targets an ini file's ``oracles_wire`` names (none without an ini file or the key).

    Raises:
        OracleError: as :func:`parse_lines`.
    """
    if ini is None:
        return {}
    if ini.name == "pyproject.toml":  # a TOML list of lines, or one string of them
        import tomllib

        table = tomllib.loads(ini.read_text(encoding="utf-8")).get("tool", {}).get("pytest", {}).get("ini_options", {})
        value = table.get(KEY) if isinstance(table, dict) else None
        lines = [str(v) for v in value] if isinstance(value, list) else str(value or "").splitlines()
    else:
        lines = str((ini_options(ini) or {}).get(KEY) or "").splitlines()
    return parse_lines(lines, ini.parent, str(ini))
