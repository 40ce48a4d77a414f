"""How a port is judged against its reference: exactly (float32 bounds), or within a calibrated band.

A port that computes in float32 on the weights its reference holds (the same snapshot, or the float32
snapshot dequantized from the port's quantized artifact) differs from the reference by float32
reordering only: :data:`oracles.checks.tolerance.FLOAT32` holds it (``exact``). Measured on SmolLM2's
mlx-lm conversions: torch on the dequantized 4-bit snapshot vs mlx-lm on the 4-bit artifact, max
|Δlogit| 1.9e-4 on 64 ids (float32 vs MLX float32: 1.5e-4).

A port that computes in bfloat16 or float16 has no exact reference: every kernel rounds every
activation. Its bound is a *band*: the reference's own code run in the port's dtype (the band engine:
transformers with the weights cast, :class:`oracles.engines.torch.reference.TorchReference` with
``dtype``) is held against the float32 reference on the same record, and the port may be at most
:data:`BAND_RATIO` times as far (:func:`band_tolerance`). A faithful port's rounding is of the same
kind as the band's, so its figures sit near the band's; a bug adds an error of its own on top.

Pure: dataclasses and math (no numpy, no engine).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from oracles.checks.tolerance import Tolerance

#: How far past the band a reduced-precision port may be, per figure: max |Δlogit| (and the read-out
#: and near-tie bounds derived from it) this ratio, NMSE and KL its square (both grow as the square of
#: a small logit error: KL ~ Var(e) / 2). Measured on SmolLM2-135M over 224 positions ("ping" and a 193-token
#: paragraph), against the float32 reference: mlx-lm bfloat16 vs transformers bfloat16 max |Δlogit|
#: 1.50 vs 1.20 (ratio 1.25), KL mean 1.3e-3 vs 1.1e-3 (1.2), KL p99 6.9e-3 vs 4.5e-3 (1.5). Two
#: implementations of bfloat16 round in different places, so per record the ratio varies around 1;
#: 3 leaves room for that, while a real bug of a bfloat16 port (a RoPE base read wrongly: max
#: |Δlogit| 9.96 on "ping" in float32) is 8x the band's largest figure.
BAND_RATIO = 3.0


@dataclass(frozen=True)
class Judgment:
    """The judgment of one (reference pin, port pin) pair.

    ``kind``: ``"exact"`` (the port's own tolerance, FLOAT32 by default) or ``"band"`` (the band engine
    in ``dtype`` calibrates each record's bound); ``why``: one line for the receipt and the messages.
    """

    kind: str
    why: str
    dtype: str = "float32"

    @property
    def exact(self) -> bool:
        """Whether the port is held to its own float32 bounds (tokens equal, every threshold as is)."""
        return self.kind == "exact"

    def as_json(self) -> dict[str, Any]:
        """``{"kind", "dtype", "why"}`` for the receipt."""
        return {"kind": self.kind, "dtype": self.dtype, "why": self.why}


def band_tolerance(base: Tolerance, band: dict[str, Any], ratio: float = BAND_RATIO) -> Tolerance:
    """``base`` with its port bounds set from the band's figures on one record: max |Δlogit| ``ratio``
    times the band's, NMSE and KL max ``ratio**2`` times (each a square of the logit error), the near tie and the
    read-out bounds scaled from the band's max |Δlogit| as :data:`FLOAT32` derives them from its own
    (near tie twice it; max |Δp| half it, key margin twice that); bisect's noise floor the band's largest
    stage NMSE (``band["stage_nmse_max"]``, when measured) with margin ``ratio**2``.

    ``band``: :func:`oracles.checks.port.port_figures` of the float32 reference against the band
    engine on the same rows (``max_abs``, ``nmse``, ``kl_max``), optionally ``stage_nmse_max``.

    Raises:
        ValueError: a figure missing or not a non-negative finite number (named), as Tolerance raises.
    """
    for key in ("max_abs", "nmse", "kl_max"):
        if not isinstance(band.get(key), (int, float)):
            raise ValueError(f"band figures: {key!r} is missing or not a number ({band.get(key)!r})")
    max_abs = ratio * float(band["max_abs"])
    bisect = {}
    if isinstance(band.get("stage_nmse_max"), (int, float)):
        bisect = {"bisect_floor_at_0": float(band["stage_nmse_max"]), "bisect_floor_per_layer": 0.0,
                  "bisect_margin": ratio ** 2, "bisect_sublayer_floor": float(band["stage_nmse_max"])}
    return replace(base, name=f"band x{ratio:g}", max_abs_logit=max_abs, max_nmse=ratio ** 2 * float(band["nmse"]),
                   max_kl=ratio ** 2 * float(band["kl_max"]), near_tie=2 * max_abs, max_abs_dp=max_abs / 2,
                   key_margin=max_abs, **bisect)


__all__ = ["BAND_RATIO", "Judgment", "band_tolerance"]
