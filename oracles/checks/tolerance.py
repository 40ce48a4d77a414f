"""Every bound a check or a family applies, as one object: :class:`Tolerance`, and :data:`FLOAT32`.

An engine answers with its own (:meth:`oracles.engines.base.Engine.tolerance`, :data:`FLOAT32` by
default); a port test holds the port to the port's. The pure functions of :mod:`oracles.checks` take
a Tolerance as a keyword argument (``tolerance=FLOAT32`` by default), so a reader with no engine at
hand (``oracles compare`` on two receipts) applies the same bounds.

The float32 bounds are for a port that computes the reference's float32 graph in another order
(other BLAS blocking, fused kernels, another attention kernel) and nothing else. Measured here, MLX
(CPU) against transformers on SmolLM2-135M-Instruct: max |Δlogit| 1.5e-4 on the 31-token "ping"
prefill, logits of magnitude up to ~30, so about 40 float32 ULPs at that magnitude after 30 layers.
Each bound's derivation is beside its value in :data:`FLOAT32`; a port of another precision gets its
own instance (``dataclasses.replace(FLOAT32, ...)``) from its engine.

Pure: dataclasses and math only (``oracles summarize`` imports it and stays light).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields


@dataclass(frozen=True, kw_only=True)
class Tolerance:
    """The bounds one engine is held to. Every field is a non-negative finite float; a value over a
    ``max``/``atol`` bound fails (``>``), a near-tie or margin field says where a flip is forgiven.

    Port vs reference (:mod:`oracles.checks.port`), per ``[T, V]`` float32 logit array:
    ``max_abs_logit`` (max |Δlogit|, logit units), ``max_nmse`` (sum Δ² / sum ref² per array),
    ``max_kl`` (KL(ref‖port) per row, nats), ``near_tie`` (an argmax may differ where the reference's
    top-2 logit gap is below it); per read-out: ``max_abs_dp`` (max |Δp| over the options' probabilities),
    ``key_margin`` (the answer may differ where the reference's top-2 probability gap is at most it);
    per picture: ``pixel_atol`` (max |Δ| of the processors' float32 pixel rows).

    One engine against itself: ``head_rerun_atol`` / ``vision_head_rerun_atol`` (lm_head on kept
    hidden rows vs the logits, text and vision-language pins), ``logz_f64_atol`` (float32 vs float64
    log-softmax), ``prob_sum_atol`` (|sum p - 1| of a read-out, float64), ``tree_row_dp`` (d1 tree vs
    row max |Δp|), ``cache_atol`` / ``cache_nmse`` (logits through a cache vs a cold forward, per row:
    :mod:`oracles.checks.cache`), ``cohort_atol`` (batched vs serial max |Δlogit| per step:
    :mod:`oracles.checks.cohort`), ``self_draft_acceptance`` (the least share of self-drafted tokens
    accepted, 0..1).

    Localisation (:mod:`oracles.checks.bisect`), per-row NMSE of a stage: ``bisect_floor_at_0`` +
    ``bisect_floor_per_layer`` x depth is the noise floor, ``bisect_margin`` times it the budget;
    ``bisect_sublayer_floor`` is one layer's attention or MLP output's floor.

    Records (d1): ``readout_near_tie`` (a question whose top-2 probability gap is at most it is
    labelled a near tie in the receipt), ``red_arm_min`` (a control arm must move some option's
    probability by more than it).

    Raises:
        ValueError: a field that is negative, NaN or infinite (named).
    """

    name: str
    max_abs_logit: float
    max_nmse: float
    max_kl: float
    near_tie: float
    max_abs_dp: float
    key_margin: float
    pixel_atol: float
    head_rerun_atol: float
    vision_head_rerun_atol: float
    logz_f64_atol: float
    prob_sum_atol: float
    tree_row_dp: float
    cache_atol: float
    cache_nmse: float
    cohort_atol: float
    self_draft_acceptance: float
    bisect_floor_at_0: float
    bisect_floor_per_layer: float
    bisect_margin: float
    bisect_sublayer_floor: float
    readout_near_tie: float
    red_arm_min: float

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name != "name" and (isinstance(value, bool) or not isinstance(value, (int, float))
                                     or not math.isfinite(value) or value < 0):
                raise ValueError(f"Tolerance {self.name!r}: field {f.name!r} is {value!r}; every bound is a "
                                 "non-negative finite float")


_MAX_ABS_LOGIT = 5e-3
_MAX_NMSE = 1e-6
_MAX_ABS_DP = _MAX_ABS_LOGIT / 2

#: The float32 bounds (module docstring: a port of the same float32 graph in another order).
FLOAT32 = Tolerance(
    name="float32",
    # max |Δlogit|: 30x the measured 1.5e-4, room for longer contexts (the error grows with the number
    # of attended positions) yet 100x below the 0.5+ a real bug gives (a wrong RoPE base measured 9.96).
    max_abs_logit=_MAX_ABS_LOGIT,
    # NMSE: (5e-3 / typical |logit| of ~5)^2 = 1e-6; a sign or scale error gives >1e-2.
    max_nmse=_MAX_NMSE,
    # KL(ref‖port) in nats, per row: for small logit noise e, KL ~ Var_p(e)/2 <= (5e-3)^2 / 2 = 1.25e-5.
    max_kl=1.25e-5,
    # An argmax may differ only where the reference's top-2 gap is below this (a near tie that float32
    # reordering can flip): twice the max |Δlogit| allowed.
    near_tie=2 * _MAX_ABS_LOGIT,
    # max |Δp| over one question's read-out probabilities (d1, clef). With p = softmax(s) over the group
    # scores s_g = logsumexp(x[G_g]) - logsumexp(x) (oracles.checks.readout), a logit error of at most e
    # moves each logsumexp by at most e, so every s_g - s_h by at most 2e; to first order
    # dp_g = p_g * sum_h p_h (ds_g - ds_h), so |dp_g| <= p_g (1 - p_g) 2e <= e / 2. A port within
    # max_abs_logit therefore moves no probability by more than max_abs_logit / 2 = 2.5e-3; this bound
    # is the threshold, so Δp and Δlogit hold a port to the same float32 standard.
    max_abs_dp=_MAX_ABS_DP,
    # The argmax *key* of a question (the answer) may differ only where the reference's top-2 gap of the
    # read-out probabilities is at most this: two options each moved by at most max_abs_dp, in opposite
    # directions, close a gap of at most 2 * max_abs_dp = 5e-3, so a larger gap flips only when the
    # port is outside the Δp threshold too (the key failure then names the answer that changed).
    # Measured MLX (CPU) vs torch on the d1 port sample (4 rows + 2 tree branches, receipt tag d1cmp):
    # max |Δp| 7.5e-6 (max |Δlogit| 8.0e-5), so the margin is ~670x the measured noise; a gap at most
    # the margin is a near tie that float32 reordering may flip, and is recorded, not failed.
    key_margin=2 * _MAX_ABS_DP,
    # Pixel rows: both processors compute (x / 255 - mean) / std in float32 from the same PIL pixels,
    # in another order of operations (two or three roundings each side, each at most half a ULP: 6e-8
    # for |x| < 1). Measured on every built-in clef row: max |Δ| 1.19e-7 (one ULP in [0.5, 1)) on ~7 %
    # of values; 3e-7 bounds three roundings, while a wrong mean, std or channel order moves values by
    # > 1e-2.
    pixel_atol=3e-7,
    # lm_head re-run (forward, d1, cohort). The re-run multiplies the same float32 hidden rows by the
    # same weight; only the BLAS blocking may differ with the row count, which reorders the 576-term
    # dot products. That moves a logit of magnitude <= 32 by a few float32 ULPs (ULP(32) = 3.8e-6), so
    # 1e-5 allows reordering and nothing more; bit equality is recorded beside it.
    head_rerun_atol=1e-5,
    # lm_head re-run on the vision-language pin (clef): the same float32 hidden row through the same
    # head is the same matmul, bit for bit on both engines there (receipt: bit_equal); 1e-6 is the
    # clef reference program's allclose, far below a logit's ULP at |x| ~ 4 (its logits' magnitude).
    vision_head_rerun_atol=1e-6,
    # float32 log-softmax vs float64: x - m and the log of a float32 sum each round once at magnitudes
    # <= 40 (ULP(32) = 3.8e-6); 1e-5 is three such roundings.
    logz_f64_atol=1e-5,
    # A read-out's probabilities are normalised in float64 over a handful of options: their sum is 1
    # to a few float64 ULPs (2.2e-16 each); 1e-12 allows thousands, while a dropped or doubled option
    # moves it by its whole probability.
    prob_sum_atol=1e-12,
    # d1 tree vs row: the branch attends over cached keys/values in matmuls of another shape than the
    # full row, so its logits differ by float32 reordering only: on torch, over the 42 tree questions,
    # max |dlogit| 4.4e-5 and max |dp| 4.1e-6 (receipt: test_tree_vs_row max_abs_dlogit / max_abs_dp).
    # 1e-4 is 25x that, while any real change of the prefix (a missing or extra token, a stale cache)
    # moves answers by far more (the adopted red arms move by 0.028 to 0.13).
    tree_row_dp=1e-4,
    # Cache vs cold, max |Δlogit|. The reference measured ~3e-5 between a last row computed with 1 vs
    # T rows; over 30 layers and up to ~1,700 attended positions the reorderings compound to 1e-4..1e-3
    # at logits of magnitude ~30 (MLX 1.5e-4 on "ping" vs torch). 2e-3 is above that and ~250x below
    # what a stale or misplaced cache entry does to SmolLM2's logits (changes of 0.5 and more).
    cache_atol=2e-3,
    # Cache vs cold, NMSE sum(Δ^2) / sum(cold^2) over the row: the same bound, and the same derivation,
    # as the port's max_nmse ((5e-3 / 5)^2). The absolute bound alone misses a real fault on an
    # untrained pin. A seeded 3-layer Llama at transformers' default initialisation has logits of std
    # ~0.16, and a decode position off by one moved them by at most 1.09e-3, inside cache_atol. Its
    # NMSE was 1.68e-6, over this bound. The faithful torch engine on that model: max |Δ| 3e-7.
    # Measured cached vs cold on the built-in pins (decode and chat records, --port-records all): torch
    # NMSE 3.1e-12 on SmolLM2's decode, at most 1.4e-10 over both pins' chats; MLX bit-equal in every
    # case. The bound is ~7,000x the largest.
    cache_nmse=_MAX_NMSE,
    # Cohort vs serial max |d logit| on an engine that is not bit-exact. Measured here over the FULL
    # span (132 steps, torch, one thread): SmolLM2-135M 7.5e-5, the hybrid twin 6.1e-5, the draft twin
    # 7.2e-7. 1e-3 is 13x the largest; the cohort bugs it must catch are four orders larger (measured
    # breaking the torch decode_cohort at step 0 of these lanes on SmolLM2: the left padding left
    # unmasked moves the three padded lanes' logits by 2.6 to 6.5, every position id one off moves all
    # four by 1.3 to 4.2).
    cohort_atol=1e-3,
    # An engine drafting for itself: a rejection needs a near tie flipped between a 1-row and a
    # (d+1)-row forward, so at least 90% of drafts are accepted (a broken rollback rejects most).
    self_draft_acceptance=0.9,
    # Bisect's noise envelope of the per-row NMSE of the stream: floor_at_0 + floor_per_layer x depth
    # bounds every measured depth (the table in oracles.checks.bisect: torch vs MLX on "ping").
    bisect_floor_at_0=5e-12,
    bisect_floor_per_layer=1e-12,
    # Budget / floor: 1000 in NMSE is ~32x in RMS error, room for longer contexts, other float32
    # kernels and devices, yet 230x below the smallest fault of the panel.
    bisect_margin=1000.0,
    # Noise floor of one layer's attention or MLP output (measured max 1.4e-10 over the 30 layers).
    bisect_sublayer_floor=1.5e-10,
    # d1's near-tie label: the d1 read-out program's threshold on a question's top-2 probability gap.
    readout_near_tie=0.02,
    # A d1 red arm is adopted as a control only when it moves some option's probability by more than
    # this on the reference (oracles.families.d1.arms); the suite holds every engine to the same move.
    red_arm_min=0.02,
)

__all__ = ["FLOAT32", "Tolerance"]
