"""``oracles compare`` on logits stored to a stated error gives the verdict the attached float32 rows give,
or says it cannot (``undecided``), never another: the figures' bounds hold the float32 figures, and a
decided verdict is the float32 one, for ports from bit-equal to far past every threshold, coded together
in one sidecar or apart in two. Numpy fakes through the real writer and packer; no weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from units_fake import decode, write

from oracles.checks import logit_codec
from oracles.checks.tolerance import FLOAT32
from oracles.receipts.compare import compare_pair
from oracles.receipts.logit_store import LogitStore
from oracles.receipts.sidecar import load_npz
from oracles.receipts.units_reader import unit_rows, units_of

pytestmark = [pytest.mark.dry]

TOKENS = [5, 6, 7, 2]
V = 4096


def _ref(scale: float = 3.0) -> np.ndarray:
    return np.random.default_rng(11).normal(0, scale, (len(TOKENS), V)).astype("<f4")


def _port(ref: np.ndarray, scale: float, seed: int) -> np.ndarray:
    """``ref`` moved by uniform noise of ``scale``, its first logit of row 2 by 1.1 x ``scale`` more."""
    port = ref + np.random.default_rng(seed).uniform(-scale, scale, ref.shape).astype("<f4")
    port[2, 0] += np.float32(1.1 * scale)
    return port.astype("<f4")


def _stored(tmp_path: Path, ref: np.ndarray, port: np.ndarray, together: bool) -> tuple[Any, ...]:
    """The two units and their stored rows: in one sidecar (the port coded on the reference) or two."""
    units = [decode("torch", ref, TOKENS), decode("mlx", port, TOKENS)]
    paths = [write(tmp_path / "one", "both", units)] if together else [write(tmp_path / "a", "ref", units[:1]),
                                                                       write(tmp_path / "b", "port", units[1:])]
    stores = [load_npz(p.with_suffix(".npz"), p) for p in paths]
    found = [(u, store, p) for p, store in zip(paths, stores) for u in units_of(json.loads(p.read_text()), p)]
    (r, rs, rp), (q, qs, qp) = sorted(found, key=lambda f: f[0].engine != "torch")
    return r, q, unit_rows(r, rs, rp), unit_rows(q, qs, qp)


def _which(failures: list[str]) -> set[str]:
    return {f.split(": ", 1)[-1].split(" ")[0] if f.startswith("step_logits") else f.split(" ")[0] for f in failures}


@pytest.mark.parametrize("together", [True, False], ids=["one-sidecar", "two-sidecars"])
@pytest.mark.parametrize("scale", [0.0, 1e-5, 3e-4, 2e-3, 4.2e-3, 4.6e-3, 5e-3, 6e-3, 2e-2, 0.5])
def test_a_decided_verdict_is_the_float32_one(tmp_path: Path, together: bool, scale: float) -> None:
    """Every figure of the attached rows lies within the stored rows' bounds; where no threshold is
    undecided the row's status and failing thresholds are those of the float32 rows."""
    ref = _ref()
    port = ref.copy() if scale == 0 else _port(ref, scale, 3)
    r, p, a, b = _stored(tmp_path, ref, port, together)
    exact = compare_pair(r, p, ref, port)
    stored = compare_pair(r, p, a, b)
    if scale == 0:
        assert stored["bit_equal"] and stored["max_abs"] == 0.0 and stored["status"] == "ok"
        assert stored["bounds"] == {"max_abs": [0.0, 0.0], "nmse": [0.0, 0.0], "kl_max": [0.0, 0.0]}  # sha256 equal
        return
    for name in ("max_abs", "nmse", "kl_max"):
        lo, hi = stored["bounds"][name]
        assert lo <= exact[name] <= hi, (name, lo, exact[name], hi)
    assert stored["argmax_agreement"] == exact["argmax_agreement"] and stored["bit_equal"] == exact["bit_equal"]
    undecided = [f for f in stored["failures"] if "undecided" in f]
    decided = [f for f in stored["failures"] if "undecided" not in f]
    assert _which(decided) <= _which(exact["failures"])  # nothing fails that float32 passes
    if not undecided:
        assert stored["ok"] == exact["ok"] and _which(decided) == _which(exact["failures"])
    else:
        assert stored["ok"] is False  # never a pass it cannot prove


def test_near_a_threshold_the_verdict_is_undecided_not_a_pass(tmp_path: Path) -> None:
    """Positive control: two sidecars (errors add) and a port whose max |Δlogit| is just under the
    threshold: float32 rows pass it, the stored rows cannot tell, and say so naming the threshold."""
    ref = _ref()
    port = ref.copy()
    port[1, 5] += np.float32(FLOAT32.max_abs_logit * 0.98)
    r, p, a, b = _stored(tmp_path, ref, port, together=False)
    assert compare_pair(r, p, ref, port)["ok"] is True
    row = compare_pair(r, p, a, b)
    assert row["ok"] is False and row["status"] == "FAIL"
    (line,) = [f for f in row["failures"] if "undecided" in f]
    assert "undecided: max |Δlogit| " in line and "> 0.005 at (row, token) [1, 5] at most, and may be within it" in line
    assert f"within {row['stored_error']:.2e} of the attached float32 rows'" in line
    together = compare_pair(*_stored(tmp_path / "t", ref, port, together=True))
    assert together["ok"] is True and together["failures"] == []  # coded on the reference: decided


@pytest.mark.parametrize("size", [3.0, 0.16], ids=["smollm2-like", "twin-like"])
def test_two_receipts_keep_a_float32_port_decided(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: float) -> None:
    """Each sidecar's own 2-byte code keeps a reference and a float32 port judged across two receipts
    decided, for rows of SmolLM2's size (rms 3) and of a tiny twin's (0.16). Positive control: at a step 16
    times coarser (4,095 levels a row) the same pair is undecided (NMSE for both; max |Δlogit| and KL too
    for the larger rows), so the step is what decides it."""
    ref = _ref(size)
    port = _port(ref, 1e-5 * size, 5)
    row = compare_pair(*_stored(tmp_path / "fine", ref, port, together=False))
    assert row["ok"] is True and row["failures"] == [] and row["stored_error"] > 0
    monkeypatch.setattr(logit_codec, "_LEVELS", 65535 // 16)
    coarse = compare_pair(*_stored(tmp_path / "coarse", ref, port, together=False))
    undecided = {f.split("undecided: ")[1].split(" ")[0] for f in coarse["failures"] if "undecided: " in f}
    assert coarse["ok"] is False and undecided == ({"max", "NMSE", "KL(ref‖port)"} if size > 1 else {"NMSE"}), coarse["failures"]


def test_one_sidecar_holds_the_difference_almost_exactly(tmp_path: Path) -> None:
    """A port coded on its reference: the stored max |Δlogit| is within the residual's half step of the
    attached one (the reference's own error cancels), far inside the two-sidecar bound."""
    ref = _ref()
    port = _port(ref, 2e-4, 4)
    r, p = _stored(tmp_path / "x", ref, port, True)[:2]
    exact = compare_pair(r, p, ref, port)
    one = compare_pair(*_stored(tmp_path / "one", ref, port, True))
    two = compare_pair(*_stored(tmp_path / "two", ref, port, False))
    assert abs(one["max_abs"] - exact["max_abs"]) <= one["stored_error"] < two["stored_error"] / 4


def test_units_of_one_request_share_their_rows(tmp_path: Path) -> None:
    """A decode and the identical greedy generation of one request are stored once (``same``); a sampled
    generation stores its first step alone, coded on the decode's first row."""
    ref = _ref()
    units = [decode("torch", ref, TOKENS), decode("torch", ref, TOKENS, kind="generate-greedy"),
             decode("torch", ref, TOKENS, kind="generate-sampled")]
    path = write(tmp_path, "r", units)
    with np.load(path.with_suffix(".npz")) as npz:
        store = LogitStore(npz)
        metas = sorted(str(json.loads(str(npz[f"{k}~meta"][()]))["codec"]) for k in store.keys)
        assert metas == ["d16", "same", "u16"]
        got = {u.kind: unit_rows(u, store, path) for u in units_of(json.loads(path.read_text()), path)}
    assert got["generate-sampled"] is not None and got["generate-sampled"].values.shape == (1, V)
    assert got["decode"] is not None and got["generate-greedy"] is not None
    assert np.array_equal(got["decode"].values, got["generate-greedy"].values)
    assert np.abs(got["generate-sampled"].values - ref[:1]).max() <= got["generate-sampled"].error


def test_a_decode_stored_step_on_step_reads_back_and_holds_its_port(tmp_path: Path) -> None:
    """A decode whose steps barely move (a small model's) is stored ``r16`` through the real writer, the
    other engine's as a residual on it; read back, every logit is within its stated error, and the pair is
    held as its float32 rows are, in one receipt and in two (errors added)."""
    rng = np.random.default_rng(21)
    ref = (0.16 * rng.normal(0, 1, (1, V)) + np.cumsum(rng.normal(0, 2e-3, (len(TOKENS), V)), axis=0)).astype("<f4")
    port = _port(ref, 1e-5, 22)
    r, p, a, b = _stored(tmp_path / "one", ref, port, together=True)
    assert {a.codec, b.codec} == {"r16", "d16"}  # whichever the sidecar codes first is the other's base
    for got, attached in ((a, ref), (b, port)):
        assert np.abs(got.values.astype(np.float64) - attached).max() <= got.error
    exact = compare_pair(r, p, ref, port)
    for row in (compare_pair(r, p, a, b), compare_pair(*_stored(tmp_path / "two", ref, port, together=False))):
        assert row["ok"] is exact["ok"] is True and row["failures"] == [] and row["stored_error"] > 0


def test_a_sidecar_missing_a_coded_member_is_refused_in_one_line(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Bad input: a coded array whose codes are gone is refused naming the file, record, field and
    member, exit 2, and no comparison is written."""
    from oracles.cli import main

    ref = _ref()
    a = write(tmp_path / "a", "ref", [decode("torch", ref, TOKENS)])
    npz = a.with_suffix(".npz")
    with np.load(npz) as packed:
        kept = {k: packed[k] for k in packed.files if not k.endswith("~codes")}
    np.savez(npz, **kept)
    b = write(tmp_path / "b", "port", [decode("mlx", ref, TOKENS)])
    assert main(["compare", str(a), str(b), "--out", str(tmp_path / "c.json")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"oracles compare: error: {a}: record t.py::test_decode_to_stop[") and err.count("\n") == 1
    assert "field 'arrays.step_logits' names npz key" in err and "coded member 'codes' (" in err and "~codes) is missing" in err
    assert not (tmp_path / "c.json").exists()
