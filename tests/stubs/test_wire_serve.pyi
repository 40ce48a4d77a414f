"""tests/unit/test_wire_serve.py by the bare name tests/unit/test_recorded.py imports its comparison by."""

from tests.unit.test_wire_serve import _table as _table
from tests.unit.test_wire_serve import units_differ as units_differ
