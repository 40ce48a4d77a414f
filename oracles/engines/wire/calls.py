"""The call table: every :class:`oracles.engines.base.Engine` method the wire carries, with the kind of each
argument and of the result (``docs/wire.md``, "Calls").

A call's arguments are the method's parameters by name (``self`` left out), in the base class's order;
its result is one value. Kinds (their JSON and arrays: :mod:`oracles.engines.wire.codec`):

=============  =========================================================================
``int``        a JSON integer (``int?``: or null)
``bool``       a JSON boolean
``str``        a JSON string (``str?``: or null)
``json``       any JSON value (messages, a dict of digests, ``describe()``)
``ids``        a JSON list of integers (token ids)
``strs``       a JSON list of strings
``f32``        one float32 array
``prompt``     ``{"ids": [...], "images": [arrays u8 [H, W, 3]], "videos": [[arrays]]}``
``sampler``    ``{"temperature", "top_p", "top_k", "seed"}``
``handle``     an integer naming a cache or snapshot the far side holds (``handle?``: or null;
               ``handles``: a list of them); a result of this kind is a new handle
``engine``     ``{"engine": ID, "pin": NAME}``: another engine (a draft) the far side holds
``step``       ``{"logits": f32 [T, V], "hidden": f32 [T, D], "layers": f32 [L+1, T, D] | null,
               "positions": i64 [3, T] | null}``
``generation`` ``{"tokens", "text", "finish_reason", "step_logits": f32 [N, V], "prefill_seconds",
               "decode_seconds", "extra"}``
``buffers``    ``[[name, f32 array], ...]`` in the engine's order
``taps``       ``{"stream", "attn", "mlp", "hidden", "logits": f32 arrays, "mixers": [str],
               "down_in_absmax": f32 [L] | null}``
``tolerance``  an object of :class:`oracles.checks.tolerance.Tolerance`'s fields
``pictures``   a list of arrays u8 ``[H, W, 3]`` (PIL images sent as RGB)
``named``      ``[[name, array], ...]``, arrays of any wire dtype (``named?``: or null): System One's pixels
``f32s``       a list of float32 arrays
``id_groups``  a list of lists of integers (token ids)
``mtp_step``   ``{"logits": f32 [T, V], "state": f32 [T, D]}`` (the pair an MTP call returns)
``mtp_generation``  :class:`oracles.engines.types.MtpGeneration`'s fields, JSON
``decision_inputs`` ``{"trunk": ids, "branches": id_groups, "vision": named}``
=============  =========================================================================

A capability added to the base class is one entry here (a dry test fails while the base class has a
public method neither here nor in :data:`LOCAL`, or an entry's argument names differ from its
parameters). Pure: no numpy.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Call:
    """One carried call: its ``args`` ((parameter name, kind), in the method's order) and ``result`` kind."""

    args: tuple[tuple[str, str], ...]
    result: str


def _c(result: str, *args: tuple[str, str]) -> Call:
    return Call(tuple(args), result)


PROMPT, CACHE, SNAP = ("prompt", "prompt"), ("cache", "handle"), ("snapshot", "handle")

#: The calls, by name: the Engine method's name, or ``tokenizer.NAME`` for a member of its tokenizer.
CALLS: dict[str, Call] = {
    # the core every far side serves (the base class's abstract methods)
    "forward": _c("step", PROMPT, ("cache", "handle?"), ("keep", "int"), ("layers", "bool")),
    "make_cache": _c("handle"),
    "cache_length": _c("int", ("cache", "handle?")),
    # what the receipt and the judgment read
    "describe": _c("json"),
    "tolerance": _c("tolerance"),
    "translation_notes": _c("strs"),
    "known_gap": _c("str?", ("oracle", "str"), ("any_pin", "bool")),
    "speculative_refusal": _c("str?"),
    "batch_variance": _c("str?"),
    "counters": _c("json"),
    "weight_bytes": _c("int"),
    # text
    "chat_ids": _c("ids", ("messages", "json"), ("add_generation_prompt", "bool")),
    "decode": _c("str", ("ids", "ids")),
    # forward relatives
    "taps": _c("taps", PROMPT),
    "lm_head": _c("f32", ("hidden", "f32")),
    "final_norm": _c("f32", ("residual", "f32")),
    # caches and snapshots
    "is_trimmable": _c("bool", CACHE),
    "trim": _c("bool", CACHE, ("n", "int")),
    "snapshot": _c("handle", CACHE),
    "restore": _c("handle", SNAP),
    "snapshot_buffers": _c("buffers", SNAP),
    "snapshot_digest": _c("str", SNAP),
    "buffer_digests": _c("json", SNAP),
    "cache_buffers": _c("buffers", CACHE),
    "cache_views": _c("buffers", CACHE),
    "cache_capacity": _c("int", CACHE),
    "grow": _c("handle", CACHE, ("capacity", "int")),
    "resident_bytes": _c("int", ("obj", "handle")),
    "decode_cohort": _c("step", ("tokens", "ids"), ("caches", "handles")),
    # the library's own generation
    "generate": _c("generation", PROMPT, ("sampler", "sampler"), ("max_new_tokens", "int"), ("max_kv_size", "int?")),
    "speculative": _c("generation", PROMPT, ("draft", "engine"), ("num_draft", "int"), ("max_new_tokens", "int"),
                      ("max_kv_size", "int?")),
    # MTP drafting (oracles.engines.systems.MtpDrafting)
    "mtp_trunk_cache": _c("handle"),
    "mtp_history_cache": _c("handle"),
    "mtp_trunk": _c("mtp_step", ("ids", "ids"), CACHE),
    "mtp_draft": _c("mtp_step", ("tokens", "ids"), ("state", "f32"), ("start", "int"), ("history", "handle"),
                    ("depth", "int")),
    "mtp_head": _c("f32", ("state", "f32")),
    "mtp_generate": _c("mtp_generation", ("ids", "ids"), ("max_new_tokens", "int")),
    # System One decisions (oracles.engines.systems.SystemOneDecisions)
    "decision_inputs": _c("decision_inputs", ("state", "json"), ("questions", "json"), ("images", "pictures")),
    "decision_readout_ids": _c("id_groups", ("question", "json")),
    "decision_logprobs": _c("f32s", ("trunk", "ids"), ("branches", "id_groups"), ("vision", "named?")),
    "decision_predict": _c("json", ("state", "json"), ("questions", "json"), ("images", "pictures")),
    # the tokenizer (oracles.engines.types.Tokenizer; its chat_template is a fact of the handshake)
    "tokenizer.encode": _c("ids", ("text", "str"), ("add_special_tokens", "bool")),
    "tokenizer.decode": _c("str", ("token_ids", "ids"), ("skip_special_tokens", "bool")),
    "tokenizer.apply_chat_template": _c("ids", ("conversation", "json"), ("add_generation_prompt", "bool")),
    "tokenizer.convert_ids_to_tokens": _c("strs", ("ids", "ids")),
}

#: The handle arguments each call changes in place (a cache it appends to or cuts): every other handle argument is
#: read only. A recording names a cache by the calls that built it (:mod:`oracles.engines.recorded.keys`).
MUTATES: dict[str, tuple[str, ...]] = {
    "forward": ("cache",), "trim": ("cache",), "decode_cohort": ("caches",), "mtp_trunk": ("cache",),
    "mtp_draft": ("history",),
}

#: The core calls: a far side that does not serve all three is refused at the handshake.
CORE = ("forward", "make_cache", "cache_length")

#: Public members of the base class the wire does not carry, and why (the client answers them itself).
LOCAL: dict[str, str] = {
    "unavailable_reason": "a class method asked at collection: the client answers from its target (a command "
                          "that exists, a host that accepts), before any far side is started",
    "device_unavailable": "a class method of the in-process reference's --reference-device",
    "unsupported_pin": "a class method asked at collection from the pin file alone: the project's "
                       "oracles_wire line names the pins a far side runs on",
    "text_ids": "the base class's own check of a prompt (no pictures for a text engine); it calls no framework",
}

#: The protocol's own call (not an Engine method): the handshake.
HELLO = "hello"

#: Result kinds the far side returns as a new handle (the client owns it until it is collected).
NEW_HANDLE = "handle"


def table_gaps(engine_class: type, tokenizer_members: tuple[str, ...]) -> list[str]:
    """What the table lacks against ``engine_class`` (the Engine base class) and the tokenizer's members,
    one line each: a public method neither in :data:`CALLS` nor in :data:`LOCAL`, an entry whose argument
    names are not the method's parameters (in order), an entry naming no method, a :data:`MUTATES` entry naming
    no handle argument of its call, a tokenizer member without
    its ``tokenizer.NAME`` call (``chat_template`` is a fact of the handshake)."""
    import inspect

    out = []
    methods = {name for klass in engine_class.__mro__ if klass.__module__ not in ("builtins", "abc")
               for name in vars(klass) if not name.startswith("_") and callable(getattr(engine_class, name))}
    for name in sorted(methods):
        if name in LOCAL:
            continue
        if name not in CALLS:
            out.append(f"Engine.{name} is neither carried (calls.CALLS) nor answered by the client (calls.LOCAL)")
            continue
        params = [p for p in inspect.signature(getattr(engine_class, name)).parameters if p != "self"]
        names = [arg for arg, _ in CALLS[name].args]
        if params != names:
            out.append(f"calls.CALLS[{name!r}] carries {names}; Engine.{name} takes {params}")
    out += [f"calls.CALLS[{name!r}] names no Engine method" for name in CALLS if "." not in name and name not in methods]
    out += [f"calls.MUTATES[{name!r}] names {arg!r}, not a handle argument of the call" for name, args in MUTATES.items()
            for arg in args if not (name in CALLS and dict(CALLS[name].args).get(arg, "").startswith("handle"))]
    out += [f"tokenizer.{m} (oracles.engines.types.Tokenizer) is not carried" for m in tokenizer_members
            if m != "chat_template" and f"tokenizer.{m}" not in CALLS]
    return out
