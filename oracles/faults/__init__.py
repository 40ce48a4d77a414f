"""The fault panel: ports that wrap a faithful transformers engine and inject one fault each, so the
suite's checks can be shown to catch what real ports get wrong and to pass a faithful port.

    from oracles.faults import fault_port
    port = fault_port("gate_up_swapped", reference)     # reference: a loaded TorchReference
    port.forward(ids)                                    # the reference's forward with the fault in force

:data:`FAULTS` lists every kind (name -> class); :data:`CONTROL` is the faithful port. Faults that need
a model feature the pin lacks run on a variant (:data:`VARIANTS`: the window fault on the windowed
variant of the pin). Numpy-free and torch-free at import.
"""

from __future__ import annotations

from oracles.engines.base import Engine
from oracles.faults import kinds
from oracles.faults.port import FaultPort
from oracles.faults.window import SlidingWindow, WindowOffByOne

#: Every fault kind of the panel, in the detection matrix's row order: the RoPE and attention layout first,
#: then norms and head, cache positions and trimming, batching, precision, the window, the MLP.
FAULTS: dict[str, type[kinds.Fault]] = {cls.name: cls for cls in (
    kinds.RopeBaseDefault, kinds.QkInterleaved, kinds.RmsEps, kinds.FinalNormSkipped, kinds.UntiedHeadRow,
    kinds.DecodePositionOffByOne, kinds.TrimKeepsStaleRow, kinds.CohortSeesPadding, kinds.Bf16PerLayer,
    WindowOffByOne, kinds.GateUpSwapped)}
#: The faithful control (eager attention: float32 reordering only).
CONTROL = kinds.Faithful.name
#: Fault name -> the variant of the faithful engine it is injected into (and held against).
VARIANTS: dict[str, type[kinds.Fault]] = {WindowOffByOne.name: SlidingWindow}


def reference_for(name: str, base: Engine) -> Engine:
    """The faithful engine fault ``name`` is held against: ``base`` itself, or its variant
    (a :class:`FaultPort` of ``base`` with the variant in force) for a fault in :data:`VARIANTS`."""
    variant = VARIANTS.get(name)
    return base if variant is None else FaultPort(base, variant())


def fault_port(name: str, base: Engine, reference: Engine | None = None) -> FaultPort:
    """The port with fault ``name`` (or the control, :data:`CONTROL`) on the faithful ``base``.

    ``reference``: the faithful engine to wrap when the caller holds one already (its variant, from
    :func:`reference_for`); defaults to ``reference_for(name, base)``.

    Raises:
        KeyError: an unknown name (the known ones listed).
        oracles.engines.base.Unsupported: the fault cannot be injected into this model.
    """
    if name == CONTROL:
        return FaultPort(reference or base, kinds.Faithful())
    if name not in FAULTS:
        raise KeyError(f"unknown fault {name!r}; known: {CONTROL}, {', '.join(FAULTS)}")
    return FaultPort(reference or reference_for(name, base), FAULTS[name]())


__all__ = ["CONTROL", "FAULTS", "VARIANTS", "FaultPort", "fault_port", "reference_for"]
