"""The far side in Python: one built :class:`oracles.engines.base.Engine` answering the wire (``oracles serve``).

A :class:`Server` answers one conversation: the handshake (``hello``: the protocol version, the pin it
serves, which must be the client's, the model facts and the calls), then each call of the table
(:data:`oracles.engines.wire.calls.CALLS`) by calling the engine's own method with the decoded arguments.
Caches and snapshots stay here under integer handles, dropped when the client releases them or the
conversation ends. The engine's refusals go back as errors of their kind (``Unsupported``, a context too
short, a ``ValueError``), anything else it raises as ``error`` with its type and first line; the server
goes on to the next request. The conversation ends at EOF.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any, Callable

import numpy as np

from oracles.engines.base import ContextTooShort, Engine, Unsupported
from oracles.engines.wire.calls import CALLS, HELLO
from oracles.engines.wire.codec import Arrays, FieldError, decode_value, encode_value
from oracles.engines.wire.frame import PROTOCOL, Frame, FrameError, Limits, encode, read_frame

#: Keyword arguments a tokenizer call adds (the wire carries ids, never a dict).
TOKENIZER_EXTRA = {"apply_chat_template": {"tokenize": True, "return_dict": False}}


class Server:
    """Answers for ``engine`` (built on its pin, :attr:`oracles.engines.base.Engine.pin_file`)."""

    def __init__(self, engine: Engine, limits: Limits | None = None) -> None:
        self.engine, self.limits = engine, limits or Limits()
        self.handles: dict[int, Any] = {}
        self.next_handle = 1

    # -- the handshake --------------------------------------------------------------------------------
    def calls(self) -> list[str]:
        """Every call of the table, less the tokenizer members this engine's tokenizer lacks."""
        tok = self.engine.tokenizer
        return [c for c in CALLS if not c.startswith("tokenizer.") or hasattr(tok, c.split(".", 1)[1])]

    def facts(self) -> dict[str, Any]:
        """The model facts the client sets as the engine's members."""
        e = self.engine
        template = getattr(e.tokenizer, "chat_template", None)
        return {"vocab_size": int(e.vocab_size), "hidden_size": int(e.hidden_size), "num_layers": int(e.num_layers),
                "max_context": int(e.max_context), "eos_token_ids": sorted(int(i) for i in e.eos_token_ids),
                "chat_template": template if isinstance(template, str) else None}

    def hello(self, args: Any) -> dict[str, Any]:
        """The handshake's answer.

        Raises:
            FieldError: another protocol version, or a pin other than the one served (name or digest).
        """
        if not isinstance(args, dict) or args.get("protocol") != PROTOCOL:
            got = args.get("protocol") if isinstance(args, dict) else args
            raise FieldError("args.protocol", f"{got!r}; this server speaks protocol {PROTOCOL}")
        pin, mine = args.get("pin") or {}, self.engine.pin_file
        if isinstance(pin, dict) and (pin.get("name"), pin.get("digest")) != (mine.name, mine.digest):
            raise FieldError("args.pin", f"the client asks for pin {pin.get('name')!r} (digest {pin.get('digest')}); "
                                         f"this server serves {mine.name!r} (digest {mine.digest})")
        return {"protocol": PROTOCOL, "server": f"oracles serve ({type(self.engine).__module__})",
                "engine": self.engine.id, "calls": self.calls(), "facts": self.facts()}

    # -- one request ----------------------------------------------------------------------------------
    def answer(self, frame: Frame) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The response (header, arrays) to one request frame; never raises for what the engine raises."""
        header = frame.header
        request_id, name = header.get("id"), header.get("call")
        for number in header.get("free") or ():
            self.handles.pop(number, None) if isinstance(number, int) else None
        try:
            if name == HELLO:
                return {"id": request_id, "result": self.hello(header.get("args"))}, []
            if name not in CALLS:
                return {"id": request_id, "error": {"kind": "unsupported", "capability": f"answer call {name!r}",
                                                    "why": "not a call of the wire's table"}}, []
            out = Arrays()
            result = self._dispatch(str(name), header.get("args"), frame.arrays)
            return {"id": request_id, "result": encode_value(CALLS[str(name)].result, result, out, self._new)}, out.items
        except FieldError as exc:
            return {"id": request_id, "error": {"kind": "bad_request", "field": exc.field, "message": str(exc)}}, []
        except ContextTooShort as exc:
            return {"id": request_id, "error": {"kind": "context", "capability": exc.capability, "why": exc.why}}, []
        except Unsupported as exc:
            return {"id": request_id, "error": {"kind": "unsupported", "capability": exc.capability, "why": exc.why}}, []
        except ValueError as exc:
            return {"id": request_id, "error": {"kind": "value", "message": str(exc)}}, []
        except Exception as exc:  # noqa: BLE001 - the engine's failure goes back to the client, named
            first = (str(exc).strip().splitlines() or [""])[0]
            return {"id": request_id, "error": {"kind": "error", "type": type(exc).__name__,
                                                "message": f"{type(exc).__name__}: {first}"}}, []

    def _dispatch(self, name: str, raw: Any, arrays: list[np.ndarray]) -> Any:
        call = CALLS[name]
        if not isinstance(raw, dict):
            raise FieldError("args", "expected an object of the call's arguments")
        args = [self._engine(v) if kind == "engine" else _images(v) if kind == "pictures" else v
                for (_, kind), v in zip(call.args, (decode_value(kind, raw.get(k), arrays, f"args.{k}", self._handle)
                                                     for k, kind in call.args))]
        if name.startswith("tokenizer."):
            member = name.split(".", 1)[1]
            keywords = {k: v for (k, _), v in zip(call.args[1:], args[1:])}
            return getattr(self.engine.tokenizer, member)(args[0], **keywords, **TOKENIZER_EXTRA.get(member, {}))
        return getattr(self.engine, name)(*args)

    def _engine(self, named: tuple[str, str]) -> Engine:
        """The draft a ``speculative`` call names: this server's own engine, the one it holds.

        Raises:
            Unsupported: another engine or pin.
        """
        if named == (self.engine.id, self.engine.pin):
            return self.engine
        raise Unsupported(self.engine.id, f"draft with {named[0]} on pin {named[1]}",
                          f"this server holds {self.engine.id} on {self.engine.pin} only")

    def _new(self, obj: Any) -> int:
        number, self.next_handle = self.next_handle, self.next_handle + 1
        self.handles[number] = obj
        return number

    def _handle(self, number: int, field: str) -> Any:
        if number not in self.handles:
            raise FieldError(field, f"handle {number} is not one this server holds (released, or never made)")
        return self.handles[number]

    # -- a conversation -------------------------------------------------------------------------------
    def converse(self, read_fd: int, write_fd: int, log: Callable[[str], None] = lambda line: None) -> None:
        """Answer requests read from ``read_fd`` on ``write_fd`` until EOF (blocking; the handles are dropped
        at the end). A stream that stops being frames ends the conversation (logged)."""
        try:
            while True:
                try:
                    frame = read_frame(lambda buf, what: _fill(read_fd, buf, what), self.limits)
                except EOFError:
                    return
                except FrameError as exc:
                    log(f"oracles serve: the client sent something that is not a frame ({exc}); conversation ended")
                    return
                header, arrays = self.answer(frame)
                for chunk in encode(header, arrays):
                    _write_all(write_fd, chunk)
        finally:
            self.handles.clear()


def _images(pictures: list[np.ndarray]) -> list[Any]:
    """Pictures as the families hand them to an engine: PIL images (RGB) where pillow is installed (an engine's
    picture preprocessing may call ``convert("RGB")``), else the ``uint8 [H, W, 3]`` arrays."""
    try:
        from PIL import Image
    except ImportError:
        return pictures
    return [Image.fromarray(np.ascontiguousarray(p)) for p in pictures]


def _fill(fd: int, buf: memoryview, what: str) -> None:
    got = 0
    while got < len(buf):
        n = os.readv(fd, [buf[got:]])
        if n == 0:
            raise EOFError(f"EOF after {got} of the {len(buf)} bytes of {what}")
        got += n


def _write_all(fd: int, chunk: bytes | memoryview) -> None:
    view = memoryview(chunk).cast("B")
    while view:
        view = view[os.write(fd, view):]


def serve_stdio(engine: Engine) -> None:
    """Answer one conversation on this process's stdin and stdout. What the libraries print is kept off the
    frames: file descriptor 1 is pointed at stderr for the rest of the process, the frames written to a
    copy of the original stdout."""
    frames = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    Server(engine).converse(0, frames, log=lambda line: print(line, file=sys.stderr))


def serve_tcp(engine: Engine, host: str, port: int, once: bool = False,
              ready: Callable[[str, int], None] = lambda h, p: None) -> None:
    """Listen at ``host:port`` (0: any free port) and answer one connection at a time, the engine kept
    between them (each connection its own handles); ``once``: return after the first. ``ready(host, port)``
    is called once listening."""
    with socket.create_server((host, port)) as listener:
        ready(*listener.getsockname()[:2])
        while True:
            conn, peer = listener.accept()
            with conn:
                conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                print(f"oracles serve: connection from {peer[0]}:{peer[1]}", file=sys.stderr, flush=True)
                try:
                    Server(engine).converse(conn.fileno(), conn.fileno(), log=lambda line: print(line, file=sys.stderr))
                except OSError as exc:  # the client went away mid-answer
                    print(f"oracles serve: connection ended: {exc}", file=sys.stderr, flush=True)
            if once:
                return
