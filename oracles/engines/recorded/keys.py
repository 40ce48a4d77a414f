"""The addresses of a recording (``docs/recordings.md``, "Keys"): the canonical form of a request, its key,
and the names of the caches it reads and changes. numpy and the standard library only.

A request's *canonical arguments* are the wire's request arguments (:mod:`oracles.engines.wire.codec`) with
each array replaced by ``{"dtype", "shape", "sha256"}`` of its little-endian bytes, each handle by its
*lineage* (below) and a draft engine by ``{"engine", "pin"}``. Its *key* is the sha256 of the RFC 8785
(JSON Canonicalization Scheme) serialization of ``{"context": C, "call": NAME, "args": ARGS}``, ``C`` the
recording's context digest (engine, pin digest, settings, versions, machine and device:
:mod:`oracles.engines.recorded.store`).

A recorded engine computes nothing, so a cache is named by the calls that made it: a *lineage* is a sha256,
``sha256(KEY + ":" + ROLE)`` of the call that made the handle (ROLE ``result``) or last changed it (ROLE the
argument's name, ``caches.<i>`` for a cohort's lane <i>; :data:`oracles.engines.wire.calls.MUTATES`). So a
cache's lineage names its token prefix and how it was computed: a prefill of 3 ids then a trim of 1 is
another cache than a prefill of 2 (their keys and values need not be the same bits: a 3-row matmul may
round otherwise than a 2-row one), and a replay that makes the same calls reaches the same names.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import math
from typing import Any, Callable

import numpy as np

from oracles.engines.wire.calls import CALLS, MUTATES
from oracles.engines.wire.codec import Arrays, encode_value
from oracles.engines.wire.frame import dtype_name, wire_array


def jcs(value: Any) -> bytes:
    """``value`` (JSON types: dict with str keys, list, tuple, str, int, float, bool, None) serialized by RFC 8785:
    no whitespace, object members sorted by the UTF-16 code units of their names, strings escaped as ECMAScript's
    ``JSON.stringify`` does, numbers as ECMAScript's ``Number.prototype.toString`` writes the double.

    Raises:
        ValueError: a NaN or infinity (RFC 8785 section 3.2.2.3 has none). TypeError: a value of another type.
    """
    return _jcs(value).encode("utf-8")


def _jcs(value: Any) -> str:
    if value is None or isinstance(value, bool):
        return "null" if value is None else "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return es_number(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_jcs(v) for v in value) + "]"
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            raise TypeError(f"an object's member names must be strings: {sorted(map(repr, value))[:3]}")
        names = sorted(value, key=lambda k: k.encode("utf-16-be"))
        return "{" + ",".join(f"{json.dumps(k, ensure_ascii=False)}:{_jcs(value[k])}" for k in names) + "}"
    raise TypeError(f"{type(value).__name__} {value!r:.60} is not a JSON value")


def es_number(x: float) -> str:
    """The double ``x`` as ECMAScript's ``Number.prototype.toString`` writes it (ECMA-262 section 6.1.6.1.20,
    which RFC 8785 section 3.2.2.3 adopts): the shortest digits that read back as ``x`` (Python's ``repr``
    gives the same digits), in fixed notation for decimal exponents -6 .. 20, else ``d.ddde+N``.

    Raises:
        ValueError: NaN or an infinity.
    """
    if not math.isfinite(x):
        raise ValueError(f"{x!r} has no JSON form (RFC 8785 refuses NaN and infinities)")
    if x == 0:
        return "0"
    sign, (mantissa, _, exp) = ("-" if x < 0 else ""), repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    digits = (whole + frac).lstrip("0")
    stripped = digits.rstrip("0")
    k = len(stripped)
    n = int(exp or 0) - len(frac) + (len(digits) - k) + k  # x = 0.d1..dk * 10^n
    if k <= n <= 21:
        return sign + stripped + "0" * (n - k)
    if 0 < n <= 21:
        return sign + stripped[:n] + "." + stripped[n:]
    if -6 < n <= 0:
        return sign + "0." + "0" * -n + stripped
    e = n - 1
    return sign + stripped[0] + ("." + stripped[1:] if k > 1 else "") + ("e+" if e > 0 else "e-") + str(abs(e))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Digests(Arrays):
    """An :class:`~oracles.engines.wire.codec.Arrays` whose :meth:`ref` stands for an array by its digest
    ``{"dtype": wire name, "shape": [...], "sha256": hex of its little-endian C-order bytes}``."""

    def ref(self, a: Any) -> dict[str, Any]:
        arr = wire_array(a)
        return {"dtype": dtype_name(arr), "shape": list(arr.shape), "sha256": hashlib.sha256(arr.data.cast("B")).hexdigest()}


_SIGNATURES: dict[str, inspect.Signature] = {}


def bind(name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call to Engine method ``name`` by the table's names, defaults applied.

    Raises:
        TypeError: arguments the method does not take.
    """
    from oracles.engines.base import Engine

    if name not in _SIGNATURES:
        _SIGNATURES[name] = inspect.signature(getattr(Engine, name))
    bound = _SIGNATURES[name].bind(None, *args, **kwargs)
    bound.apply_defaults()
    return {arg: bound.arguments[arg] for arg, _ in CALLS[name].args}


def canonical_args(name: str, args: dict[str, Any], lineage: Callable[[Any], str],
                   engine_name: Callable[[Any], dict[str, str]]) -> dict[str, Any]:
    """The canonical arguments of call ``name`` (module docstring): ``lineage(handle)`` names a handle,
    ``engine_name(engine)`` a draft.

    Raises:
        TypeError, FrameError: an argument its kind cannot hold (an array of a dtype the wire does not carry).
    """
    out: dict[str, Any] = {}
    for arg, kind in CALLS[name].args:
        value = args[arg]
        out[arg] = engine_name(value) if kind == "engine" else encode_value(kind, value, Digests(), lineage)
    return out


def request_key(context: str, name: str, args: dict[str, Any]) -> str:
    """The key of call ``name`` with canonical ``args`` in the recording ``context`` (module docstring)."""
    return sha256_hex(jcs({"context": context, "call": name, "args": args}))


def lineage_of(key: str, role: str) -> str:
    """The lineage of a handle made (``role`` ``"result"``) or changed (its argument's name) by the call ``key``."""
    return sha256_hex(f"{key}:{role}".encode())


def changed(name: str, args: dict[str, Any]) -> list[tuple[str, Any]]:
    """(role, handle) of each handle call ``name`` changes in place (:data:`oracles.engines.wire.calls.MUTATES`):
    ``cache``, ``history``, or ``caches.<i>`` per lane; a null handle changes nothing."""
    out: list[tuple[str, Any]] = []
    for arg in MUTATES.get(name, ()):
        value = args[arg]
        if isinstance(value, (list, tuple)):
            out += [(f"{arg}.{i}", v) for i, v in enumerate(value)]
        elif value is not None:
            out.append((arg, value))
    return out


def array_digest(a: np.ndarray) -> str:
    """sha256 of an array's bytes as the wire carries them."""
    return hashlib.sha256(wire_array(a).data.cast("B")).hexdigest()
