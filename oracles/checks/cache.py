"""Cache self-consistency on one engine: logits computed through a cache (a decode step, a chat turn's
suffix fed to the live cache) against a cold forward of the same ids with no cache. Pure numpy.

The two differ only in how many rows each matmul and attention call runs at once, i.e. float32
summation order. A stale, missing or shifted cache entry changes what the model attends to. The
mtplx decode test, the mtplx_chat warm-vs-cold test and the fault panel's matching rows all call
:func:`cache_failure`, so the detection matrix reports what the suite checks.

Three criteria, each must hold per row:

- ``max |Δlogit| <= CACHE_ATOL`` (absolute, for large logits);
- ``NMSE <= CACHE_NMSE`` (scale-free, for small logits);
- the argmax agrees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oracles.checks.close import nmse
from oracles.checks.exact import diff
from oracles.checks.port import MAX_NMSE, compared

#: max |Δlogit|. The reference measured ~3e-5 between a last row computed with 1 vs T rows; over 30
#: layers and up to ~1,700 attended positions the reorderings compound to 1e-4..1e-3 at logits of
#: magnitude ~30 (MLX 1.5e-4 on "ping" vs torch). 2e-3 is above that and ~250x below what a stale or
#: misplaced cache entry does to SmolLM2's logits (changes of 0.5 and more).
CACHE_ATOL = 2e-3
#: NMSE, ``sum(Δ^2) / sum(cold^2)`` over the row: the same bound, and the same derivation, as the port
#: threshold (:data:`oracles.checks.port.MAX_NMSE`, ``(5e-3 / 5)^2``). The absolute bound alone
#: misses a real fault on an untrained pin. A seeded 3-layer Llama at transformers' default
#: initialisation has logits of std ~0.16, and a decode position off by one moved them by at most
#: 1.09e-3, inside CACHE_ATOL. Its NMSE was 1.68e-6, over this bound. The faithful torch engine on
#: that model: max |Δ| 3e-7. Measured cached vs cold on the built-in pins (decode and chat records,
#: ``--port-records all``): torch NMSE 3.1e-12 on SmolLM2's decode, at most 1.4e-10 over both pins'
#: chats; MLX bit-equal in every case. The bound is ~7,000x the largest.
CACHE_NMSE = MAX_NMSE


def cache_figures(cached: Any, cold: Any) -> dict[str, Any]:
    """The figures of one cached row against its cold recompute, JSON-safe, for the receipt.

    Args:
        cached: ``[V]`` logits through the cache (float32, or castable to it).
        cold: ``[V]`` logits of the cold forward of the same ids.

    Returns:
        ``bit_equal``, ``max_abs``, ``max_ulp``, ``nmse`` (float64 over the row), ``argmax_agree``.

    Raises:
        ValueError: the shapes differ.
    """
    bits = diff(cached, cold)
    return {"bit_equal": bits.equal, "max_abs": bits.max_abs, "max_ulp": bits.max_ulp, "nmse": nmse(cold, cached),
            "argmax_agree": int(np.asarray(cached).argmax()) == int(np.asarray(cold).argmax())}


def cache_failure(what: str, cached: Any, cold: Any) -> str | None:
    """One line naming the first criterion a cached row fails against its cold recompute, or None.

    ``what`` names the row (record, step or turn, prefix length). The max |Δ| failure gives the first
    index over CACHE_ATOL with both values, the count and share, and max abs / rel error; NMSE
    and argmax failures give their figures. Shapes ``[V]`` (or any equal shapes).

    Raises:
        ValueError: the shapes differ.
    """
    near = diff(cached, cold, atol=CACHE_ATOL)
    fails = []
    if not near.equal:
        fails.append(near.describe("cached vs cold", f"differ by more than {CACHE_ATOL:g}"))
    err = nmse(cold, cached)
    if not err <= CACHE_NMSE:
        fails.append(f"NMSE {compared(err, '>', CACHE_NMSE)} (max |Δ| {near.max_abs:.3e})")
    a, b = int(np.asarray(cached).argmax()), int(np.asarray(cold).argmax())
    if a != b:
        fails.append(f"argmax cached {a} vs cold {b}")
    return f"{what}: " + "; ".join(fails) if fails else None
