"""A recording as an engine (``--reference recorded:DIR``, or ``--port recorded:DIR``): every call answered
from the store (:mod:`oracles.engines.recorded.store`) as the recorded engine answered it, nothing computed.

Built on a pin, the engine takes the store's one context of that pin (and constructor options, less the
device, which is the recording's): the pin's digest must be the recorded one. Its members are the
context's facts; each call of the wire's table is keyed as the recording keyed it
(:mod:`oracles.engines.recorded.keys`) and its entry read back, checked and decoded by the wire's codec.
A refusal recorded (``Unsupported``, a context too short, a ``ValueError``) is raised as the engine's, so a
replay skips exactly where the live engine skipped; any other recorded exception fails the call naming it.
A call whose key the store lacks fails in one line naming the call and its key (:class:`NotRecorded`),
never a skip. Caches and snapshots are lineages only (:class:`~oracles.engines.recorded.handles.Tracked`):
``trim``, ``snapshot`` and ``restore`` are lookups that rename them. ``describe()`` is the recorded
engine's, with the store's provenance under ``recorded``; ``counters()`` is ``{}`` (a replay keeps none).
"""

from __future__ import annotations

import abc
import builtins
import functools
import inspect
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar

from oracles.engines.base import ContextTooShort, Engine, Unsupported
from oracles.engines.recorded.handles import Calls, Tracked
from oracles.engines.recorded.keys import bind, jcs, sha256_hex
from oracles.engines.recorded.store import Context, Store, StoreError
from oracles.engines.wire.calls import CALLS
from oracles.engines.wire.codec import FieldError, decode_value
from oracles.engines.wire.frame import FrameError
from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

PREFIX = "recorded:"


class NotRecorded(OracleError):
    """A call the store holds no answer to (or an answer it could not hold): the call and its key named."""


class RecordedFailure(OracleError):
    """The recorded engine raised on this call (not a refusal): its type and first line, as recorded."""


class RecordedTokenizer:
    """The recorded tokenizer (:class:`oracles.engines.types.Tokenizer`): each member a lookup; a rendering
    to text or a dict, which the table does not carry, fails as not recorded."""

    def __init__(self, engine: "RecordedEngine", chat_template: str | None) -> None:
        self.engine, self.chat_template = engine, chat_template

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return list(self.engine.answer("tokenizer.encode", {"text": text, "add_special_tokens": add_special_tokens}))

    def decode(self, token_ids: Any, *, skip_special_tokens: bool = False) -> str:
        return str(self.engine.answer("tokenizer.decode", {"token_ids": list(token_ids),
                                                             "skip_special_tokens": skip_special_tokens}))

    def convert_ids_to_tokens(self, ids: Any) -> list[str]:
        return list(self.engine.answer("tokenizer.convert_ids_to_tokens", {"ids": list(ids)}))

    def apply_chat_template(self, conversation: Any, *, add_generation_prompt: bool = True, tokenize: bool = True,
                            return_dict: bool = False, **kwargs: Any) -> Any:
        if not tokenize or return_dict or kwargs:
            raise NotRecorded(f"engine {self.engine.id} tokenizer.apply_chat_template(tokenize={tokenize}, "
                              f"return_dict={return_dict}): not recorded: a recording holds rendered ids only")
        return self.engine.answer("tokenizer.apply_chat_template", {"conversation": list(conversation),
                                                                   "add_generation_prompt": add_generation_prompt})


class RecordedEngine(Engine):
    """A store's recording on a pin (module docstring); one subclass per store (:func:`recorded_class`).

    Raises (from ``__init__``):
        OracleError: the store cannot be read, holds no recording of the pin (what it holds named), holds
            several, or one of another pin digest.
    """

    store: ClassVar[Store]
    devices: ClassVar[tuple[str, ...]] = ("cpu",)
    #: A recording answers from its store, made on the pin's digest (:func:`choose_context` holds the two): the
    #: pin's snapshot is never read, so a machine without the reference's weights replays it.
    reads_snapshot: ClassVar[bool] = False
    _why: ClassVar[str | None]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """Why the store cannot be read (asked once per class), else None."""
        if "_why" not in cls.__dict__:
            try:
                cls.store.check()
                cls._why = None
            except StoreError as exc:
                cls._why = str(exc)
        return cls._why

    def __init__(self, root: Path, pin: "Pin", threads: int = 0, **options: Any) -> None:
        super().__init__(root, pin, threads)
        self.context = choose_context(self.store, pin, options)
        facts = self.context.facts
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = (
            int(facts[k]) for k in ("vocab_size", "hidden_size", "num_layers", "max_context"))
        self.eos_token_ids = frozenset(int(i) for i in facts["eos_token_ids"])
        self.tokenizer = RecordedTokenizer(self, facts.get("chat_template"))
        self.calls = Calls(self, self.context.digest)

    @property
    def recorded_engine(self) -> str:
        """The engine whose answers these are (its id where it was recorded)."""
        return self.context.engine

    def describe(self) -> dict[str, Any]:
        """The recorded engine's ``describe()``, this engine's id and class, and the store's provenance."""
        c = self.context
        return {**c.describe, "engine": self.id, "class": f"{__name__}.RecordedEngine", "recorded_engine": c.engine,
                "recorded_class": c.describe.get("class"),
                "recorded": {"store": str(self.store.root), "context": c.digest, "pin": c.identity["pin"],
                             "threads": c.identity.get("threads"), "options": c.identity.get("options"),
                             "versions": c.identity.get("versions"), "machine": c.identity.get("machine"),
                             "device": c.identity.get("device"), **c.provenance, "entries": self.store.count(c.digest)}}

    def counters(self) -> dict[str, float]:
        return {}

    def answer(self, name: str, args: dict[str, Any]) -> Any:
        """The recorded answer of call ``name`` with ``args`` (by the table's names); the handles it changed
        renamed (module docstring).

        Raises:
            NotRecorded: the store lacks the call's key; Unsupported, ContextTooShort, ValueError: the
            recorded refusal; RecordedFailure (or the builtin exception type recorded): the engine raised;
            StoreError: the entry cannot be read.
        """
        try:
            canonical, key = self.calls.key(name, args)
        except (ValueError, FrameError) as exc:
            raise NotRecorded(f"engine {self.id} {name}(): not recorded: an argument the wire cannot carry ({exc})") from None
        frame = self.store.get(self.context.digest, key, name)
        if frame is None:
            raise NotRecorded(f"engine {self.id} {name}(): not recorded: {self.store.root} holds no answer of "
                              f"{self.recorded_engine} on pin {self.pin} to these arguments (sha256 "
                              f"{sha256_hex(jcs(canonical))[:16]}, key {key})")
        self.calls.advance(name, key, args)
        header = frame.header
        if "error" in header:
            raise self._raised(name, header["error"], self.store.entry_path(self.context.digest, key))
        kind = CALLS[name].result
        if kind == "handle":
            made = self.calls.made(key, None)
            if header["result"] != made.lineage:
                raise StoreError(f"{self.store.entry_path(self.context.digest, key)}: field result {header['result']!r:.20} "
                                 f"is not the lineage of the handle this call makes ({made.lineage[:16]}...)")
            return made
        try:
            return decode_value(kind, header["result"], frame.arrays, "result", lambda i, f: i)
        except FieldError as exc:
            raise StoreError(f"{self.store.entry_path(self.context.digest, key)}: {exc}") from None

    def _raised(self, name: str, error: Any, path: Path) -> Exception:
        """The exception a recorded ``error`` object stands for."""
        if not isinstance(error, dict):
            return StoreError(f"{path}: field error is not an object")
        kind, why = error.get("kind"), str(error.get("why", ""))
        capability = str(error.get("capability", name))
        if kind == "context":
            return ContextTooShort(self.id, capability, why)
        if kind == "unsupported":
            return Unsupported(self.id, capability, why)
        message = str(error.get("message", ""))
        if kind == "value":
            return ValueError(message)
        if kind == "unrecordable":
            return NotRecorded(f"engine {self.id} {name}(): not recorded: the recording could not hold "
                               f"{self.recorded_engine}'s answer ({message}); see {path}")
        typ = getattr(builtins, str(error.get("type", "")), None)
        text = f"engine {self.id} {name}(): {self.recorded_engine} raised {error.get('type')}: {message} (recorded in {path})"
        if isinstance(typ, type) and issubclass(typ, Exception) and typ not in (ValueError,):
            try:
                return typ(text)
            except Exception:  # noqa: BLE001 - a builtin taking other arguments: the suite's own type
                pass
        return RecordedFailure(text)


def choose_context(store: Store, pin: "Pin", options: dict[str, Any]) -> Context:
    """The store's one context of ``pin`` with ``options`` (its device aside).

    Raises:
        OracleError: none (what the store holds named), several, or one of another pin digest.
    """
    store.check()
    held = store.contexts()
    want = {k: v for k, v in options.items() if k != "device"}
    mine = [c for c in held if c.pin[0] == pin.name and {k: v for k, v in (c.identity.get("options") or {}).items()
                                                          if k != "device"} == want]
    if not mine:
        have = ", ".join(sorted({f"{c.engine} on {c.pin[0]}" + (f" {c.identity.get('options')}" if c.identity.get("options")
                                                                  else "") for c in held})) or "nothing"
        raise OracleError(f"recording {store.root} holds no recording of pin {pin.name}"
                          f"{f' with {want}' if want else ''}; it holds {have}")
    if len(mine) > 1:
        raise OracleError(f"recording {store.root} holds {len(mine)} recordings of pin {pin.name} (contexts "
                          f"{', '.join(c.digest[:12] for c in mine)}: other engines, versions or machines); keep one")
    context = mine[0]
    if context.pin[1] != pin.digest:
        raise OracleError(f"recording {store.root} was made on pin {pin.name} of digest {context.pin[1]}; the pin's "
                          f"digest is {pin.digest} (its snapshot changed): record again")
    return context


def _replayed(name: str) -> Callable[..., Any]:
    base = getattr(Engine, name)

    @functools.wraps(base)
    def method(self: RecordedEngine, *args: Any, **kwargs: Any) -> Any:
        bound = bind(name, args, kwargs)
        if name == "known_gap":  # a test's name holds the engine's id: the recording's is the recorded engine's
            bound["oracle"] = str(bound["oracle"]).replace(self.id, self.recorded_engine)
        return self.answer(name, bound)

    method.__signature__ = inspect.signature(base)  # type: ignore[attr-defined]
    method.__isabstractmethod__ = False  # type: ignore[attr-defined]  # wraps() copied the base's flag
    return method


for _name in CALLS:
    if "." not in _name and _name not in ("describe", "counters"):
        setattr(RecordedEngine, _name, _replayed(_name))
abc.update_abstractmethods(RecordedEngine)  # type: ignore[type-abstract]  # concrete now: its methods are set above


def recorded_class(engine_id: str) -> type[RecordedEngine]:
    """The engine class of ``recorded:DIR`` (``DIR`` relative to the current folder)."""
    folder = Path(engine_id.removeprefix(PREFIX)).expanduser()
    return type("RecordedEngine", (RecordedEngine,), {"id": engine_id, "store": Store(folder.resolve()),
                                                       "__module__": __name__, "__doc__": RecordedEngine.__doc__})


__all__ = ["PREFIX", "NotRecorded", "RecordedEngine", "RecordedFailure", "Tracked", "choose_context", "recorded_class"]
