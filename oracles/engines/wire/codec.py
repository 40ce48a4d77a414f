"""Values of the call table's kinds (:mod:`oracles.engines.wire.calls`) to and from a frame's JSON and arrays.

Each side encodes what it sends into a JSON value and an :class:`Arrays` list (``{"array": i}`` in the JSON
stands for ``arrays[i]``) and decodes what it receives, checking every field: a value of the wrong kind,
dtype or rank is a :class:`FieldError` naming its field (``result.logits``, ``args.cache``), which the caller
turns into one line naming engine and call. Handles stay integers here; the client and the server map them
to their own objects. numpy only (pictures arrive as ``uint8`` arrays).
"""

from __future__ import annotations

import dataclasses
from numbers import Integral
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from oracles.engines.types import Generation, MtpGeneration, Prompt, Sampler, Step
from oracles.engines.wire.frame import DTYPES, FrameError, wire_array
from oracles.errors import OracleError


class FieldError(OracleError):
    """A value that breaks its kind: ``field`` (``result.logits``) and what is wrong with it."""

    def __init__(self, field: str, problem: str) -> None:
        self.field, self.problem = field, problem
        super().__init__(f"field {field}: {problem}")


class Arrays:
    """The arrays of one frame being written: :meth:`ref` appends one and returns its JSON stand-in."""

    def __init__(self) -> None:
        self.items: list[np.ndarray] = []

    def ref(self, a: Any) -> dict[str, int]:
        """``{"array": i}`` for ``a`` appended as array ``i``.

        Raises:
            FrameError: a dtype the wire does not carry (:func:`oracles.engines.wire.frame.wire_array`).
        """
        self.items.append(wire_array(a))
        return {"array": len(self.items) - 1}


# -- reading a received value --------------------------------------------------------------------
def array_of(value: Any, arrays: Sequence[np.ndarray], field: str, dtype: str = "f32",
             ndim: int | None = None) -> np.ndarray:
    """The array ``value`` stands for, of ``dtype`` (a wire name) and rank ``ndim``.

    Raises:
        FieldError: not ``{"array": i}`` for an ``i`` in the frame, or another dtype or rank.
    """
    if not (isinstance(value, dict) and isinstance(value.get("array"), int) and 0 <= value["array"] < len(arrays)):
        raise FieldError(field, f"{_seen(value)}; expected {{\"array\": i}} for one of the frame's {len(arrays)} arrays")
    a = arrays[value["array"]]
    if a.dtype != DTYPES[dtype] or (ndim is not None and a.ndim != ndim):
        want = f"{dtype} of rank {ndim}" if ndim is not None else dtype
        name = next(k for k, v in DTYPES.items() if v == a.dtype)
        raise FieldError(field, f"is {name} {list(a.shape)}; expected {want}")
    return a


def optional_array(value: Any, arrays: Sequence[np.ndarray], field: str, dtype: str = "f32",
                   ndim: int | None = None) -> np.ndarray | None:
    """:func:`array_of`, or None for a JSON null."""
    return None if value is None else array_of(value, arrays, field, dtype, ndim)


def integer(value: Any, field: str, nullable: bool = False) -> int | None:
    """``value`` as an int (a bool is not one).

    Raises:
        FieldError: anything else.
    """
    if value is None and nullable:
        return None
    if isinstance(value, bool) or not isinstance(value, Integral):
        raise FieldError(field, f"{_seen(value)}; expected an integer" + (" or null" if nullable else ""))
    return int(value)


def text(value: Any, field: str, nullable: bool = False) -> str | None:
    """``value`` as a str.

    Raises:
        FieldError: anything else.
    """
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise FieldError(field, f"{_seen(value)}; expected a string" + (" or null" if nullable else ""))
    return value


def int_list(value: Any, field: str) -> list[int]:
    """``value`` as a list of ints.

    Raises:
        FieldError: not a list, or an item that is not an integer (index named).
    """
    if not isinstance(value, list):
        raise FieldError(field, f"{_seen(value)}; expected a list of integers")
    return [int(integer(v, f"{field}[{i}]") or 0) for i, v in enumerate(value)]


def str_list(value: Any, field: str) -> list[str]:
    """``value`` as a list of str.

    Raises:
        FieldError: not a list of strings.
    """
    if not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
        raise FieldError(field, f"{_seen(value)}; expected a list of strings")
    return list(value)


def _seen(value: Any) -> str:
    shown = repr(value)
    return f"got {type(value).__name__} {shown[:60] + '...' if len(shown) > 60 else shown}"


def _object(value: Any, field: str, keys: Sequence[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise FieldError(field, f"{_seen(value)}; expected an object with {', '.join(keys)}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise FieldError(f"{field}.{missing[0]}", "missing")
    return value


# -- kinds: encode ---------------------------------------------------------------------------------
def encode_prompt(prompt: Prompt | Sequence[int], out: Arrays) -> dict[str, Any]:
    """A prompt's ids, and each picture as a ``uint8 [H, W, 3]`` array (a PIL image converted to RGB)."""
    p = prompt if isinstance(prompt, Prompt) else Prompt(tuple(int(i) for i in prompt))
    return {"ids": [int(i) for i in p.ids], "images": [out.ref(_pixels(im)) for im in p.images],
            "videos": [[out.ref(_pixels(f)) for f in video] for video in p.videos]}


def _pixels(image: Any) -> np.ndarray:
    if hasattr(image, "convert"):  # a PIL image
        image = image.convert("RGB")
    return np.asarray(image, dtype=np.uint8)


def encode_value(kind: str, value: Any, out: Arrays, handle: Callable[[Any], int | str]) -> Any:
    """``value`` of ``kind`` as JSON (arrays appended to ``out``; ``handle(obj)`` -> its integer on the wire, its
    lineage in a recording).

    Raises:
        FrameError: an array of a dtype the wire does not carry. TypeError: a value its kind cannot hold.
    """
    if value is None and kind.endswith("?"):
        return None
    base = kind.rstrip("?")
    if base in ("int", "bool", "str"):
        return {"int": int, "bool": bool, "str": str}[base](value)
    if base == "json":
        return json_safe(value)
    if base == "ids":
        return [int(i) for i in value]
    if base == "id_groups":
        return [[int(i) for i in group] for group in value]
    if base == "strs":
        return [str(s) for s in value]
    if base == "f32":
        return out.ref(value)
    if base == "f32s":
        return [out.ref(_f32(a)) for a in value]
    if base == "pictures":
        return [out.ref(_pixels(im)) for im in value]
    if base == "named":
        return [[str(name), out.ref(a)] for name, a in value.items()]
    if base == "prompt":
        return encode_prompt(value, out)
    if base == "sampler":
        return value.to_json()
    if base == "handle":
        return handle(value)
    if base == "handles":
        return [handle(v) for v in value]
    return _encode_record(base, value, out)


def _encode_record(kind: str, value: Any, out: Arrays) -> Any:
    if kind == "step":
        return {"logits": out.ref(value.logits), "hidden": out.ref(value.hidden),
                "layers": None if value.layers is None else out.ref(value.layers),
                "positions": None if value.positions is None else out.ref(np.asarray(value.positions, "<i8"))}
    if kind == "generation":
        return {"tokens": [int(t) for t in value.tokens], "text": str(value.text), "finish_reason": value.finish_reason,
                "step_logits": out.ref(value.step_logits), "prefill_seconds": float(value.prefill_seconds),
                "decode_seconds": float(value.decode_seconds), "extra": json_safe(value.extra)}
    if kind == "buffers":
        return [[str(name), out.ref(a)] for name, a in value.items()]
    if kind == "mtp_step":
        logits, state = value
        return {"logits": out.ref(_f32(logits)), "state": out.ref(_f32(state))}
    if kind == "mtp_generation":
        return {"tokens": [int(t) for t in value.tokens], "greedy": [int(t) for t in value.greedy],
                "forwards": int(value.forwards), **{k: None if getattr(value, k) is None else int(getattr(value, k))
                                                    for k in ("accepted", "drafted")}, "extra": json_safe(value.extra)}
    if kind == "decision_inputs":
        trunk, branches, vision = value
        return {"trunk": [int(i) for i in trunk], "branches": [[int(i) for i in b] for b in branches],
                "vision": [[str(name), out.ref(a)] for name, a in vision.items()]}
    if kind == "taps":
        return {**{k: out.ref(getattr(value, k)) for k in ("stream", "attn", "mlp", "hidden", "logits")},
                "mixers": list(value.mixers),
                "down_in_absmax": None if value.down_in_absmax is None else out.ref(value.down_in_absmax)}
    if kind == "tolerance":
        return dataclasses.asdict(value)
    if kind == "engine":  # a draft: the far side's own engine id and pin (oracles.engines.wire.client)
        return {"engine": str(getattr(value, "far_engine", value.id)), "pin": str(value.pin)}
    raise TypeError(f"unknown kind {kind!r}")


def _f32(a: Any) -> np.ndarray:
    """``a`` where it is float32; anything else is refused, never cast (the wire carries what was computed).

    Raises:
        TypeError: an array of another dtype.
    """
    arr = np.asarray(a)
    if arr.dtype != np.float32:
        raise TypeError(f"a float32 array was expected, not {arr.dtype} {list(arr.shape)}")
    return arr


def json_safe(value: Any) -> Any:
    """``value`` with numpy scalars, arrays and tuples made plain JSON (a generation's ``extra``, a ``json`` value)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return value


# -- kinds: decode ---------------------------------------------------------------------------------
def decode_value(kind: str, value: Any, arrays: Sequence[np.ndarray], field: str,
                 handle: Callable[[int, str], Any]) -> Any:
    """The value ``value`` of ``kind`` stands for (``handle(i, field)`` -> the object of handle ``i``).

    Raises:
        FieldError: a field that breaks its kind (named).
    """
    nullable, base = kind.endswith("?"), kind.rstrip("?")
    if value is None and nullable:
        return None
    if base == "int":
        return integer(value, field)
    if base == "bool":
        if not isinstance(value, bool):
            raise FieldError(field, f"{_seen(value)}; expected true or false")
        return value
    if base == "str":
        return text(value, field)
    if base == "json":
        return value
    if base == "ids":
        return int_list(value, field)
    if base == "id_groups":
        return [int_list(group, f"{field}[{i}]") for i, group in enumerate(_list(value, field, "lists of integers"))]
    if base == "strs":
        return str_list(value, field)
    if base == "f32":
        return array_of(value, arrays, field)
    if base == "f32s":
        return [array_of(v, arrays, f"{field}[{i}]") for i, v in enumerate(_list(value, field, "f32 arrays"))]
    if base == "pictures":
        return [_picture(v, arrays, f"{field}[{i}]") for i, v in enumerate(_list(value, field, "u8 [H, W, 3] arrays"))]
    if base == "named":
        return _named(value, arrays, field)
    if base == "handle":
        return handle(int(integer(value, field) or 0), field)
    if base == "handles":
        return [handle(int(integer(v, f"{field}[{i}]") or 0), f"{field}[{i}]") for i, v in enumerate(int_list(value, field))]
    return _decode_record(base, value, arrays, field)


def _decode_record(kind: str, value: Any, arrays: Sequence[np.ndarray], field: str) -> Any:
    if kind == "prompt":
        v = _object(value, field, ("ids",))
        images = tuple(array_of(a, arrays, f"{field}.images[{i}]", "u8", 3) for i, a in enumerate(v.get("images", [])))
        videos = tuple(tuple(array_of(a, arrays, f"{field}.videos[{i}][{j}]", "u8", 3) for j, a in enumerate(frames))
                       for i, frames in enumerate(v.get("videos", [])))
        ids = int_list(v["ids"], f"{field}.ids")
        return Prompt(tuple(ids), images, videos) if images or videos else ids  # ids alone, as the families pass them
    if kind == "sampler":
        v = _object(value, field, ("temperature", "top_p", "top_k", "seed"))
        return Sampler(float(v["temperature"]), float(v["top_p"]), int(v["top_k"]), int(v["seed"]))
    if kind == "step":
        v = _object(value, field, ("logits", "hidden"))
        return Step(logits=array_of(v["logits"], arrays, f"{field}.logits", ndim=2),
                    hidden=array_of(v["hidden"], arrays, f"{field}.hidden", ndim=2),
                    layers=optional_array(v.get("layers"), arrays, f"{field}.layers", ndim=3),
                    positions=optional_array(v.get("positions"), arrays, f"{field}.positions", "i64", 2))
    if kind == "generation":
        return _generation(_object(value, field, ("tokens", "text", "finish_reason", "step_logits")), arrays, field)
    if kind == "buffers":
        return {name: array_of(ref, arrays, where) for where, name, ref in _pairs(value, field)}
    if kind == "taps":
        return _taps(_object(value, field, ("stream", "attn", "mlp", "hidden", "logits", "mixers")), arrays, field)
    if kind == "mtp_step":
        v = _object(value, field, ("logits", "state"))
        return (array_of(v["logits"], arrays, f"{field}.logits", ndim=2),
                array_of(v["state"], arrays, f"{field}.state", ndim=2))
    if kind == "mtp_generation":
        return _mtp_generation(_object(value, field, ("tokens", "greedy", "forwards")), field)
    if kind == "decision_inputs":
        v = _object(value, field, ("trunk", "branches", "vision"))
        return (int_list(v["trunk"], f"{field}.trunk"), decode_value("id_groups", v["branches"], arrays,
                f"{field}.branches", lambda i, f: i), _named(v["vision"], arrays, f"{field}.vision"))
    if kind == "tolerance":
        from oracles.checks.tolerance import Tolerance

        try:
            return Tolerance(**_object(value, field, ("name",)))
        except (TypeError, ValueError) as exc:
            raise FieldError(field, str(exc)) from None
    if kind == "engine":
        v = _object(value, field, ("engine", "pin"))
        return (text(v["engine"], f"{field}.engine"), text(v["pin"], f"{field}.pin"))
    raise FieldError(field, f"unknown kind {kind!r}")


def _generation(v: dict[str, Any], arrays: Sequence[np.ndarray], field: str) -> Generation:
    finish = text(v["finish_reason"], f"{field}.finish_reason")
    if finish not in ("stop", "length"):
        raise FieldError(f"{field}.finish_reason", f"{finish!r}; expected \"stop\" or \"length\"")
    extra = v.get("extra") or {}
    if not isinstance(extra, dict):
        raise FieldError(f"{field}.extra", f"{_seen(extra)}; expected an object")
    seconds = [v.get(k, 0.0) for k in ("prefill_seconds", "decode_seconds")]
    if not all(isinstance(s, (int, float)) and not isinstance(s, bool) for s in seconds):
        raise FieldError(f"{field}.prefill_seconds", f"{seconds!r}; expected numbers")
    return Generation(tokens=int_list(v["tokens"], f"{field}.tokens"), text=str(text(v["text"], f"{field}.text")),
                      finish_reason=str(finish), step_logits=array_of(v["step_logits"], arrays, f"{field}.step_logits", ndim=2),
                      prefill_seconds=float(seconds[0]), decode_seconds=float(seconds[1]), extra=extra)


def _list(value: Any, field: str, items: str) -> list[Any]:
    if not isinstance(value, list):
        raise FieldError(field, f"{_seen(value)}; expected a list of {items}")
    return value


def _picture(value: Any, arrays: Sequence[np.ndarray], field: str) -> np.ndarray:
    a = array_of(value, arrays, field, "u8", 3)
    if a.shape[2] != 3:
        raise FieldError(field, f"is u8 {list(a.shape)}; expected u8 [H, W, 3] (RGB)")
    return a


def _pairs(value: Any, field: str) -> Iterator[tuple[str, str, Any]]:
    """The ``[[name, ref], ...]`` list at ``field``, in order: (the pair's field for errors, name, ref) each.

    Raises:
        FieldError: not a list, or an item that is not a ``[str, ref]`` pair.
    """
    if not isinstance(value, list):
        raise FieldError(field, f"{_seen(value)}; expected a list of [name, array] pairs")
    for i, pair in enumerate(value):
        if not (isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], str)):
            raise FieldError(f"{field}[{i}]", f"{_seen(pair)}; expected [name, {{\"array\": i}}]")
        yield f"{field}[{i}] ({pair[0]})", pair[0], pair[1]


def _named(value: Any, arrays: Sequence[np.ndarray], field: str) -> dict[str, np.ndarray]:
    """``[[name, {"array": i}], ...]`` (any wire dtype) as a dict in that order."""
    out: dict[str, np.ndarray] = {}
    for where, name, ref in _pairs(value, field):
        if not (isinstance(ref, dict) and isinstance(ref.get("array"), int) and 0 <= ref["array"] < len(arrays)):
            raise FieldError(where, f"{_seen(ref)}; expected {{\"array\": i}}")
        out[name] = arrays[ref["array"]]
    return out


def _mtp_generation(v: dict[str, Any], field: str) -> MtpGeneration:
    extra = v.get("extra") or {}
    if not isinstance(extra, dict):
        raise FieldError(f"{field}.extra", f"{_seen(extra)}; expected an object")
    return MtpGeneration(tokens=int_list(v["tokens"], f"{field}.tokens"), greedy=int_list(v["greedy"], f"{field}.greedy"),
                         forwards=int(integer(v["forwards"], f"{field}.forwards") or 0),
                         accepted=integer(v.get("accepted"), f"{field}.accepted", nullable=True),
                         drafted=integer(v.get("drafted"), f"{field}.drafted", nullable=True), extra=extra)


def _taps(v: dict[str, Any], arrays: Sequence[np.ndarray], field: str) -> Any:
    from oracles.engines.taps import Taps

    ranks = {"stream": 3, "attn": 3, "mlp": 3, "hidden": 2, "logits": 2}
    got = {k: array_of(v[k], arrays, f"{field}.{k}", ndim=n) for k, n in ranks.items()}
    return Taps(**got, mixers=str_list(v["mixers"], f"{field}.mixers"),
                down_in_absmax=optional_array(v.get("down_in_absmax"), arrays, f"{field}.down_in_absmax", ndim=1))


__all__ = ["Arrays", "FieldError", "FrameError", "array_of", "decode_value", "encode_value", "int_list", "integer",
           "json_safe", "optional_array", "str_list", "text"]
