"""Recording an engine (``--record ENGINE=DIR``): the engine's class, with every call of the wire's table
(:data:`oracles.engines.wire.calls.CALLS`, its tokenizer's members included) written to a store as it is
answered (:mod:`oracles.engines.recorded.store`), each answer returned to the session unchanged.

:func:`recording_class` makes the class (the registry builds it where ``--record`` names the engine): a
subclass of the engine's own, so the session runs what it would run without ``--record`` (same id, members,
class methods). Each carried call is keyed (:mod:`oracles.engines.recorded.keys`), made, and written: its
result in the wire's encoding, or what it raised as the wire's ``error`` (an ``Unsupported`` too, so a
replay skips where this engine skipped); the session gets the result or the exception as it came. Caches
and snapshots are handed out as :class:`~oracles.engines.recorded.handles.Tracked` (the engine's object and
its lineage). Calls an engine makes on itself inside a call (``cache_buffers`` through ``snapshot``) are
its own business and are not written. ``describe`` is the context's (written once); ``counters`` are
running counters of this process and are not written (a replay answers ``{}``).

A second answer to a written request (another xdist worker, a test asking twice) is held to the first:
an answer that differs but in wall seconds fails the call (:class:`~oracles.engines.recorded.store.Conflict`),
since a replay could give only one of them.
"""

from __future__ import annotations

import abc
import contextlib
import functools
import platform
import time
from pathlib import Path
from typing import Any, Callable, ClassVar, Iterator

import numpy as np

from oracles.engines.base import Engine
from oracles.engines.recorded.handles import Calls, Tracked, refusal_of, unwrap
from oracles.engines.recorded.keys import lineage_of
from oracles.engines.recorded.store import (
    LAYOUT,
    Conflict,
    Context,
    Store,
    StoreError,
    context_digest,
    entry_digest,
    same_answer,
)
from oracles.engines.wire.calls import CALLS
from oracles.engines.wire.codec import Arrays, encode_value, json_safe
from oracles.engines.wire.frame import Frame, FrameError
from oracles.errors import OracleError

#: Versions a context's identity holds (the engine's libraries; pytest's own are not its answers').
VERSIONS = ("numpy", "torch", "transformers", "tokenizers", "safetensors", "mlx", "mlx-lm", "mlx-vlm", "gguf",
            "accelerate", "llama-cpp-python", "ai-edge-litert", "onnxruntime", "pytest-oracles")
#: Calls answered without a write (module docstring).
NOT_WRITTEN = ("describe", "counters")


def identity_of(engine: Engine, options: dict[str, Any]) -> dict[str, Any]:
    """What a context is the digest of: the engine id, the pin (name, digest), its threads and constructor
    options, the libraries' versions, the machine (system, architecture, processor) and the device."""
    from oracles.receipts.environment import cpu_model, installed_versions

    described = live_describe(engine)
    return {"engine": engine.id, "pin": {"name": engine.pin_file.name, "digest": engine.pin_file.digest},
            "threads": int(engine.threads), "options": json_safe(options),
            "versions": {"python": platform.python_version(), **installed_versions(VERSIONS)},
            "machine": {"system": platform.system(), "machine": platform.machine(), "processor": cpu_model()},
            "device": str(described.get("device") or "cpu")}


def live_describe(engine: Engine) -> dict[str, Any]:
    """The engine's own ``describe()`` (a recording engine's without its recording)."""
    return super(RecordingEngine, engine).describe() if isinstance(engine, RecordingEngine) else engine.describe()


def facts_of(engine: Engine) -> dict[str, Any]:
    """The engine's members a replay sets (its sizes, stop ids, context, chat template)."""
    template = getattr(engine.tokenizer, "chat_template", None)
    return {"vocab_size": int(engine.vocab_size), "hidden_size": int(engine.hidden_size),
            "num_layers": int(engine.num_layers), "max_context": int(engine.max_context),
            "eos_token_ids": sorted(int(i) for i in engine.eos_token_ids),
            "chat_template": template if isinstance(template, str) else None}


class Recording:
    """The writes of one engine (its context made at the first call, when the engine is loaded)."""

    def __init__(self, engine: Engine, store: Store, options: dict[str, Any]) -> None:
        self.engine, self.store, self.options = engine, store, options
        self.depth = 0
        self._calls: Calls | None = None

    @property
    def calls(self) -> Calls:
        """The engine's keys, its context written first.

        Raises:
            StoreError: the store cannot be written, or holds this engine on this pin under another identity.
        """
        if self._calls is None:
            e = self.engine
            identity = identity_of(e, self.options)
            context = Context(context_digest(identity), identity, facts_of(e), json_safe(live_describe(e)),
                              {"recorded_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "node": platform.node()})
            for other in self.store.contexts():
                if other.digest != context.digest and (other.engine, other.pin[0], other.identity.get("options")) == (
                        e.id, e.pin, identity["options"]):
                    differ = sorted(k for k in identity if identity[k] != other.identity.get(k))
                    raise StoreError(f"{self.store.root}: holds {e.id} on pin {e.pin} recorded under another identity "
                                     f"(context {other.digest[:12]}: its {', '.join(differ)} differ); record into "
                                     "another folder, or remove that one")
            self.store.add_context(context)
            self._calls = Calls(e, context.digest)
        return self._calls

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No call is written while in force: what the engine answers then is not its own (a fault injected
        into its model in place, :mod:`oracles.faults.port`); the caches it makes then are its bare objects,
        and a later call given one is not written either."""
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1

    def describe(self) -> dict[str, Any]:
        """What the receipt says of the recording: the store, the context, the layout."""
        return {"store": str(self.store.root), "layout": LAYOUT,
                "context": self._calls.context if self._calls is not None else None}

    def record(self, name: str, args: dict[str, Any], invoke: Callable[[dict[str, Any]], Any]) -> Any:
        """``invoke`` (the live call, given the arguments with handles unwrapped), written under its key.

        Raises:
            what the live call raised (written first, where it is the engine's answer); Conflict: a second
            answer to a written request that differs; StoreError: the store cannot be written.
        """
        if self.depth or not calls_keyable(name, args):
            return invoke({k: unwrap(v) for k, v in args.items()})
        calls = self.calls
        try:
            canonical, key = calls.key(name, args)
        except (TypeError, ValueError, FrameError):  # an argument the wire cannot carry: the call is the engine's, unwritten
            return invoke({k: unwrap(v) for k, v in args.items()})
        header = {"layout": LAYOUT, "context": calls.context, "call": name, "key": key, "args": canonical}
        self.depth += 1
        try:
            result = invoke({k: unwrap(v) for k, v in args.items()})
        except BaseException as exc:
            error = refusal_of(exc)
            if error is not None:
                self._write(header | {"error": error}, [])
            raise
        finally:
            self.depth -= 1
            calls.advance(name, key, args)
        kind, out = CALLS[name].result, Arrays()
        try:
            value = encode_value(kind, result, out, lambda live: lineage_of(key, "result"))
            self._write(header | {"result": value}, out.items)
        except (TypeError, ValueError, OverflowError, OracleError) as exc:
            if isinstance(exc, (Conflict, StoreError)):
                raise
            self._write(header | {"error": {"kind": "unrecordable", "message": f"{type(exc).__name__}: {exc}"}}, [])
        return calls.made(key, result) if kind == "handle" else result

    def _write(self, header: dict[str, Any], arrays: list[np.ndarray]) -> None:
        there = self.store.put(header["context"], header["key"], header, arrays)
        if there is None:
            return
        mine = Frame({**header, "sha256": entry_digest(header, arrays)}, arrays)
        if (why := same_answer(there, mine)) is not None:
            path = self.store.entry_path(header["context"], header["key"])
            raise Conflict(f"engine {self.engine.id} {header['call']}(): answered request {header['key'][:16]}... unlike "
                           f"its recorded answer ({why}) in {path}: the engine gives two answers to one request, and a "
                           "replay can give one")


def calls_keyable(name: str, args: dict[str, Any]) -> bool:
    """Whether every cache or snapshot among ``args`` is one the recording handed out (a bare one was made
    while the recording was paused: a call given it is the engine's, unwritten)."""
    for arg, kind in CALLS[name].args:
        value = args[arg]
        if kind.startswith("handles") and not all(isinstance(v, Tracked) for v in value):
            return False
        if kind.startswith("handle") and not kind.startswith("handles") and not (
                isinstance(value, Tracked) or (value is None and kind.endswith("?"))):
            return False
    return True


class RecordingTokenizer:
    """The engine's tokenizer with each member of the table written (``tokenizer.NAME``); a rendering the table
    does not carry (text, a dict) is the live tokenizer's, unwritten, and a replay refuses it."""

    def __init__(self, live: Any, recording: Recording) -> None:
        self._live, self._recording = live, recording

    @property
    def chat_template(self) -> Any:
        return self._live.chat_template

    def __getattr__(self, name: str) -> Any:
        return getattr(self._live, name)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> Any:
        return self._recording.record("tokenizer.encode", {"text": text, "add_special_tokens": add_special_tokens},
                                      lambda a: self._live.encode(a["text"], add_special_tokens=a["add_special_tokens"]))

    def decode(self, token_ids: Any, *, skip_special_tokens: bool = False) -> Any:
        return self._recording.record("tokenizer.decode", {"token_ids": list(token_ids),
                                                           "skip_special_tokens": skip_special_tokens},
                                      lambda a: self._live.decode(a["token_ids"], skip_special_tokens=a["skip_special_tokens"]))

    def convert_ids_to_tokens(self, ids: Any) -> Any:
        return self._recording.record("tokenizer.convert_ids_to_tokens", {"ids": list(ids)},
                                      lambda a: self._live.convert_ids_to_tokens(a["ids"]))

    def apply_chat_template(self, conversation: Any, *, add_generation_prompt: bool = True, tokenize: bool = True,
                            return_dict: bool = False, **kwargs: Any) -> Any:
        if not tokenize or return_dict or kwargs:
            return self._live.apply_chat_template(conversation, add_generation_prompt=add_generation_prompt,
                                                  tokenize=tokenize, return_dict=return_dict, **kwargs)
        return self._recording.record(
            "tokenizer.apply_chat_template", {"conversation": list(conversation), "add_generation_prompt": add_generation_prompt},
            lambda a: self._live.apply_chat_template(a["conversation"], add_generation_prompt=a["add_generation_prompt"],
                                                     tokenize=True, return_dict=False))


class RecordingEngine(Engine):
    """The mixin :func:`recording_class` puts before an engine's class (module docstring)."""

    recording_store: ClassVar[Store]
    recording: Recording

    def __init__(self, *args: Any, **options: Any) -> None:
        super().__init__(*args, **options)
        self.recording = Recording(self, self.recording_store, options)
        if getattr(self, "tokenizer", None) is not None:  # an engine without one is refused at load, as it is
            self.tokenizer = RecordingTokenizer(self.tokenizer, self.recording)  # type: ignore[assignment]

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "recording": self.recording.describe()}


def _recorded(name: str) -> Callable[..., Any]:
    """The method of call ``name``: the class's own, written (module docstring)."""
    from oracles.engines.recorded.keys import bind

    base = getattr(Engine, name)
    names = [arg for arg, _ in CALLS[name].args]

    @functools.wraps(base)
    def method(self: RecordingEngine, *args: Any, **kwargs: Any) -> Any:
        live = getattr(super(RecordingEngine, self), name)
        if self.recording.depth:
            return live(*(unwrap(a) for a in args), **{k: unwrap(v) for k, v in kwargs.items()})
        return self.recording.record(name, bind(name, args, kwargs), lambda a: live(*(a[n] for n in names)))

    method.__isabstractmethod__ = False  # type: ignore[attr-defined]  # wraps() copied the base's flag
    return method


for _name in CALLS:
    if "." not in _name and _name not in NOT_WRITTEN:
        setattr(RecordingEngine, _name, _recorded(_name))
abc.update_abstractmethods(RecordingEngine)  # type: ignore[type-abstract]  # concrete now: its methods are set above


def recording_class(cls: type[Engine], folder: Path) -> type[Engine]:
    """``cls`` recording into the store at ``folder`` (made at the first write); same id, module and doc."""
    return type(cls.__name__, (RecordingEngine, cls), {"recording_store": Store(folder), "__module__": cls.__module__,
                                                       "__doc__": cls.__doc__, "__qualname__": cls.__qualname__})
