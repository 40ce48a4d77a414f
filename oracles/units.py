"""Public alias of :mod:`oracles.receipts.units`, where comparable units are declared: a project's own
tests attach units with ``from oracles.units import attach_unit``."""

from oracles.receipts.units import KINDS, Kind, Unit, attach_unit, parse_unit

__all__ = ["KINDS", "Kind", "Unit", "attach_unit", "parse_unit"]
