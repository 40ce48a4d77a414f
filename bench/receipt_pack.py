"""The npz sidecar of a run before and after logit coding: bytes, packing seconds, and compare's verdicts.

Reads a schema-3 run's staged arrays (the ``.<stem>.arrays`` folder beside its ``.partial.jsonl``) or
a receipt with its npz (a coded one's arrays as decoded, within their stated errors), stages its unit
logits again as this plugin's ``attach_unit`` would (its group; a sampled generation's first row), packs
them both ways (``numpy.savez`` of float32, as schema 3 did, and
:func:`oracles.receipts.logit_store.pack`), and prints bytes by kind and engine, the
seconds of each pack, and every matched unit pair's ``oracles compare`` verdict from float32 rows
against the verdict from the coded rows (the same failures, or the pair is listed). ``--synthetic V``
adds bytes per 1,000 stored positions for a normal(0, 3) reference and a port 1e-4 from it at
vocabulary V. Numpy only; no weights.

    python bench/receipt_pack.py receipts/baseline/RUN.partial.jsonl [--out DIR] [--synthetic 151936]
"""

from __future__ import annotations

import argparse
import collections
import json
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from oracles.receipts.compare import compare_pair
from oracles.receipts.logit_store import STAGED, LogitStore, pack
from oracles.receipts.units import KINDS, parse_unit


def _records(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".jsonl":
        out = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                obj = json.loads(line)
            except ValueError:
                continue  # a torn last line
            if obj.get("event") == "test":
                out.append(obj)
        return out
    return list(json.loads(path.read_text(encoding="utf-8"))["tests"])


def _loader(path: Path) -> Any:
    if path.suffix == ".jsonl":
        folder = path.with_name("." + path.name.removesuffix(".partial.jsonl") + ".arrays")
        return lambda key: np.load(folder / f"{key}.npy")
    packed = np.load(path.with_suffix(".npz"))
    store = LogitStore(packed)  # a coded receipt's arrays are read back at their stated error
    return lambda key: packed[key] if key in packed.files else store.rows(key).values


def stage(path: Path, staging: Path, d1_scope: bool = False) -> tuple[list[tuple[dict[str, Any], str]], int, int]:
    """Stage a run's unit logits as attach_unit does now; its units and npz keys, float32 bytes and rows.
    ``d1_scope``: leave out the d1 units no other engine attached for the same question (test_d1 now
    attaches a unit only inside ``--port-records``, where the ports run)."""
    load = _loader(path)
    units, nbytes, rows = [], 0, 0
    staging.mkdir(parents=True)
    records = _records(path)
    engines: dict[tuple[str, str, str], set[str]] = collections.defaultdict(set)
    for t in records:
        for u in (t.get("data") or {}).get("units") or []:
            engines[(u["kind"], u["request_sha256"], u["unit"])].add(u["engine"])
    for t in records:
        for u in (t.get("data") or {}).get("units") or []:
            if d1_scope and u["kind"].startswith("d1-") and len(engines[(u["kind"], u["request_sha256"], u["unit"])]) < 2:
                continue
            for key in u.get("arrays", {}).values():
                try:
                    a = load(key)
                except (OSError, KeyError):
                    continue
                nbytes += a.nbytes
                a = KINDS[u["kind"]].stored_rows(a)
                rows += 1 if a.ndim == 1 else a.shape[0]
                (staging / f"{key}{STAGED}").write_text(json.dumps({"group": f"{u['request_sha256']} {u['unit']}"}))
                np.save(staging / f"{key}.npy", a)
                units.append((u, key))
    return units, nbytes, rows


def verdicts(units: list[tuple[dict[str, Any], str]], staging: Path, store: LogitStore) -> tuple[int, list[str]]:
    """Every (reference torch, other engine) pair of units with one key: compare_pair's failures from the
    staged float32 rows and from the stored ones; the pairs whose verdict (ok) differs."""
    by: dict[tuple[str, ...], dict[str, tuple[dict[str, Any], str]]] = collections.defaultdict(dict)
    for u, key in units:
        by[(u["kind"], u["request_sha256"], u["unit"], u["pin"])][u["engine"]] = (u, key)
    pairs, changed = 0, []
    for k, engines in by.items():
        if "torch" not in engines:
            continue
        ru, rk = engines["torch"]
        for e, (pu, pk) in engines.items():
            if e == "torch" or "@" in e:
                continue
            r, p = parse_unit(ru), parse_unit(pu)
            exact = compare_pair(r, p, np.load(staging / f"{rk}.npy"), np.load(staging / f"{pk}.npy"))
            stored = compare_pair(r, p, store.rows(rk), store.rows(pk))
            pairs += 1
            if exact["ok"] != stored["ok"] or len(exact["failures"]) != len(stored["failures"]):
                changed.append(f"{k[0]} {r.label} {e}: float32 {exact['failures']} vs stored {stored['failures']}")
    return pairs, changed


def _packed(arrays: dict[str, np.ndarray]) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp)
        for key, a in arrays.items():
            (staging / f"{key}{STAGED}").write_text(json.dumps({"group": "g"}))
            np.save(staging / f"{key}.npy", a)
        return len(pack(staging)[0])


def synthetic(v: int, positions: int = 64) -> dict[str, float]:
    """Bytes per 1,000 stored positions at vocabulary ``v``: float32, a coded reference, a port coded on
    it (the reference normal(0, 3), the port 1e-4 from it)."""
    rng = np.random.default_rng(0)
    ref = rng.normal(0, 3, (positions, v)).astype("<f4")
    port = (ref + rng.normal(0, 1e-4, ref.shape)).astype("<f4")
    per = 1000 / positions
    alone, both = _packed({"ref": ref}), _packed({"ref": ref, "port": port})
    return {"float32": ref.nbytes * per, "reference": alone * per, "port on it": (both - alone) * per}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="a schema-3 .partial.jsonl (with its staging folder) or receipt .json (with its .npz)")
    ap.add_argument("--d1-scope", action="store_true", help="leave out d1 units only one engine attached")
    ap.add_argument("--synthetic", type=int, action="append", default=[], help="also bytes per 1,000 positions at this V")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        staging = Path(tmp) / "staging"
        units, f32_bytes, rows = stage(args.run, staging, args.d1_scope)
        t0 = time.perf_counter()
        old = Path(tmp) / "old.npz"
        load = _loader(args.run)
        np.savez(old, **{k: load(k) for _, k in units})
        old_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        data, n = pack(staging)
        new_s = time.perf_counter() - t0
        new = Path(tmp) / "new.npz"
        new.write_bytes(data)
        with np.load(new) as npz:
            store = LogitStore(npz)
            codecs = collections.Counter(str(json.loads(str(npz[f"{k}~meta"][()]))["codec"]) for _, k in units)
            pairs, changed = verdicts(units, staging, store)
        print(f"units {len(units)}, float32 {f32_bytes / 1e6:.1f} MB; staged rows {rows}")
        print(f"schema 3 (np.savez float32): {old.stat().st_size / 1e6:.1f} MB in {old_s:.1f} s")
        print(f"schema 4 (coded): {len(data) / 1e6:.1f} MB in {new_s:.1f} s; codecs {dict(codecs)}")
        print(f"compare verdicts: {pairs} torch-vs-port pairs, {len(changed)} changed")
        sizes = {i.filename.split("~")[0]: 0 for i in zipfile.ZipFile(new).infolist()}
        for i in zipfile.ZipFile(new).infolist():
            sizes[i.filename.split("~")[0]] += i.compress_size
        by: collections.Counter[tuple[str, str, str]] = collections.Counter()
        with np.load(new) as npz:
            for u, k in units:
                codec = str(json.loads(str(npz[f"{k}~meta"][()]))["codec"])
                by[(u["kind"], u["engine"], codec)] += sizes.get(k, 0)
        for (kind, engine, codec), b in by.most_common():
            print(f"  {b / 1e6:7.2f} MB  {kind:<16} {engine:<10} {codec}")
        for line in changed:
            print("  ", line)
    for v in args.synthetic:
        print(f"V={v}: bytes per 1,000 positions", {k: f"{x / 1e6:.1f} MB" for k, x in synthetic(v).items()})


if __name__ == "__main__":
    main()
