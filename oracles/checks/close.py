"""Closeness figures between a reference and a port: max |d|, NMSE, KL divergence, argmax agreement.

Pure numpy, computed in float64 from float32 inputs so the figure itself adds no rounding of note.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def log_softmax64(logits: Any) -> np.ndarray:
    """log-softmax over the last axis in float64: ``x - max - log(sum(exp(x - max)))``."""
    x = np.asarray(logits, dtype=np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_divergence(ref_logits: Any, port_logits: Any) -> np.ndarray:
    """KL(reference || port) per row, in nats: ``sum p_ref * (log p_ref - log p_port)`` over the last axis.

    Source: Kullback & Leibler (1951); the direction weights by the reference's probabilities, as
    llama.cpp's ``perplexity --kl-divergence`` reports it.
    """
    lr, lp = log_softmax64(ref_logits), log_softmax64(port_logits)
    return np.maximum((np.exp(lr) * (lr - lp)).sum(axis=-1), 0.0)


def nmse(ref: Any, port: Any) -> float:
    """Normalised mean squared error ``sum((port - ref)^2) / sum(ref^2)`` (0 when ref is all zero and equal)."""
    r, p = np.asarray(ref, dtype=np.float64), np.asarray(port, dtype=np.float64)
    den = float((r * r).sum())
    num = float(((p - r) ** 2).sum())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf"))


def argmax_agreement(ref_logits: Any, port_logits: Any) -> tuple[float, int | None]:
    """Share of rows whose argmax agrees, and the first disagreeing row (None when all agree)."""
    a = np.asarray(ref_logits).argmax(axis=-1).reshape(-1)
    b = np.asarray(port_logits).argmax(axis=-1).reshape(-1)
    same = a == b
    first = None if same.all() else int(np.argmin(same))
    return float(same.mean()) if same.size else 1.0, first


def logit_figures(ref_logits: Any, port_logits: Any) -> dict[str, Any]:
    """Every closeness figure of two ``[T, V]`` logit arrays, JSON-safe, for the receipt."""
    r, p = np.asarray(ref_logits, dtype=np.float32), np.asarray(port_logits, dtype=np.float32)
    if r.shape != p.shape:
        raise ValueError(f"logit shapes differ: {list(r.shape)} vs {list(p.shape)}")
    kl = kl_divergence(r, p)
    agree, first = argmax_agreement(r, p)
    return {"rows": int(r.shape[0]) if r.ndim > 1 else 1, "argmax_agreement": agree, "first_argmax_disagreement": first,
            "max_abs": float(np.abs(r.astype(np.float64) - p).max()) if r.size else 0.0, "nmse": nmse(r, p),
            "kl_mean": float(kl.mean()), "kl_max": float(kl.max()),
            "bit_equal": bool(np.array_equal(r.view("<u4"), p.view("<u4")))}
