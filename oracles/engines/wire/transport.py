"""The wire's transports: a subprocess's stdin/stdout (the suite starts and stops it) and a TCP connection.

Both are byte streams read and written through file descriptors with a deadline (``select``), so a far
side that stops answering, or stops reading, costs at most the call's time-out; every failure is a
:class:`TransportError` in one line, which the channel (:mod:`oracles.engines.wire.channel`) turns into a
line naming engine and call with the far side's last stderr lines.

A subprocess is started in a session of its own (a Ctrl-C in the terminal reaches the suite, which
closes it) and, on Linux, under ``setpriv --pdeathsig KILL``, so the kernel kills it when the process
that started it dies however it dies (an xdist worker killed, a crash); every live one is also closed at
interpreter exit, and when the registry that started it closes (a test session's end). Closing sends
EOF on its stdin (the protocol's "exit now"), waits :data:`GRACE` seconds, then kills its process group.
Its stderr is read by a thread that keeps the last :data:`TAIL` lines (so a chatty far side never blocks on a
full pipe); quoting the tail first drains the pipe itself, so a line the far side wrote before its answer is
always in the failure that answer causes, however late the thread is scheduled.
"""

from __future__ import annotations

import atexit
import collections
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

from oracles.errors import OracleError

#: Lines of a far side's stderr kept for error messages.
TAIL = 12
#: Seconds a far side has to exit after EOF on its stdin before it is killed.
GRACE = 2.0
#: Every transport not yet closed, and the object that owns it (a registry: :func:`close_owned`).
_LIVE: dict["Transport", object] = {}


class TransportError(OracleError):
    """The stream failed: the far side exited or closed it, a deadline passed, or the OS refused."""


class Transport:
    """A byte stream with deadlines over one file descriptor pair. Subclasses open it."""

    read_fd: int
    write_fd: int
    what: str

    def __init__(self, owner: object = None) -> None:
        self.closed = False
        _LIVE[self] = owner

    def send(self, chunks: Sequence[bytes | memoryview], deadline: float) -> None:
        """Write every chunk before ``deadline`` (``time.monotonic()`` seconds).

        Raises:
            TransportError: the far side stopped reading past the deadline, or closed the stream.
        """
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:
                self._wait(self.write_fd, deadline, "the request", writable=True)
                try:
                    n = os.write(self.write_fd, view)
                except BlockingIOError:
                    continue
                except OSError as exc:  # EPIPE: the far side is gone
                    raise TransportError(f"{self.what}: write failed: {exc.strerror or exc}") from None
                view = view[n:]

    def recv_into(self, buf: memoryview, deadline: float, what: str) -> None:
        """Fill ``buf`` before ``deadline``.

        Raises:
            TransportError: end of stream (after how many of the bytes expected), or the deadline passed.
        """
        got = 0
        while got < len(buf):
            self._wait(self.read_fd, deadline, what)
            try:
                n = os.readv(self.read_fd, [buf[got:]])
            except BlockingIOError:
                continue
            except OSError as exc:
                raise TransportError(f"{self.what}: read failed: {exc.strerror or exc}") from None
            if n == 0:
                raise TransportError(f"{self.what}: the stream ended after {got} of the {len(buf)} bytes of {what}"
                                     f"{self.exit_note()}")
            got += n

    def _wait(self, fd: int, deadline: float, what: str, writable: bool = False) -> None:
        """Block until ``fd`` is ready (``poll``: no FD_SETSIZE limit) or ``deadline`` passes.

        Raises:
            TransportError: the deadline passed first.
        """
        poller = select.poll()
        poller.register(fd, select.POLLOUT if writable else select.POLLIN)
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(left * 1000):
            if writable:
                raise TransportError(f"{self.what}: the request could not be written within the time-out (the far "
                                     "side stopped reading)")
            raise TransportError(f"{self.what}: {what} did not arrive within the time-out")

    def exit_note(self) -> str:
        """``" (the process exited with status N)"`` where that is known, else ``""``."""
        return ""

    def stderr_tail(self) -> list[str]:
        """The far side's last stderr lines (none for a connection)."""
        return []

    def close(self) -> None:
        """Close the stream (idempotent)."""
        self.closed = True
        _LIVE.pop(self, None)


class Subprocess(Transport):
    """A far side started as ``argv`` in ``cwd``, speaking on its stdin and stdout.

    Raises (from ``__init__``):
        TransportError: the command cannot be started (not found, not executable).
    """

    def __init__(self, argv: Sequence[str], cwd: Path | None = None, env: dict[str, str] | None = None,
                 owner: object = None) -> None:
        self.what = f"harness {' '.join(argv)!r}"
        self.argv = list(argv)
        self.tail: collections.deque[str] = collections.deque(maxlen=TAIL)
        wrapped = list(argv)
        if sys.platform.startswith("linux") and (setpriv := shutil.which("setpriv")):
            wrapped = [setpriv, "--pdeathsig", "KILL", "--", *wrapped]
        try:
            self.proc = subprocess.Popen(wrapped, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         cwd=cwd, env=env, start_new_session=True, bufsize=0)
        except OSError as exc:
            raise TransportError(f"{self.what}: cannot be started: {exc.strerror or exc}") from None
        super().__init__(owner)
        assert self.proc.stdin is not None and self.proc.stdout is not None and self.proc.stderr is not None
        self.read_fd, self.write_fd = self.proc.stdout.fileno(), self.proc.stdin.fileno()
        os.set_blocking(self.write_fd, False)
        self._err_fd = self.proc.stderr.fileno()
        os.set_blocking(self._err_fd, False)
        self._partial = b""
        self._err_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True, name=f"wire-stderr-{self.proc.pid}")
        self._reader.start()

    @property
    def pid(self) -> int:
        return int(self.proc.pid)

    def _read_stderr(self) -> None:
        """The thread: wait for stderr bytes, take them, until EOF."""
        poller = select.poll()
        poller.register(self._err_fd, select.POLLIN | select.POLLHUP)
        while True:
            try:
                poller.poll()
            except (OSError, ValueError):
                return
            if not self._drain():
                return

    def _drain(self) -> bool:
        """Take every stderr byte in the pipe now into :attr:`tail`; False at EOF or once the pipe is closed."""
        with self._err_lock:
            while True:
                try:
                    chunk = os.read(self._err_fd, 65536)
                except BlockingIOError:
                    return True
                except (OSError, ValueError):
                    chunk = b""
                if not chunk:
                    self._line(self._partial)
                    self._partial = b""
                    return False
                *lines, self._partial = (self._partial + chunk).split(b"\n")
                for line in lines:
                    self._line(line)

    def _line(self, raw: bytes) -> None:
        if raw:
            self.tail.append(raw.decode("utf-8", "replace").rstrip())

    def exit_note(self) -> str:
        try:
            code = self.proc.wait(timeout=0.5)
        except subprocess.TimeoutExpired:
            return ""
        how = f"killed by signal {-code}" if code < 0 else f"exited with status {code}"
        return f" (the process {how})"

    def stderr_tail(self) -> list[str]:
        if self.proc.poll() is not None:
            self._reader.join(timeout=0.2)
        self._drain()
        return [line for line in self.tail if line]

    def close(self) -> None:
        """EOF on its stdin, :data:`GRACE` seconds to exit, then its process group killed; reaped."""
        if self.closed:
            return
        super().close()
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close() if stream is not None else None
            except OSError:
                pass
        try:
            self.proc.wait(timeout=GRACE)
        except subprocess.TimeoutExpired:
            self.kill()
        self._reader.join(timeout=1.0)

    def kill(self) -> None:
        """SIGKILL its process group now (a far side past its time-out cannot be asked), and reap it."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


class Tcp(Transport):
    """A connection to a far side listening at ``host:port`` (``oracles serve --listen``, a harness on
    another machine, a phone behind ``adb forward``).

    Raises (from ``__init__``):
        TransportError: the connection is refused or not made within ``timeout`` seconds.
    """

    def __init__(self, host: str, port: int, timeout: float, owner: object = None) -> None:
        self.what = f"far side at {host}:{port}"
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise TransportError(f"{self.what}: cannot connect: {exc.strerror or exc}") from None
        super().__init__(owner)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock.setblocking(False)
        self.read_fd = self.write_fd = self.sock.fileno()

    def kill(self) -> None:
        self.close()

    def close(self) -> None:
        if self.closed:
            return
        super().close()
        try:
            self.sock.close()
        except OSError:
            pass


def close_owned(owner: object) -> int:
    """Close every transport ``owner`` opened (a registry at its session's end); returns how many."""
    mine = [t for t, o in list(_LIVE.items()) if o is owner]
    for t in mine:
        t.close()
    return len(mine)


@atexit.register
def close_all() -> None:
    """Close every live transport (at interpreter exit: no far side started here outlives it)."""
    for t in list(_LIVE):
        t.close()
