"""The engine contract, checked where the plugin builds an engine (:class:`oracles.plugin.fixtures.EngineLoader`).

An engine is built as ``Class(root, pin, threads)``: the verified snapshot folder, the loaded
:class:`oracles.pins.pin.Pin` (kept as ``pin_file``; ``pin`` is its name) and the thread count.
Once at load, before the class is built, :func:`abstract_refusal`: every core method
(:data:`oracles.engines.base.CORE_METHODS`) the class leaves abstract; then, on the built engine,
:func:`missing_members`: every member :class:`oracles.engines.base.Engine` requires
(:data:`oracles.engines.base.REQUIRED_MEMBERS`) and every member of its tokenizer
(:class:`oracles.engines.types.Tokenizer`). Each named together in one line.

On every call, :func:`install_checks`: what ``forward``, ``decode_cohort``, ``lm_head``, ``final_norm``,
``generate``, ``speculative``, the buffers and digests of a snapshot (``snapshot_buffers``,
``snapshot_digest``, ``buffer_digests``) and the system capabilities (:mod:`oracles.engines.systems`:
``mtp_*``, ``decision_*``, checked by :mod:`oracles.engines.contract_systems`) return is checked for
type, shape and dtype as it leaves the engine, so
a bad return is one :class:`EngineContractError` naming engine, method, field, what came back and what
was expected, instead of an error deep in a family. The checks are installed on the engine object
(instance attributes over the class's methods): the families, the engine's own calls of ``self.forward``
and a fault port over it all get the checked methods, and the engine keeps its class and identity. A
check reads shapes and dtypes only (~1 µs a call; a forward of the smallest pin takes milliseconds).

numpy only.
"""

from __future__ import annotations

from numbers import Integral
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.contract_arrays import expect_f4, seen
from oracles.engines.types import (
    TOKENIZER_MEMBERS,
    VISION_TOKENIZER_MEMBERS,
    EngineContractError,
    Generation,
    Prompt,
    Sampler,
    Step,
)

if TYPE_CHECKING:
    from oracles.engines.base import Engine

#: Members whose value must be an integer (``max_context`` 0 meaning no limit).
INTEGER_MEMBERS = ("vocab_size", "hidden_size", "num_layers", "max_context")


def abstract_refusal(cls: "type[Engine]") -> str | None:
    """One line naming ``cls`` and every method it leaves abstract (the core methods first, in
    :data:`oracles.engines.base.CORE_METHODS` order), or None when it implements them all. Asked of the
    class before it is built: such a class cannot be built (``TypeError``), and an engine that set only
    the model facts would otherwise run no check at all."""
    from oracles.engines.base import CORE_METHODS

    left = set(getattr(cls, "__abstractmethods__", ()))
    if not left:
        return None
    named = [m for m in CORE_METHODS if m in left] + sorted(left - set(CORE_METHODS))
    return (f"{cls.__module__}.{cls.__qualname__} breaks the engine contract: {', '.join(named)} not implemented "
            f"(oracles.engines.base.Engine requires the methods {', '.join(CORE_METHODS)} of every engine)")


def missing_members(engine: "Engine", vision: bool = False) -> list[str]:
    """What ``engine`` lacks of the contract: each required member it does not set (``"max_context"``),
    an integer member that is not an int (``"vocab_size (a str)"``), an empty ``id``, and each member its
    ``tokenizer`` lacks (``"tokenizer.encode"``; on a ``vision`` pin also ``convert_ids_to_tokens``).
    Empty when it keeps the contract."""
    from oracles.engines.base import REQUIRED_MEMBERS

    out = [name for name in REQUIRED_MEMBERS if not hasattr(engine, name)]
    if "id" not in out and not engine.id:
        out.insert(0, "id (empty)")
    out += [f"{name} (a {type(v).__name__})" for name in INTEGER_MEMBERS
            if hasattr(engine, name) and (not isinstance(v := getattr(engine, name), Integral) or isinstance(v, bool))]
    if hasattr(engine, "tokenizer"):
        wanted = TOKENIZER_MEMBERS + (VISION_TOKENIZER_MEMBERS if vision else ())
        out += [f"tokenizer.{name}" for name in wanted if not hasattr(engine.tokenizer, name)]
    return out


def contract_refusal(engine: "Engine", vision: bool = False) -> str | None:
    """One line naming the engine's class and every member :func:`missing_members` finds, or None."""
    from oracles.engines.base import REQUIRED_MEMBERS

    missing = missing_members(engine, vision)
    if not missing:
        return None
    cls = type(engine)
    members = ", ".join(REQUIRED_MEMBERS)
    tokenizer = ", ".join(TOKENIZER_MEMBERS + (VISION_TOKENIZER_MEMBERS if vision else ()))
    return (f"{cls.__module__}.{cls.__qualname__} breaks the engine contract: {', '.join(missing)} "
            f"(oracles.engines.base.Engine requires {members}; a tokenizer has {tokenizer}: "
            f"oracles.engines.types.Tokenizer)")


def _expect_type(engine: "Engine", call: str, value: Any, cls: type) -> None:
    if not isinstance(value, cls):
        raise EngineContractError(f"engine {engine.id} {call}: returned {seen(value)}; expected "
                                  f"{cls.__module__}.{cls.__qualname__}")


def prompt_rows(prompt: Prompt | Sequence[int], keep: int) -> tuple[int | None, str]:
    """The rows ``T`` a forward of ``prompt`` with ``keep`` returns, and why: the last ``keep`` of its ids
    (all of them for ``keep == 0``); None (not checked) for a prompt with pictures, whose ids the engine's
    processor may expand."""
    if isinstance(prompt, Prompt) and prompt.has_media:
        return None, f"(a prompt with pictures, keep={keep})"
    n = len(prompt.ids) if isinstance(prompt, Prompt) else len(prompt)
    rows = min(keep, n) if keep > 0 else n
    return rows, f"with T = {rows} ({n} prompt ids, keep={keep}), V = vocab_size, D = hidden_size"


def check_step(engine: "Engine", call: str, step: Any, rows: int | None, why: str, layers: bool = False) -> None:
    """Check a :class:`Step` ``engine`` returned from ``call``: logits ``[T, V]`` and hidden ``[T, D]``
    float32 (``T`` = ``rows``, any where None), ``layers`` ``[L + 1, T, D]`` float32 when asked (or
    given), ``positions`` ``[3, T]`` integers when given.

    Raises:
        EngineContractError: the first field that breaks this (named, with what came back).
    """
    _expect_type(engine, call, step, Step)
    logits = step.logits
    if rows is None and isinstance(logits, np.ndarray) and logits.ndim == 2:
        rows = int(logits.shape[0])
    expect_f4(engine, call, "Step.logits", logits, "T, V", (rows, engine.vocab_size), why)
    expect_f4(engine, call, "Step.hidden", step.hidden, "T, D", (rows, engine.hidden_size), why)
    if layers or step.layers is not None:
        expect_f4(engine, call, "Step.layers", step.layers, "L + 1, T, D",
                  (engine.num_layers + 1, rows, engine.hidden_size), f"{why}, L = num_layers (layers={layers})")
    positions = step.positions
    if positions is not None and not (isinstance(positions, np.ndarray) and positions.dtype.kind in "iu"
                                      and positions.shape == (3, rows)):
        raise EngineContractError(f"engine {engine.id} {call}: Step.positions is {seen(positions)}; expected "
                                  f"integers [3, T] = [3, {rows}] or None {why}")


def check_generation(engine: "Engine", call: str, gen: Any) -> None:
    """Check a :class:`Generation`: ``step_logits`` float32 ``[N, V]`` (its row count is the generate
    family's own check).

    Raises:
        EngineContractError: as :func:`expect_f4`.
    """
    _expect_type(engine, call, gen, Generation)
    expect_f4(engine, call, "Generation.step_logits", gen.step_logits, "N, V", (None, engine.vocab_size),
              "with V = vocab_size")


def install_checks(engine: "Engine") -> None:
    """Check what ``engine`` returns on every call from now on (module docstring): its ``forward``,
    ``decode_cohort``, ``lm_head``, ``final_norm``, ``generate`` and ``speculative``, the buffer and digest
    methods and the system capabilities become instance attributes that call the class's own and check the
    result. Installed once (a second call does nothing)."""
    from oracles.engines.contract_systems import checked_buffers, checked_systems

    own = vars(engine)
    if "forward" in own:
        return
    forward, cohort, head, norm = engine.forward, engine.decode_cohort, engine.lm_head, engine.final_norm
    generate, speculative = engine.generate, engine.speculative

    def checked_forward(prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                        layers: bool = False) -> Step:
        step = forward(prompt, cache, keep, layers)
        check_step(engine, "forward()", step, *prompt_rows(prompt, keep), layers=layers)
        return step

    def checked_cohort(tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        step = cohort(tokens, caches)
        check_step(engine, "decode_cohort()", step, len(tokens),
                   f"with B = {len(tokens)} lanes, V = vocab_size, D = hidden_size")
        return step

    def checked_head(hidden: np.ndarray) -> np.ndarray:
        out = head(hidden)
        expect_f4(engine, "lm_head()", "the return value", out, "T, V", (*np.shape(hidden)[:-1], engine.vocab_size),
                  f"for hidden {list(np.shape(hidden))}, V = vocab_size")
        return out

    def checked_norm(residual: np.ndarray) -> np.ndarray:
        out = norm(residual)
        expect_f4(engine, "final_norm()", "the return value", out, "T, D", np.shape(residual),
                  f"for residual {list(np.shape(residual))}")
        return out

    def checked_generate(prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                         max_kv_size: int | None = None) -> Generation:
        gen = generate(prompt, sampler, max_new_tokens, max_kv_size)
        check_generation(engine, "generate()", gen)
        return gen

    def checked_speculative(prompt: Prompt | Sequence[int], draft: "Engine", num_draft: int, max_new_tokens: int,
                            max_kv_size: int | None = None) -> Generation:
        gen = speculative(prompt, draft, num_draft, max_new_tokens, max_kv_size)
        check_generation(engine, "speculative()", gen)
        return gen

    own.update(forward=checked_forward, decode_cohort=checked_cohort, lm_head=checked_head, final_norm=checked_norm,
               generate=checked_generate, speculative=checked_speculative, **checked_buffers(engine),
               **checked_systems(engine))
