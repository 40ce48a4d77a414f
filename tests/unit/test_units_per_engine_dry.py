"""A unit is unique per engine within a test: a band judgment's port test attaches the reference's unit and the
band engine's (``torch@q8_0``) on the same pin and request, as ``oracles compare`` reads them (one engine's
units keyed by kind, request, unit and pin); the same engine twice is still refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import PIN, logits

from oracles.receipts.table import Receipt
from oracles.receipts.units import attach_unit

pytestmark = [pytest.mark.dry]


def test_the_reference_and_its_band_attach_one_unit_each_on_one_pin(tmp_path: Path) -> None:
    receipt = Receipt({}, tmp_path / "staging", "t.py::test_prefill[ping]")
    fields: dict[str, Any] = {"request_sha256": "e" * 64, "pin": PIN, "record": "ping", "ids": [1, 2], "argmax": [3],
              "arrays": {"logits": np.stack([logits(3)])}}
    attach_unit(receipt, "prefill", engine="torch", **fields)
    attach_unit(receipt, "prefill", engine="torch@q8_0", **fields)
    assert [u["engine"] for u in receipt["units"]] == ["torch", "torch@q8_0"]
    with pytest.raises(ValueError, match=r"already attached a prefill unit of request eeeeeeeeeeee on pin .* for engine "
                                         r"'torch@q8_0'; a unit is attached once per engine"):
        attach_unit(receipt, "prefill", engine="torch@q8_0", **fields)
