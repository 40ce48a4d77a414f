"""One conversation with a far side: a request, then its response, per call; time-outs, size limits, and
every failure as one line naming engine, call and field, with the far side's last stderr lines.

A failure that leaves the stream in an unknown state (the far side exited, closed the stream mid-answer,
passed the call's time-out, or wrote something that is not a frame) ends the conversation: the far side
is killed, and every later call fails at once naming the call it died in, so a session goes on test by
test. A response that is a well-formed frame but a wrong answer (a shape, a dtype, a missing field) fails
its call only. The far side's own refusals come back as :class:`FarError` (the client raises them as the
engine's ``Unsupported``, ``ValueError`` or an error naming the call).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np

from oracles.engines.wire.frame import Frame, FrameError, Limits, encode, read_frame
from oracles.engines.wire.transport import Transport, TransportError
from oracles.errors import OracleError

#: stderr lines quoted in a failure's line.
QUOTED = 4


class WireError(OracleError):
    """A call over the wire failed: one line naming engine, call and field (where there is one), then the
    far side's last stderr lines."""


class FarError(OracleError):
    """The far side answered a call with an error: ``kind`` (``unsupported``, ``context``, ``value``,
    ``error``, ``bad_request``) and its fields (``capability``, ``why``, ``message``, ``type``, ``field``)."""

    def __init__(self, call: str, error: dict[str, Any]) -> None:
        self.call, self.kind = call, str(error.get("kind", "error"))
        self.capability, self.why = str(error.get("capability", call)), str(error.get("why", ""))
        self.message = str(error.get("message", self.why))
        super().__init__(self.message)


class Channel:
    """Requests to one far side over ``transport``, answered in order.

    ``engine`` names the engine in every message; ``timeout`` is each call's seconds (the handshake may
    take its own); ``limits`` bound what is read back.
    """

    def __init__(self, transport: Transport, engine: str, timeout: float, limits: Limits | None = None) -> None:
        self.transport, self.engine, self.timeout = transport, engine, timeout
        self.limits = limits or Limits()
        self.next_id = 1
        self.gone: str | None = None
        self.released: list[int] = []
        self.calls = 0

    def release(self, handle: int) -> None:
        """Tell the far side, with the next request, that ``handle`` is no longer used (safe in a finalizer)."""
        if self.gone is None:
            self.released.append(handle)

    def call(self, name: str, args: dict[str, Any], arrays: Sequence[np.ndarray] = (),
             timeout: float | None = None) -> Frame:
        """Send call ``name`` and read its response (``result`` in its header, arrays beside).

        Raises:
            WireError: the far side is gone (since which call), or this call failed on the stream (the far
                side exited, closed mid-answer, passed the time-out, answered something that is not a frame or
                an answer to another request): the far side is killed.
            FarError: the far side answered with an error.
        """
        if self.gone is not None:
            raise WireError(f"engine {self.engine} {name}(): the far side is gone since {self.gone}")
        request_id, self.next_id = self.next_id, self.next_id + 1
        header: dict[str, Any] = {"id": request_id, "call": name, "args": args}
        if self.released:
            header["free"], self.released = self.released, []
        seconds = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + seconds
        try:
            chunks = encode(header, arrays)
        except FrameError as exc:
            raise WireError(f"engine {self.engine} {name}(): the request cannot be written: {exc}") from None
        try:
            self.transport.send(chunks, deadline)
            frame = read_frame(lambda buf, what: self.transport.recv_into(buf, deadline, what), self.limits)
        except TransportError as exc:
            late = "time-out" in str(exc)
            raise self._die(name, f"{exc}{f' ({seconds:g} s)' if late else ''}") from None
        except FrameError as exc:
            raise self._die(name, f"the answer is not a frame: {exc}") from None
        except BaseException:  # a test's time-out or Ctrl-C mid-frame: the stream is out of step
            self._die(name, "interrupted mid-call (a test's time-out, or Ctrl-C)")
            raise
        self.calls += 1
        if frame.header.get("id") != request_id:
            raise self._die(name, f"field id: the answer is to request {frame.header.get('id')!r}, not {request_id}")
        if "error" in frame.header:
            error = frame.header["error"]
            raise FarError(name, error if isinstance(error, dict) else {"message": str(error)})
        if "result" not in frame.header:
            raise self.failure(name, "field result: missing from the answer")
        return frame

    def failure(self, call: str, problem: str) -> WireError:
        """The one-line error of a wrong answer to ``call``, with the far side's last stderr lines."""
        return WireError(f"engine {self.engine} {call}(): {problem}{self.tail_note()}")

    def tail_note(self) -> str:
        """``"; last stderr: 'a' | 'b'"`` (the far side's last :data:`QUOTED` lines), or ``""``."""
        lines = self.transport.stderr_tail()[-QUOTED:]
        return "; last stderr: " + " | ".join(repr(line) for line in lines) if lines else ""

    def _die(self, call: str, problem: str) -> WireError:
        """Kill the far side (its stream is out of step) and the error of ``call``."""
        kill = getattr(self.transport, "kill", None)
        if kill is not None:
            kill()
        error = self.failure(call, problem)
        self.gone = f"{call}() (call {self.calls + 1}): {problem}"
        self.transport.close()
        return error

    def close(self) -> None:
        """End the conversation (EOF to the far side, which exits)."""
        if self.gone is None:
            self.gone = "the engine was closed"
        self.transport.close()
