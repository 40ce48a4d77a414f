"""What the MLX port needs for hybrid (Gated DeltaNet + attention) models: reading a transformers
Qwen3.5 *text* snapshot with mlx-lm's ``qwen3_5`` model, and the library's own refusals on it.

Config translation (recorded as the engine's ``config_overrides``). transformers writes a text-only
Qwen3.5 as ``model_type: "qwen3_5_text"`` with an explicit ``layer_types`` list; mlx-lm 0.32 has no
``qwen3_5_text`` module ("Model type qwen3_5_text not supported") and its ``qwen3_5`` model (which
reads a flat text config as its ``text_config``) places full attention at every
``full_attention_interval``-th layer, ignoring ``layer_types``. So the override is
``{"model_type": "qwen3_5", "full_attention_interval": N}`` with ``N`` read off ``layer_types``, and a
``layer_types`` list that no interval reproduces is refused (:func:`unsupported_reason`; the engine
raises ``Unsupported`` with it) rather than run with attention in the wrong layers. The snapshot's
``config.json`` keeps ``qwen3_5_text``: written as ``qwen3_5``, transformers' Auto classes would build
the default vision-language config (hidden 4096, vocabulary 248,320) instead of the snapshot's. RoPE
needs nothing: mlx-lm's ``qwen3_5`` reads ``rope_parameters`` itself (theta, partial rotary factor;
``mrope_section`` is read only for ``rope_type: "mrope"``, and text positions put one position on all
three M-RoPE planes, which is plain RoPE).

Also here: what mlx-lm is measured to get wrong on the oracles (:data:`KNOWN_GAPS`, the port's
``known_gap``), beside what it refuses (:func:`speculative_refusal`).

Imports neither mlx nor mlx-lm at module import; :func:`speculative_refusal` imports them when called.
"""

from __future__ import annotations

from typing import Any

#: Measured failures of mlx-lm on the oracles (``MlxPort.known_gap``), by the name the test gives:
#: (the pins it was measured on, the figure and the cause). A library bug shows only where the model
#: exercises it: this one needs a draft rejected after the window wrapped, and a model whose greedy
#: output ignores its context (an untrained pin repeating one token) gives equal tokens even with stale
#: cache entries; so the strict xfail is expected only on the pins it was measured on.
KNOWN_GAPS: dict[str, tuple[frozenset[str], str]] = {
    "speculative past a KV window": (frozenset({"smollm2-135m-instruct"}), (
        "mlx-lm 0.32.2 speculative_generate_step keeps rejected drafts once a RotatingKVCache has wrapped: its "
        "_rewind_cache ignores trim_prompt_cache's count, which is 0 when offset >= max_size (is_trimmable); "
        "measured on 'arith', window 48, twin draft: the target cache reaches offset 48 at the 3rd token, "
        "trims 0 of 3 from then on, and the tokens differ from AR from position 3 (198 vs 40; 64-token cap: 60 of 64 differ)")),
}


#: transformers' text-only Qwen3.5 model type, and the mlx-lm model that reads it.
TEXT_TYPE = "qwen3_5_text"
MLX_TYPE = "qwen3_5"


def interval_of(layer_types: list[str]) -> int | None:
    """The ``full_attention_interval`` whose placement (full attention at layers ``i`` with
    ``(i + 1) % N == 0``, as mlx-lm's ``qwen3_5.DecoderLayer`` decides) gives ``layer_types``
    exactly; None when no interval does (no full-attention layer, or an irregular placement).

    >>> interval_of(["linear_attention"] * 3 + ["full_attention"])
    4
    """
    if "full_attention" not in layer_types:
        return None
    n = layer_types.index("full_attention") + 1
    want = ["linear_attention" if (i + 1) % n else "full_attention" for i in range(len(layer_types))]
    return n if list(layer_types) == want else None


def unsupported_reason(config: dict[str, Any]) -> str | None:
    """Why mlx-lm's ``qwen3_5`` model cannot run a ``qwen3_5_text`` ``config`` (its config.json), or
    None (also for every other model type: not this module's concern)."""
    if config.get("model_type") != TEXT_TYPE:
        return None
    types = config.get("layer_types")
    if not isinstance(types, list) or interval_of(types) is None:
        return (f"mlx-lm's {MLX_TYPE} model places full attention by full_attention_interval only; layer_types "
                f"{types!r} is not such a placement")
    return None


def overrides(config: dict[str, Any]) -> dict[str, Any] | None:
    """mlx-lm ``model_config`` entries that load a ``qwen3_5_text`` ``config`` as transformers does
    (module docstring), or None for any other model type.

    Raises:
        ValueError: the config's ``layer_types`` has no interval placement (:func:`unsupported_reason`).
    """
    if config.get("model_type") != TEXT_TYPE:
        return None
    why = unsupported_reason(config)
    if why:
        raise ValueError(why)
    return {"model_type": MLX_TYPE, "full_attention_interval": interval_of(config["layer_types"])}


def speculative_refusal(model: Any) -> str | None:
    """mlx-lm's own refusal of speculative decoding for ``model``, quoted, or None where it serves it.

    mlx-lm's ``speculative_generate_step`` checks its prompt cache with ``can_trim_prompt_cache``
    before any forward and raises ``ValueError`` for a cache it cannot trim (recurrent layers); that
    check is the library's predicate here, and its message is obtained by starting the generator (it
    raises on the first ``next``, before any compute).
    """
    import mlx.core as mx
    import mlx_lm
    from mlx_lm.generate import speculative_generate_step
    from mlx_lm.models.cache import can_trim_prompt_cache, make_prompt_cache

    if can_trim_prompt_cache(make_prompt_cache(model)):
        return None
    try:
        next(speculative_generate_step(mx.array([0], dtype=mx.int32), model, model, num_draft_tokens=1, max_tokens=1))
    except ValueError as exc:
        return f"mlx-lm {mlx_lm.__version__} speculative_generate_step: {exc}"
    return None
