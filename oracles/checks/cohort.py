"""Lane maps and per-step, per-lane, per-buffer bit comparison of a decode cohort against serial lanes.

Pure numpy; no pytest import. A *lane state* is a mapping of quantity name to float32 array: ``hidden``
``[D]``, ``logits`` ``[V]`` and a cache's buffers named ``layers.<i>.<buffer>`` (``keys``, ``values``,
``conv_state``, ``recurrent_state``; valid rows only), as :meth:`oracles.engines.base.Engine.cache_views`
names them. A lane map ``physical_to_logical`` says which logical lane each physical row of a batch
holds: ``physical[p]`` is logical lane ``map[p]``.

The comparison is bitwise (``uint32`` views: NaN payloads and the sign of zero count), its failures name
the step, the logical and physical lane, the layer and buffer, the first index and both values.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from oracles.checks.tolerance import FLOAT32, Tolerance

LaneState = Mapping[str, np.ndarray]


def serial_gap_failure(what: str, serial: Any, cohort: Any, *, tolerance: Tolerance = FLOAT32) -> str | None:
    """The cohort family's engine-independent check of one lane, or None when it holds.

    ``serial`` and ``cohort`` are the lane's ``[S, V]`` logits, run alone and in the cohort, step by
    step. Every step must be within ``tolerance.cohort_atol`` (max |Δlogit| over the row, derived in
    :mod:`oracles.checks.tolerance`) with the same argmax. The failure names the first step over the
    bound with its gap, and the worst step.

    Raises:
        ValueError: the shapes differ.
    """
    s, c = np.asarray(serial, dtype=np.float64), np.asarray(cohort, dtype=np.float64)
    if s.shape != c.shape:
        raise ValueError(f"{what}: shapes differ: serial {list(s.shape)} vs cohort {list(c.shape)}")
    if not s.size:
        return None
    gap = np.abs(s - c).max(axis=-1)
    over = np.flatnonzero(~(gap <= tolerance.cohort_atol))  # NaN is over
    if over.size:
        worst = int(np.nanargmax(gap)) if np.isfinite(gap).any() else int(over[0])
        return (f"{what}: max |Δlogit| over {tolerance.cohort_atol:g} at {over.size} of {gap.size} steps, first step "
                f"{int(over[0])} ({gap[over[0]]:.3e}), worst step {worst} ({gap[worst]:.3e})")
    moved = np.flatnonzero(s.argmax(-1) != c.argmax(-1))
    if moved.size:
        return f"{what}: argmax differs at {moved.size} of {gap.size} steps, first step {int(moved[0])}"
    return None


def check_lane_map(physical_to_logical: Sequence[int]) -> None:
    """Refuse a lane map that is not a permutation of ``0 .. B-1``.

    Raises:
        ValueError: naming the map and what is wrong (a repeated or out-of-range lane).
    """
    lanes = [int(x) for x in physical_to_logical]
    if sorted(lanes) != list(range(len(lanes))):
        raise ValueError(f"lane map {lanes}: not a permutation of 0..{len(lanes) - 1} (physical p holds logical map[p])")


def fixed_lanes(physical_to_logical: Sequence[int]) -> list[int]:
    """Physical lanes the map leaves in place (``map[p] == p``): where an un-permuting error is invisible."""
    return [p for p, logical in enumerate(physical_to_logical) if int(logical) == p]


def to_physical(logical: Sequence[Any], physical_to_logical: Sequence[int]) -> list[Any]:
    """``[logical[map[p]] for p]``: what each physical row of the batch is given."""
    check_lane_map(physical_to_logical)
    return [logical[int(q)] for q in physical_to_logical]


def compose(outer: Sequence[int], inner: Sequence[int]) -> list[int]:
    """The map ``p -> outer[inner[p]]`` (``compose(m, m)`` is ``m`` applied twice)."""
    return [int(outer[int(q)]) for q in inner]


def layer_and_buffer(name: str) -> tuple[int | None, str]:
    """``"layers.3.keys"`` -> ``(3, "keys")``; ``"logits"`` -> ``(None, "logits")``."""
    parts = name.split(".")
    if len(parts) >= 3 and parts[0] == "layers" and parts[1].isdigit():
        return int(parts[1]), ".".join(parts[2:])
    return None, name


def kind_of(name: str) -> str:
    """The quantity kind a figure is grouped under: ``hidden``, ``logits``, ``keys``, ``values``,
    ``conv_state``, ``recurrent_state`` (a ``.k`` state suffix dropped)."""
    return layer_and_buffer(name)[1].split(".")[0]


@dataclass(frozen=True)
class Mismatch:
    """One quantity of one lane at one step that is not bit-equal.

    ``first`` is the first differing index (C order) or None when the shapes differ or the quantity is
    missing on one side; ``values`` its (expected, actual) values; ``count``/``total`` the differing
    values; ``max_abs`` the largest |expected - actual| over finite differences (float64).
    """

    step: str
    logical: int
    physical: int
    name: str
    expected_shape: tuple[int, ...] | None
    actual_shape: tuple[int, ...] | None
    count: int = 0
    total: int = 0
    first: tuple[int, ...] | None = None
    values: tuple[float, float] | None = None
    max_abs: float = 0.0
    sides: tuple[str, str] = ("expected", "actual")

    @property
    def kind(self) -> str:
        return kind_of(self.name)

    def where(self) -> str:
        layer, buffer = layer_and_buffer(self.name)
        what = buffer if layer is None else f"layer {layer} {buffer}"
        return f"step {self.step}, logical lane {self.logical} (physical lane {self.physical}), {what}"

    def describe(self) -> str:
        a, b = self.sides
        if self.expected_shape is None or self.actual_shape is None:
            missing = a if self.expected_shape is None else b
            return f"{self.where()}: missing on the {missing} side"
        if self.expected_shape != self.actual_shape:
            return f"{self.where()}: shape {list(self.expected_shape)} ({a}) vs {list(self.actual_shape)} ({b})"
        x, y = self.values or (float("nan"), float("nan"))
        return (f"{self.where()}: {self.count} of {self.total} values differ in bits ({self.count / self.total:.2%}); "
                f"first at index {list(self.first or ())}: {a} {x!r} vs {b} {y!r}; max |d| {self.max_abs:.3e}")

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "logical": self.logical, "physical": self.physical, "name": self.name,
                "expected_shape": None if self.expected_shape is None else list(self.expected_shape),
                "actual_shape": None if self.actual_shape is None else list(self.actual_shape),
                "count": self.count, "total": self.total, "first": None if self.first is None else list(self.first),
                "values": None if self.values is None else list(self.values), "max_abs": self.max_abs}


def compare_bits(expected: np.ndarray | None, actual: np.ndarray | None, *, step: str, logical: int, physical: int,
                 name: str, sides: tuple[str, str] = ("expected", "actual")) -> Mismatch | None:
    """None when ``expected`` and ``actual`` are bit-identical float32 arrays of one shape, else the Mismatch.

    The equal case costs one pass over ``uint32`` views (no copy of a contiguous array); the figures
    (count, first index, max |d| in float64 over finite differences) a few vectorised passes more.
    """
    where: dict[str, Any] = dict(step=step, logical=logical, physical=physical, name=name, sides=sides)
    if expected is None or actual is None:
        return Mismatch(**where, expected_shape=None if expected is None else tuple(expected.shape),
                        actual_shape=None if actual is None else tuple(actual.shape))
    e, a = np.asarray(expected, dtype="<f4"), np.asarray(actual, dtype="<f4")
    if e.shape != a.shape:
        return Mismatch(**where, expected_shape=tuple(e.shape), actual_shape=tuple(a.shape))
    ue, ua = e.view("<u4"), a.view("<u4")
    if np.array_equal(ue, ua):
        return None
    bad = (ue != ua).reshape(-1)
    at = int(np.argmax(bad))
    with np.errstate(invalid="ignore", over="ignore"):
        d = np.abs(e.astype(np.float64) - a.astype(np.float64)).reshape(-1)
    finite = d[np.isfinite(d)]
    first = tuple(int(i) for i in np.unravel_index(at, e.shape))
    return Mismatch(**where, expected_shape=tuple(e.shape), actual_shape=tuple(a.shape), count=int(bad.sum()),
                    total=int(e.size), first=first, values=(float(e.reshape(-1)[at]), float(a.reshape(-1)[at])),
                    max_abs=float(finite.max()) if finite.size else 0.0)


def compare_lane(expected: LaneState, actual: LaneState, *, step: str, logical: int, physical: int,
                 sides: tuple[str, str] = ("expected", "actual"), stop_at_first: bool = False) -> list[Mismatch]:
    """Every quantity of one lane, in ``expected``'s order then any only ``actual`` has: the mismatches."""
    found = []
    for name in [*expected, *(n for n in actual if n not in expected)]:
        m = compare_bits(expected.get(name), actual.get(name), step=step, logical=logical, physical=physical,
                         name=name, sides=sides)
        if m is not None:
            found.append(m)
            if stop_at_first:
                break
    return found


def compare_cohort(serial: Sequence[LaneState], cohort: Sequence[LaneState], physical_to_logical: Sequence[int], *,
                   step: str, stop_at_first: bool = False) -> list[Mismatch]:
    """Un-permute the cohort and compare: physical row ``p`` against serial lane ``map[p]``, every
    quantity. ``serial`` is in logical order, ``cohort`` in physical order. Returns every mismatch
    (with ``stop_at_first``: at most one a lane, the first found)."""
    check_lane_map(physical_to_logical)
    found: list[Mismatch] = []
    for p, q in enumerate(physical_to_logical):
        found += compare_lane(serial[int(q)], cohort[p], step=step, logical=int(q), physical=p,
                              sides=("serial", "cohort"), stop_at_first=stop_at_first)
    return found


@dataclass
class Tally:
    """Bit comparisons of lanes over steps, kept small: per (logical lane, kind) the first
    :attr:`keep` mismatches, the count of mismatching (step, quantity) comparisons and the max |d|."""

    keep: int = 2
    comparisons: int = 0
    steps: int = 0
    first: dict[tuple[int, str], list[Mismatch]] = field(default_factory=dict)
    counts: dict[tuple[int, str], int] = field(default_factory=dict)
    max_abs: dict[tuple[int, str], float] = field(default_factory=dict)
    kinds: set[str] = field(default_factory=set)

    def add(self, found: Iterable[Mismatch], comparisons: int, names: Iterable[str] = ()) -> None:
        """Record one step's mismatches out of ``comparisons`` (lane, quantity) comparisons; ``names``
        are the quantities compared (their kinds are listed even when all equal)."""
        self.steps += 1
        self.comparisons += comparisons
        self.kinds.update(kind_of(n) for n in names)
        for m in found:
            key = (m.logical, m.kind)
            self.kinds.add(m.kind)
            self.counts[key] = self.counts.get(key, 0) + 1
            self.max_abs[key] = max(self.max_abs.get(key, 0.0), m.max_abs)
            kept = self.first.setdefault(key, [])
            if len(kept) < self.keep:
                kept.append(m)

    def lane_mismatches(self, logical: int) -> list[Mismatch]:
        """The kept mismatches of one logical lane, earliest step first."""
        out = [m for (lane, _k), ms in self.first.items() if lane == logical for m in ms]
        return sorted(out, key=lambda m: (_step_key(m.step), m.name))

    def lane_count(self, logical: int) -> int:
        return sum(n for (lane, _k), n in self.counts.items() if lane == logical)

    def max_abs_by_kind(self, logical: int | None = None) -> dict[str, float]:
        """Per kind, the max |d| over the lanes (or over one lane); 0.0 for kinds compared bit-equal."""
        out = {k: 0.0 for k in sorted(self.kinds)}
        for (lane, kind), v in self.max_abs.items():
            if logical is None or lane == logical:
                out[kind] = max(out[kind], v)
        return out

    def report(self, logical: int, what: str) -> str:
        """One failure message for a lane: the count, the figures by kind and the first mismatches."""
        shown = self.lane_mismatches(logical)
        figures = ", ".join(f"{k} {v:.3e}" for k, v in self.max_abs_by_kind(logical).items() if v)
        return (f"{what}: logical lane {logical}: {self.lane_count(logical)} mismatching (step, quantity) comparisons "
                f"over {self.steps} steps; max |d| by kind: {figures or 'shape or presence only'}; first: "
                + "; ".join(m.describe() for m in shown[:4]))


def _step_key(step: str) -> tuple[int, str]:
    return (int(step), "") if step.isdigit() else (1 << 30, step)


def first_unequal(a: Mapping[str, str], b: Mapping[str, str]) -> str | None:
    """The first name whose digest differs between two per-buffer digest maps (or is missing on one side)."""
    for name in [*a, *(n for n in b if n not in a)]:
        if a.get(name) != b.get(name):
            return name
    return None
