"""``oracles survey RECEIPT``: the activation absmax survey of a receipt, against the float16 limit.

Reads every test record whose ``data.kind`` is ``"absmax"`` (written by the clef family's
``test_absmax`` and the survey family's ``test_text_absmax``: one per run, per pin and engine) and
writes, per pin present, beside the receipt unless ``--out`` names a folder,
``<receipt stem>.<pin>.absmax.json`` and ``.absmax.png`` (all created exclusively, never overwritten;
none is written when one exists), then prints one line per layer. Per pin and engine and per decoder
layer: the largest |x| of the residual stream over all runs at position 0, at the other positions and
overall (with the run, position and channel where it is reached), the largest MLP down-projection
input where the engine taps it, and the headroom to float16's 65504 (``ratio`` and ``bits``:
:func:`oracles.checks.absmax.headroom`). The plot draws the per-layer maxima on a log scale with the
float16 limit. A malformed record is exit 2 naming the file, the record and the field. No torch import.

Without matplotlib the PNGs are not written and one line says so; the JSON and tables stand (exit 0).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from oracles.checks.absmax import FP16_MAX, headroom, worst
from oracles.commands.plots import unavailable
from oracles.errors import FixtureError, ReceiptError
from oracles.pins.writer import NAME as PIN_NAME
from oracles.receipts.files import dump_json, load_json, write_exclusive

STAT_FIELDS = ("pos0", "rest", "overall", "argmax_pos", "argmax_ch")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("receipt", type=Path, help="a receipt .json holding absmax records (clef, survey)")
    parser.add_argument("--out", type=Path, default=None, metavar="DIR",
                        help="folder for the survey files; default: beside the receipt")


def _stats(value: Any, where: str, field: str) -> dict[str, Any]:
    if not isinstance(value, dict) or any(k not in value for k in STAT_FIELDS):
        raise FixtureError(f"record {where}: field {field!r} is missing or lacks one of {list(STAT_FIELDS)}")
    for k in ("pos0", "overall"):
        if not isinstance(value[k], (int, float)):
            raise FixtureError(f"record {where}: field '{field}.{k}' is not a number")
    return value


def absmax_records(receipt: dict[str, Any]) -> list[dict[str, Any]]:
    """The absmax records of a receipt, checked: ``[{"pin", "engine", "run", "layers", ...}]``.

    Raises:
        FixtureError: a record or field of the wrong shape (the record's nodeid and the field named).
    """
    out = []
    for i, t in enumerate(receipt.get("tests") or []):
        if not isinstance(t, dict):
            raise FixtureError(f"field 'tests[{i}]' is a JSON {type(t).__name__}, not a test record (an object)")
        data = t.get("data")
        if not isinstance(data, dict) or data.get("kind") != "absmax":
            continue
        where = str(t.get("nodeid") or f"tests[{i}]")
        for field in ("pin", "engine", "run"):
            if not isinstance(data.get(field), str):
                raise FixtureError(f"record {where}: field {field!r} is missing or not a string")
        if not PIN_NAME.fullmatch(data["pin"]):  # it names the output files: no folder or hidden name from a receipt
            raise FixtureError(f"record {where}: field 'pin' {data['pin']!r} is not a pin name ({PIN_NAME.pattern})")
        layers = data.get("layers")
        if not isinstance(layers, list) or not layers:
            raise FixtureError(f"record {where}: field 'layers' is missing or not a non-empty list")
        down = data.get("mlp_down_in")
        if down is not None and (not isinstance(down, list) or len(down) != len(layers)):
            raise FixtureError(f"record {where}: field 'mlp_down_in' is not null or a list of {len(layers)} numbers")
        out.append({"pin": data["pin"], "engine": data["engine"], "run": data["run"],
                    "layer_input": _stats(data.get("layer_input"), where, "layer_input"),
                    "final_norm": _stats(data.get("final_norm"), where, "final_norm"),
                    "layers": [_stats(s, where, f"layers[{n}]") for n, s in enumerate(layers)], "mlp_down_in": down})
    return out


def _with_headroom(w: dict[str, Any] | None) -> dict[str, Any] | None:
    return None if w is None else {**w, **{f"headroom_{k}": v for k, v in headroom(w["max"]).items()}}


def _layer(runs: list[dict[str, Any]], i: int) -> dict[str, Any]:
    """Layer ``i``'s worst values over ``runs`` (one pin and engine), each with its run and headroom."""
    def pick(field: str) -> dict[str, Any] | None:
        return _with_headroom(worst([(r["layers"][i][field], r["run"]) for r in runs]))

    best = max((r["layers"][i] for r in runs), key=lambda s: float(s["overall"]))
    down = worst([(r["mlp_down_in"][i] if r["mlp_down_in"] else None, r["run"]) for r in runs])
    return {"layer": i, "pos0": pick("pos0"), "rest": pick("rest"), "overall": pick("overall"),
            "argmax_pos": best["argmax_pos"], "argmax_ch": best["argmax_ch"], "mlp_down_in": _with_headroom(down)}


def survey(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per ``pin/engine``: per-layer worst values with headroom, and the overall worst (module docstring).

    Raises:
        FixtureError: two runs of one pin and engine with different layer counts.
    """
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(f"{r['pin']}/{r['engine']}", []).append(r)
    out: dict[str, Any] = {}
    for name, runs in sorted(groups.items()):
        n = {len(r["layers"]) for r in runs}
        if len(n) != 1:
            raise FixtureError(f"{name}: runs with {sorted(n)} layers")
        layers = [_layer(runs, i) for i in range(n.pop())]
        out[name] = {
            "runs": len(runs), "layers": layers,
            "layer_input": _with_headroom(worst([(r["layer_input"]["overall"], r["run"]) for r in runs])),
            "final_norm": _with_headroom(worst([(r["final_norm"]["overall"], r["run"]) for r in runs])),
            "residual_max": _with_headroom(worst([(la["overall"]["max"], la["overall"]["run"]) for la in layers])),
            "residual_rest_max": _with_headroom(worst([(la["rest"]["max"], la["rest"]["run"]) for la in layers if la["rest"]])),
            "mlp_down_in_max": _with_headroom(worst([(la["mlp_down_in"]["max"], la["mlp_down_in"]["run"])
                                                     for la in layers if la["mlp_down_in"]])),
        }
    return {"fp16_max": FP16_MAX, "what": __doc__.split("\n\n")[1].replace("\n", " "), "groups": out}


def table(result: dict[str, Any]) -> list[str]:
    """The survey as text lines: per pin and engine its residual maximum, then one line a layer."""
    lines = []
    for name, g in result["groups"].items():
        lines.append(f"{name}: {g['runs']} runs; residual max {g['residual_max']['max']:.4g} "
                     f"(headroom x{g['residual_max']['headroom_ratio']:.3g}) in {g['residual_max']['run']}")
        lines.append(f"  {'layer':>5} {'pos0':>10} {'rest':>10} {'overall':>10} {'where':>10} {'down_in':>10} {'bits':>6}")
        for la in g["layers"]:
            down = la["mlp_down_in"]["max"] if la["mlp_down_in"] else None
            rest = la["rest"]["max"] if la["rest"] else None
            lines.append(f"  {la['layer']:>5} {la['pos0']['max']:>10.4g} {'-' if rest is None else f'{rest:.4g}':>10} "
                         f"{la['overall']['max']:>10.4g} {str(la['argmax_pos']) + ':' + str(la['argmax_ch']):>10} "
                         f"{'-' if down is None else f'{down:.4g}':>10} {la['overall']['headroom_bits']:>6.2f}")
    return lines


def plot(result: dict[str, Any]) -> bytes:
    """PNG bytes: one panel per pin/engine, per-layer maxima (log scale) and the float16 limit."""
    from oracles.commands.plots import png_bytes, pyplot

    plt = pyplot()
    from matplotlib.ticker import MaxNLocator

    groups = result["groups"]
    fig, axes = plt.subplots(1, max(len(groups), 1), figsize=(5.5 * max(len(groups), 1), 4.2), squeeze=False)
    for ax, (name, g) in zip(axes[0], groups.items()):
        x = [la["layer"] for la in g["layers"]]
        for field, style in (("overall", "o-"), ("pos0", "s--"), ("rest", "^:")):
            ax.plot(x, [la[field]["max"] if la[field] else float("nan") for la in g["layers"]], style, label=f"residual {field}")
        if any(la["mlp_down_in"] for la in g["layers"]):
            ax.plot(x, [la["mlp_down_in"]["max"] if la["mlp_down_in"] else float("nan") for la in g["layers"]], "d-",
                    label="MLP down_proj input")
        ax.axhline(FP16_MAX, color="red", linewidth=1, label="fp16 max 65504")
        ax.set(title=f"{name} ({g['runs']} runs)", xlabel="decoder layer (its output)", ylabel="max |x|", yscale="log")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=7)
    fig.tight_layout()
    return png_bytes(fig)


def outputs(folder: Path, stem: str, pins: list[str]) -> dict[str, tuple[Path, Path]]:
    """Per pin, its survey's ``(json, png)`` paths: ``<stem>.<pin>.absmax.json`` / ``.png`` in ``folder``."""
    return {pin: (folder / f"{stem}.{pin}.absmax.json", folder / f"{stem}.{pin}.absmax.png") for pin in pins}


def run(args: argparse.Namespace) -> int:
    """Survey ``args.receipt``: per pin, write the JSON (and the PNG where matplotlib imports), print the table.

    Raises:
        FixtureError: the receipt is unreadable, not a receipt, holds no absmax record or a malformed one.
        ReceiptError: ``--out`` names a file, or an output already exists.
    """
    receipt = load_json(args.receipt)
    if not isinstance(receipt, dict) or "tests" not in receipt:
        raise FixtureError(f"{args.receipt}: not a receipt: field 'tests' is missing")
    by_pin: dict[str, list[dict[str, Any]]] = {}
    try:
        for record in absmax_records(receipt):
            by_pin.setdefault(record["pin"], []).append(record)
        results = {pin: survey(by_pin[pin]) for pin in sorted(by_pin)}
    except FixtureError as exc:
        raise FixtureError(f"{args.receipt}: {exc}") from None
    if not results:
        raise FixtureError(f"{args.receipt}: no absmax record (run the survey family, -m survey --runslow, on the "
                           "pins to survey, or the clef family)")
    folder = args.out or args.receipt.parent
    if folder.exists() and not folder.is_dir():
        raise ReceiptError(f"{folder}: --out names a file; it must be a folder (the survey's .json and .png go in it)")
    paths = outputs(folder, args.receipt.name.removesuffix(".json"), list(results))
    taken = [p for pair in paths.values() for p in pair if p.exists()]
    if taken:
        raise ReceiptError(f"{taken[0]}: already exists; a survey is never overwritten")
    note = unavailable()  # no matplotlib: the JSON and tables without the PNGs, and one line saying so
    pngs: dict[str, bytes] = {}
    for pin, result in results.items():
        result.update(receipt=str(args.receipt), pin=pin)
        if note is None:
            pngs[pin] = plot(result)  # every plot drawn before any file is written: a failure leaves none behind
    folder.mkdir(parents=True, exist_ok=True)
    for pin, result in results.items():
        json_path, png_path = paths[pin]
        write_exclusive(json_path, dump_json(result))
        if pin in pngs:
            write_exclusive(png_path, pngs[pin])
        for line in table(result):
            print(line)
        print(f"survey: {json_path}" + (f"\nplot: {png_path}" if pin in pngs else ""))
    if note is not None:
        print(note, file=sys.stderr)
    return 0
