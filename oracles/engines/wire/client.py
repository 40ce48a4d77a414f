"""The client: a far side (a harness in any language, ``oracles serve`` on another machine) as an
:class:`oracles.engines.base.Engine`, engine id ``wire:NAME`` (:mod:`oracles.engines.wire.config`).

Building the engine starts the far side (or connects to it) and makes the handshake: the protocol version,
the pin to load, the model facts and the calls it serves. Every method of the call table
(:data:`oracles.engines.wire.calls.CALLS`) is then carried as one request and one response; a call the far
side does not serve runs the base class's own method, which raises ``Unsupported`` for a capability (a skip
naming engine and capability, as for any engine) or computes from the calls that are served (a snapshot's
digest from its buffers). Caches and snapshots stay on the far side: the client holds handles, released
with the next request once collected. What comes back is checked (kinds, dtypes, ranks, then the engine
contract's shapes), and a wrong answer fails its call in one line naming engine, call and field, with the
far side's last stderr lines.

A far side that serves ``tokenizer.encode`` but no chat rendering, and says ``"render_chat": "client"`` in
its facts, has its own chat template (a fact of the handshake) rendered here with jinja2 as llama.cpp's
``--jinja`` mode and transformers render it, and the text tokenized by the far side; ``describe()`` says so.
"""

from __future__ import annotations

import abc
import functools
import inspect
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Sequence

import numpy as np

from oracles.engines.base import ContextTooShort, Engine, EngineContractError, Prompt, Step, Unsupported
from oracles.engines.contract import check_generation, check_step, prompt_rows
from oracles.engines.contract_arrays import expect_f4
from oracles.engines.wire.calls import CALLS, CORE, HELLO
from oracles.engines.wire.channel import Channel, FarError, WireError
from oracles.engines.wire.codec import Arrays, FieldError, decode_value, encode_value, int_list, integer, text
from oracles.engines.wire.config import KEY, Target
from oracles.engines.wire.frame import PROTOCOL
from oracles.engines.wire.transport import Subprocess, Tcp, Transport
from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


class WireHandle:
    """A cache or snapshot held by the far side: its ``number`` on ``channel``, released when collected."""

    __slots__ = ("channel", "number", "__weakref__")

    def __init__(self, channel: Channel, number: int) -> None:
        self.channel, self.number = channel, number
        weakref.finalize(self, channel.release, number)

    def __repr__(self) -> str:
        return f"<wire handle {self.number} of {self.channel.engine}>"


class WireTokenizer:
    """The far side's tokenizer (:class:`oracles.engines.types.Tokenizer`): each member a call, or
    ``Unsupported`` naming it where the far side does not serve it; ``chat_template`` is a fact."""

    def __init__(self, engine: "WireEngine", chat_template: str | None) -> None:
        self.engine, self.chat_template = engine, chat_template

    def _call(self, member: str, capability: str, **args: Any) -> Any:
        name = f"tokenizer.{member}"
        if name not in self.engine.served:
            raise Unsupported(self.engine.id, capability, f"the far side does not serve {name}")
        return self.engine.carry(name, args)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``tokenizer.encode``)."""
        return list(self._call("encode", "tokenize text", text=text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of ``token_ids`` (``tokenizer.decode``)."""
        return str(self._call("decode", "detokenize ids", token_ids=list(token_ids), skip_special_tokens=skip_special_tokens))

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """Vocabulary strings of ``ids`` (``tokenizer.convert_ids_to_tokens``)."""
        return list(self._call("convert_ids_to_tokens", "name vocabulary entries", ids=list(ids)))

    def apply_chat_template(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool = True,
                            tokenize: bool = True, return_dict: bool = False, **_: Any) -> Any:
        """Ids (or with ``tokenize=False`` the text) of ``conversation`` rendered by the far side
        (``tokenizer.apply_chat_template``), or rendered here from its template where it asks (module docstring).

        Raises:
            Unsupported: neither is served, ``return_dict=True``, or text asked of a far side that renders.
        """
        engine = self.engine
        if return_dict:
            raise Unsupported(engine.id, "render a chat as a dict", "the wire carries ids or text")
        if engine.renders_chat_here:
            rendered = engine.render_chat(conversation, add_generation_prompt)
            return self.encode(rendered, add_special_tokens=False) if tokenize else rendered
        if not tokenize:
            raise Unsupported(engine.id, "render a chat as text", "the far side renders chats to ids only")
        return self._call("apply_chat_template", "render a chat", conversation=list(conversation),
                          add_generation_prompt=add_generation_prompt)


class WireEngine(Engine):
    """A far side as an engine (module docstring); one subclass per target (:func:`wire_class`).

    Raises (from ``__init__``):
        OracleError: the far side cannot be started or reached, refuses the handshake, speaks another
            protocol version, lacks a core call, or sends facts of the wrong kind (field named).
    """

    target: ClassVar[Target]
    owner: ClassVar[object] = None
    #: The families the project runs it in (None: all), read by the plugin's parametrization.
    families: ClassVar[tuple[str, ...] | None] = None
    _why: ClassVar[str | None]

    @classmethod
    def unavailable_reason(cls) -> str | None:
        """The target's reason (a command that does not exist, a host that refuses), asked once per class:
        a TCP target is probed with a connection, and collection asks per family."""
        if "_why" not in cls.__dict__:
            cls._why = cls.target.unavailable_reason()
        return cls._why

    @classmethod
    def unsupported_pin(cls, pin: "Pin") -> str | None:
        pins = cls.target.pins
        if pins and pin.name not in pins:
            return (f"{cls.target.origin}: {KEY} {cls.target.name}.pins runs {cls.id} on {', '.join(pins)} only, "
                    f"not {pin.name}")
        return None

    def __init__(self, root: Path, pin: "Pin", threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        self.channel = Channel(self._open(), self.id, self.target.timeout)
        weakref.finalize(self, self.channel.close)
        self.served: frozenset[str] = frozenset()
        self.hello: dict[str, Any] = {}
        try:
            self._handshake()
        except Exception:
            self.channel.close()
            raise

    def _open(self) -> Transport:
        t = self.target
        if (hostport := t.tcp) is not None:
            return Tcp(*hostport, timeout=min(t.hello_timeout, 30.0), owner=self.owner)
        return Subprocess(t.argv(), cwd=t.base, owner=self.owner)

    def pin_payload(self) -> dict[str, Any] | None:
        """The pin the handshake asks the far side to load: its name, digest and files (path -> sha256)."""
        pin = self.pin_file
        return {"name": pin.name, "digest": pin.digest, "files": {k: v.sha256 for k, v in sorted(pin.files.items())}}

    def _handshake(self) -> None:
        pin = self.pin_file
        args = {"protocol": PROTOCOL, "client": "pytest-oracles", "root": str(self.root), "threads": self.threads,
                "pin": self.pin_payload()}
        try:
            frame = self.channel.call(HELLO, args, timeout=self.target.hello_timeout)
        except FarError as exc:
            raise OracleError(f"engine {self.id} hello(): the far side refused pin {pin.name}: {exc.message}"
                              f"{self.channel.tail_note()}") from None
        try:
            self._read_hello(frame.header["result"])
        except FieldError as exc:
            raise self.channel.failure(HELLO, str(exc)) from None

    def _read_hello(self, hello: Any) -> None:
        if not isinstance(hello, dict):
            raise FieldError("result", f"got {type(hello).__name__}; expected the handshake object")
        if hello.get("protocol") != PROTOCOL:
            raise FieldError("result.protocol", f"the far side speaks protocol {hello.get('protocol')!r}; this suite "
                                                f"speaks {PROTOCOL}")
        calls = hello.get("calls")
        if not (isinstance(calls, list) and all(isinstance(c, str) for c in calls)):
            raise FieldError("result.calls", "expected a list of call names")
        missing = [c for c in CORE if c not in calls]
        if missing:
            raise FieldError("result.calls", f"lacks the core call(s) {', '.join(missing)} every engine serves")
        self.served = frozenset(c for c in calls if c in CALLS)
        facts = hello.get("facts")
        if not isinstance(facts, dict):
            raise FieldError("result.facts", "expected an object")
        self.vocab_size, self.hidden_size, self.num_layers, self.max_context = (
            int(integer(facts.get(k), f"result.facts.{k}") or 0)
            for k in ("vocab_size", "hidden_size", "num_layers", "max_context"))
        self.eos_token_ids = frozenset(int_list(facts.get("eos_token_ids"), "result.facts.eos_token_ids"))
        self.bos_text = text(facts.get("bos_token"), "result.facts.bos_token", nullable=True)
        self.eos_text = text(facts.get("eos_token"), "result.facts.eos_token", nullable=True)
        self.renders_chat_here = facts.get("render_chat") == "client" and "tokenizer.encode" in self.served
        template = text(facts.get("chat_template"), "result.facts.chat_template", nullable=True)
        self.tokenizer = WireTokenizer(self, template)
        self.hello = {k: v for k, v in hello.items() if k != "facts"}

    # -- carrying a call ---------------------------------------------------------------------------
    def carry(self, name: str, args: dict[str, Any]) -> Any:
        """Call ``name`` on the far side with ``args`` (by parameter name) and return its checked result.

        Raises:
            Unsupported, ContextTooShort, ValueError: the far side's own refusal, as the engine's.
            WireError: the stream failed, or the answer breaks its kind or the engine contract (one line
                naming engine, call and field, with the far side's last stderr lines).
        """
        call = CALLS[name]
        out = Arrays()
        try:
            payload = {k: encode_value(kind, args[k], out, self._number) for k, kind in call.args}
        except (TypeError, ValueError, OracleError) as exc:
            raise WireError(f"engine {self.id} {name}(): an argument cannot be carried: {exc}") from None
        try:
            frame = self.channel.call(name, payload, out.items)
        except FarError as exc:
            raise self._refusal(name, exc) from None
        try:
            value = decode_value(call.result, frame.header["result"], frame.arrays, "result",
                                 lambda number, field: WireHandle(self.channel, number))
        except FieldError as exc:
            raise self.channel.failure(name, str(exc)) from None
        self._check(name, args, value)
        return value

    def _number(self, handle: Any) -> int:
        if not isinstance(handle, WireHandle) or handle.channel is not self.channel:
            raise TypeError(f"{handle!r} is not a cache or snapshot of engine {self.id}")
        return handle.number

    def _refusal(self, name: str, exc: FarError) -> Exception:
        if exc.kind == "unsupported":
            return Unsupported(self.id, exc.capability, exc.why)
        if exc.kind == "context":
            return ContextTooShort(self.id, exc.capability, exc.why)
        if exc.kind == "value":
            return ValueError(exc.message)
        if exc.kind == "bad_request":
            return self.channel.failure(name, f"the far side refused the request: {exc.message}")
        return self.channel.failure(name, f"the far side raised {exc.message}")

    def _check(self, name: str, args: dict[str, Any], value: Any) -> None:
        """The engine contract's checks of what ``name`` returned (shapes against the model facts)."""
        try:
            if name == "forward":
                check_step(self, "forward()", value, *prompt_rows(args["prompt"], args["keep"]), layers=args["layers"])
            elif name == "decode_cohort":
                check_step(self, "decode_cohort()", value, len(args["tokens"]), f"with B = {len(args['tokens'])} lanes")
            elif name in ("generate", "speculative"):
                check_generation(self, f"{name}()", value)
            elif name in ("lm_head", "final_norm"):
                given = np.shape(args["hidden" if name == "lm_head" else "residual"])
                want = (*given[:-1], self.vocab_size) if name == "lm_head" else given
                expect_f4(self, f"{name}()", "the return value", value, "T, V" if name == "lm_head" else "T, D", want,
                          f"for an argument of shape {list(given)}")
        except EngineContractError as exc:
            raise WireError(f"{exc}{self.channel.tail_note()}") from None

    # -- the core, and what the client answers itself -------------------------------------------------
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """The far side's forward (:meth:`oracles.engines.base.Engine.forward`)."""
        return self.carry("forward", {"prompt": prompt, "cache": cache, "keep": keep, "layers": layers})

    def make_cache(self) -> Any:
        """A new empty cache on the far side (a :class:`WireHandle`)."""
        return self.carry("make_cache", {})

    def cache_length(self, cache: Any) -> int:
        return int(self.carry("cache_length", {"cache": cache}))

    def translation_notes(self) -> tuple[str, ...]:
        return tuple(self.carry("translation_notes", {})) if "translation_notes" in self.served else ()

    def speculative(self, prompt: Prompt | Sequence[int], draft: Engine, num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Any:
        """The far side's speculative generation with ``draft``, an engine it holds (named by its id and pin).

        Raises:
            Unsupported: the far side does not serve it, or ``draft`` is an engine of the suite's process.
        """
        if not isinstance(draft, WireEngine):
            raise self._unsupported("run its library's speculative generation with a draft in the suite's process",
                                    f"draft {draft.id} cannot cross the wire")
        if "speculative" not in self.served:
            return Engine.speculative(self, prompt, draft, num_draft, max_new_tokens, max_kv_size)
        return self.carry("speculative", {"prompt": prompt, "draft": draft, "num_draft": num_draft,
                                          "max_new_tokens": max_new_tokens, "max_kv_size": max_kv_size})

    @property
    def far_engine(self) -> str:
        """The far side's own engine id (what a draft is named by on its side)."""
        return str(self.hello.get("engine") or self.id)

    def describe(self) -> dict[str, Any]:
        """The far side's ``describe()`` (when served), under this engine's id and class, with the wire's
        own facts: the target, the protocol, the far side's name, the calls it serves, the chat rendering."""
        far = dict(self.carry("describe", {})) if "describe" in self.served else {}
        wire = {"target": self.target.address, "protocol": PROTOCOL, "server": self.hello.get("server"),
                "calls": sorted(self.served), "calls_made": self.channel.calls,
                "chat": "rendered by the client from the far side's template (jinja2), tokenized by the far side"
                        if self.renders_chat_here else None}
        pid = getattr(self.channel.transport, "pid", None)
        return {**far, "engine": self.id, "class": f"{__name__}.WireEngine", "far_engine": far.get("engine"),
                "far_class": far.get("class"), "wire": {**wire, **({"pid": pid} if pid else {})}}

    def render_chat(self, conversation: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        """``conversation`` rendered from the far side's chat template with jinja2: a sandbox with
        ``trim_blocks`` and ``lstrip_blocks`` and ``raise_exception`` (transformers'
        ``utils/chat_template_utils.py`` settings), ``bos_token`` / ``eos_token`` the far side's texts.

        Raises:
            Unsupported: the far side has no chat template, or jinja2 cannot run it (its message quoted).
        """
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        if not self.tokenizer.chat_template:
            raise self._unsupported("render a chat", f"the far side has no chat template for pin {self.pin}")

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        try:
            return str(env.from_string(str(self.tokenizer.chat_template)).render(
                messages=list(conversation), add_generation_prompt=add_generation_prompt, bos_token=self.bos_text,
                eos_token=self.eos_text))
        except TemplateError as exc:
            raise self._unsupported("render a chat", f"jinja2: {exc}") from None

    def close(self) -> None:
        """End the conversation: the far side gets EOF and exits (a subprocess is killed after a grace)."""
        self.channel.close()


def _carried(name: str) -> Callable[..., Any]:
    """The method of call ``name``: carried when the far side serves it, else the base class's own."""
    base = getattr(Engine, name)
    signature = inspect.signature(base)
    names = [arg for arg, _ in CALLS[name].args]

    @functools.wraps(base)
    def method(self: WireEngine, *args: Any, **kwargs: Any) -> Any:
        if name not in self.served:
            return base(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        return self.carry(name, {k: bound.arguments[k] for k in names})

    return method


for _name in CALLS:
    if "." not in _name and _name not in WireEngine.__dict__:
        setattr(WireEngine, _name, _carried(_name))
abc.update_abstractmethods(WireEngine)


def wire_class(target: Target, owner: object = None) -> type[WireEngine]:
    """The engine class of ``target`` (id ``wire:NAME``); ``owner`` closes its far sides (a registry)."""
    cls = type("WireEngine", (WireEngine,), {"id": target.engine_id, "target": target, "owner": owner,
                                             "families": target.families or None, "__module__": __name__,
                                             "__doc__": WireEngine.__doc__})
    return cls
