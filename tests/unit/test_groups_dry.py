"""oracles.plugin.groups.record_group: which xdist group an oracle test joins (pure, dry)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from oracles.plugin.groups import record_group
from oracles.receipts.table import plain_nodeid

pytestmark = pytest.mark.dry


@pytest.mark.parametrize(("markers", "params", "want"), [
    ({"mtplx", "slow"}, {"record": SimpleNamespace(id="ping"), "engine_id": "mlx"}, "mtplx:ping"),
    ({"port", "slow"}, {"record": SimpleNamespace(id="ping"), "port_id": "mlx"}, "mtplx:ping"),
    ({"mtplx_chat", "port"}, {"record": SimpleNamespace(id="brief"), "port_id": "mlx"}, "mtplx_chat:brief"),
    ({"d1"}, {"key": ("fact_water", "boils"), "engine_id": "torch"}, "d1:fact_water"),
    ({"d1"}, {"arm": ("ent_cats", "flip_ent_cats"), "engine_id": "torch"}, "d1:ent_cats"),
    ({"d1"}, {"rid": "town_guide_2k_a"}, "d1:town_guide_2k_a"),
    ({"d1"}, {"engine_id": "torch"}, "d1"),
    ({"dry"}, {"key": ("fact_water", "boils")}, None),
    ({"cohort", "slow"}, {"pin": "smollm2-hybrid-twin", "engine_id": "mlx", "lane": 2}, "cohort:smollm2-hybrid-twin:mlx"),
])
def test_record_group(markers: set[str], params: dict[str, object], want: str | None) -> None:
    assert record_group(markers, params) == want


@pytest.mark.parametrize(("nodeid", "want"), [
    ("t.py::test_a[x-torch]@d1:fact_water", "t.py::test_a[x-torch]"),
    ("t.py::test_a@mtplx", "t.py::test_a"),
    ("t.py::test_a[user@host]", "t.py::test_a[user@host]"),
    ("t.py::test_a[user@host]@g", "t.py::test_a[user@host]"),
    ("t.py::test_a", "t.py::test_a"),
])
def test_plain_nodeid(nodeid: str, want: str) -> None:
    assert plain_nodeid(nodeid) == want


def test_an_artifact_pair_has_a_group_of_its_own() -> None:
    same = record_group({"port"}, {"pin": "a", "port_id": "mlx", "port_pin": "a", "record": "ping"})
    other = record_group({"port"}, {"pin": "a", "port_id": "mlx", "port_pin": "a-q4", "record": "ping"})
    assert same == "mtplx:a:ping" and other == "mtplx:a>a-q4:ping"
