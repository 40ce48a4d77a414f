"""Cache self-consistency on one engine: logits computed through a cache (a decode step, a chat turn's
suffix fed to the live cache) against a cold forward of the same ids with no cache. Pure numpy.

The two differ only in how many rows each matmul and attention call runs at once, i.e. float32
summation order. A stale, missing or shifted cache entry changes what the model attends to. The
mtplx decode test, the mtplx_chat warm-vs-cold test and the fault panel's matching rows all call
:func:`cache_failure`, so the detection matrix reports what the suite checks.

Three criteria, each must hold per row (the bounds are a :class:`oracles.checks.tolerance.Tolerance`'s,
derived there; the engine's own in a family test):

- ``max |Δlogit| <= cache_atol`` (absolute, for large logits);
- ``NMSE <= cache_nmse`` (scale-free, for small logits);
- the argmax agrees.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from oracles.checks.close import nmse
from oracles.checks.exact import diff
from oracles.checks.port import compared
from oracles.checks.tolerance import FLOAT32, Tolerance


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


def cache_failure(what: str, cached: Any, cold: Any, *, tolerance: Tolerance = FLOAT32) -> str | None:
    """One line naming the first criterion a cached row fails against its cold recompute, or None.

    ``what`` names the row (record, step or turn, prefix length). The max |Δ| failure gives the first
    index over ``tolerance.cache_atol`` with both values, the count and share, and max abs / rel error;
    NMSE (over ``tolerance.cache_nmse``) and argmax failures give their figures. Shapes ``[V]`` (or any
    equal shapes).

    Raises:
        ValueError: the shapes differ.
    """
    near = diff(cached, cold, atol=tolerance.cache_atol)
    fails = []
    if not near.equal:
        fails.append(near.describe("cached vs cold", f"differ by more than {tolerance.cache_atol:g}"))
    err = nmse(cold, cached)
    if not err <= tolerance.cache_nmse:
        fails.append(f"NMSE {compared(err, '>', tolerance.cache_nmse)} (max |Δ| {near.max_abs:.3e})")
    a, b = int(np.asarray(cached).argmax()), int(np.asarray(cold).argmax())
    if a != b:
        fails.append(f"argmax cached {a} vs cold {b}")
    return f"{what}: " + "; ".join(fails) if fails else None
