"""``--resume`` carries a unit's coded logits decoded, with their error and the statistics of the rows
first attached: the new sidecar never states an error smaller than the distance to those rows. Numpy only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from units_fake import decode, write

from oracles.checks.logit_codec import stats_of
from oracles.receipts.files import pack_arrays
from oracles.receipts.logit_store import STAGED, LogitStore
from oracles.receipts.resume import ArraySource

pytestmark = [pytest.mark.dry]


def test_a_carried_array_keeps_its_error_and_its_statistics(tmp_path: Path) -> None:
    attached = np.random.default_rng(3).normal(0, 3, (4, 500)).astype("<f4")
    port = (attached + np.float32(1e-4)).astype("<f4")
    first = write(tmp_path / "one", "r", [decode("torch", attached, [5, 6, 7, 2]), decode("mlx", port, [5, 6, 7, 2])])
    source = ArraySource(first)
    with np.load(first.with_suffix(".npz")) as npz:
        before = LogitStore(npz)
        keys = set(before.keys)
        old = {k: before.rows(k) for k in keys}
    assert source.keys == keys and len(keys) == 2
    staging = tmp_path / "two" / ".r.arrays"
    source.copy_into(keys, staging)
    assert sorted(p.name for p in staging.iterdir()) == sorted([f"{k}.npy" for k in keys] + [f"{k}{STAGED}" for k in keys])
    assert pack_arrays(staging, tmp_path / "two" / "r.npz") == 2 and not staging.exists()
    with np.load(tmp_path / "two" / "r.npz") as npz:
        after = LogitStore(npz)
        for key in keys:
            got, was = after.rows(key), old[key]
            (truth,) = [a for a in (attached, port) if np.array_equal(stats_of(a).sha, was.stats.sha)]
            assert got.error >= was.error  # the carried error, plus any of the second code
            assert np.array_equal(got.stats.sha, was.stats.sha) and np.array_equal(got.stats.gap, was.stats.gap)
            assert np.abs(got.values.astype(np.float64) - truth).max() <= got.error  # from the rows first attached
            meta = json.loads(str(npz[f"{key}~meta"][()]))
            assert meta["anchor"] == key and "base" not in meta  # a carried array is no residual, nor any's base
