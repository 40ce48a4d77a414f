"""Error types with one-line, location-naming messages."""

from __future__ import annotations


class OracleError(Exception):
    """Base of every error this package raises on bad input."""


class FixtureError(OracleError):
    """A fixture or record file is malformed; the message names the file, the line or record, and the field."""


class PinError(OracleError):
    """A pin file is malformed or a snapshot does not match its pin (file, expected and actual digest)."""


class TokensMissing(FixtureError):
    """A family has no token ids for a pin's tokenizer; the message names the command that writes them."""


class NonFiniteError(OracleError, ValueError):
    """An array holds NaN or infinity where a finite value is required (count and first index named)."""


class ReceiptError(OracleError):
    """A receipt cannot be written or read (path named); nothing half-written is left behind."""
