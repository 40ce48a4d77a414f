"""Read-out of typed questions from the log-softmax at an answer slot. Pure numpy, no pytest.

Formula. With logits ``x`` (``[V]`` float32) at the answer slot:

    logz   = x - max(x) - log(sum(exp(x - max(x))))          (log-softmax, float32)
    s_g    = log(sum_{t in G_g} exp(logz_t))                   (group score: logsumexp over the group)
    p_g    = exp(s_g - max_h s_h) / sum_h exp(s_h - max_h s_h) (normalised over the groups)

so ``p_g = P(G_g) / sum_h P(G_h)``: the model's next-token probability mass on the tokens that spell
answer ``g``, renormalised over the answers. Sources: the verbalizer read-out of Schick & Schuetze,
"Exploiting Cloze Questions for Few Shot Text Classification" (EACL 2021), with each answer's
surface forms summed rather than one chosen, as Holtzman et al., "Surface Form Competition"
(EMNLP 2021) argue; the restriction to the answer set is their renormalisation. Group scores and
probabilities are computed in float64 from the float32 ``logz`` (one fixed order of operations, so
the same ``logz`` always gives the same bits).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np


def log_softmax(logits: Any) -> np.ndarray:
    """float32 log-softmax over the last axis: ``x - m - log(sum(exp(x - m)))``, ``m = max(x)``.

    Args:
        logits: ``[..., V]`` float32 (other dtypes are converted to float32 first).
    Returns:
        ``[..., V]`` float32.
    Raises:
        ValueError: a non-finite logit (count and first index named).
    """
    x = np.ascontiguousarray(np.asarray(logits), dtype=np.float32)
    bad = ~np.isfinite(x)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad.reshape(-1))), x.shape)
        raise ValueError(f"log_softmax: {int(bad.sum())} non-finite logits, first at {[int(i) for i in first]}")
    s = x - x.max(axis=-1, keepdims=True)
    return s - np.log(np.exp(s).sum(axis=-1, keepdims=True, dtype=np.float32))


def group_scores(logz: Any, groups: Sequence[Sequence[int]]) -> np.ndarray:
    """``s_g = logsumexp(logz[G_g])`` per group, float64 ``[G]``.

    Raises:
        ValueError: ``logz`` not 1-D, an empty group, or a token id out of range.
    """
    z = np.asarray(logz)
    if z.ndim != 1:
        raise ValueError(f"group_scores: logz must be [V], got shape {list(z.shape)}")
    out = np.empty(len(groups), dtype=np.float64)
    for g, ids in enumerate(groups):
        if not ids:
            raise ValueError(f"group_scores: group {g} is empty")
        if min(ids) < 0 or max(ids) >= z.shape[0]:
            raise ValueError(f"group_scores: group {g} holds a token id outside 0..{z.shape[0] - 1}")
        v = z[np.asarray(ids, dtype=np.int64)].astype(np.float64)
        m = v.max()
        out[g] = m + np.log(np.exp(v - m).sum())
    return out


def group_probabilities(logz: Any, groups: Sequence[Sequence[int]]) -> list[float]:
    """``p_g`` (module docstring) as Python floats, one per group, summing to 1 within float64 rounding."""
    s = group_scores(logz, groups)
    e = np.exp(s - s.max())
    return [float(v) for v in e / e.sum()]


def top2_gap(probs: Sequence[float]) -> float:
    """Largest minus second-largest probability (the whole probability for a single group)."""
    ordered = sorted(probs, reverse=True)
    return float(ordered[0] - (ordered[1] if len(ordered) > 1 else 0.0))


def argmax(probs: Sequence[float]) -> int:
    """Index of the largest probability (lowest index on a tie)."""
    return int(np.argmax(np.asarray(probs, dtype=np.float64)))


def max_abs_dp(a: Sequence[float], b: Sequence[float]) -> float:
    """``max_g |a_g - b_g|`` of two probability vectors of one question.

    Raises:
        ValueError: the lengths differ.
    """
    if len(a) != len(b):
        raise ValueError(f"max_abs_dp: {len(a)} vs {len(b)} probabilities")
    return float(max(abs(x - y) for x, y in zip(a, b)))


def assert_probs_equal(actual: Sequence[float], expected: Sequence[float], what: str) -> None:
    """Assert two probability vectors are equal bit for bit as float64, naming the first differing
    group with both values, the count and share of differing groups and the max abs difference.

    Raises:
        AssertionError: lengths or bits differ.
    """
    __tracebackhide__ = True
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    if a.shape != b.shape:
        raise AssertionError(f"{what}: {a.shape[0]} vs {b.shape[0]} probabilities")
    bad = a.view("<u8") != b.view("<u8")
    if bad.any():
        i = int(np.argmax(bad))
        raise AssertionError(f"{what}: {int(bad.sum())} of {a.size} probabilities differ in bits ({bad.mean():.0%}); "
                             f"first at group {i}: {float(a[i])!r} vs {float(b[i])!r}; "
                             f"max abs difference {np.abs(a - b).max():.3e}")
