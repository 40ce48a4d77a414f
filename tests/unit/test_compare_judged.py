"""``oracles compare`` holds each pin pair as its pins' precision judges it (oracles.pins.pairing.judgment_of):
an exact artifact to FLOAT32, a bfloat16 artifact to the band the reference receipt's band units
calibrate, a quantized artifact against a reference without its weights refused or, ``--graded``, graded.

The pins are small pin files in the test project's pins folder, with the ``precision``, ``reference``
and ``converted_from`` fields the pins part adds. Until :class:`oracles.pins.pin.Pin` parses those
fields, :func:`declare_precision` hands ``judgment_of`` a Pin-like object carrying them from the same file (the
real ``judgment_of`` judges it); once Pin has them the fixture does nothing.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pytest
from units_fake import PIN, decode, logits, near, write

from oracles.checks.judgment import BAND_RATIO
from oracles.checks.tolerance import FLOAT32
from oracles.pins.pin import Pin, PinStore

Cli = Callable[..., tuple[int, str, str]]
TOKENS = [5, 6, 2]
BF16, Q4, Q4_DEQUANT = "art-bf16", "art-q4", "art-q4-dequant"
#: The band's error in the band tests: the reference's top logit of each row lowered by 5. Large on
#: purpose: there KL(ref || port) grows about linearly with the error (p_top * d), as max |Δlogit| does,
#: so "twice the band's error" is within BAND_RATIO on every figure; for a small error KL grows as its
#: square and twice the band's error is 4x the band's KL.
BAND_DROP = 5.0


@dataclasses.dataclass(frozen=True)
class _Declared:
    """The fields of a pin that judgment_of reads, from its pin file."""

    name: str
    path: Path
    precision: SimpleNamespace
    reference: str | None
    converted_from: str | None


def declare_precision(setattr: Callable[[Any, str, Any], None]) -> None:
    """Make ``PinStore.load`` return :class:`_Declared` pins (through ``setattr``), while Pin lacks the
    fields; else do nothing."""
    if "precision" in {f.name for f in dataclasses.fields(Pin)}:
        return
    load = PinStore.load

    def declared(self: PinStore, name: str) -> Any:
        pin, obj = load(self, name), json.loads(self.path(name).read_text())  # type: ignore[union-attr]
        precision = {"weights": "float32", "compute": "float32", "dequantized_from": None, **obj.get("precision", {})}
        return _Declared(pin.name, pin.path, SimpleNamespace(**precision), obj.get("reference"),
                         obj.get("converted_from"))

    setattr(PinStore, "load", declared)


@pytest.fixture(autouse=True)
def _declared(monkeypatch: pytest.MonkeyPatch) -> None:
    declare_precision(monkeypatch.setattr)


def _pin(folder: Path, name: str, **fields: Any) -> None:
    """A minimal valid pin file ``folder/name.json`` (one tokenizer file) with ``fields`` added."""
    folder.mkdir(parents=True, exist_ok=True)
    body = {"name": name, "source": f"local:/nowhere/{name}", "model_class": "LlamaForCausalLM",
            "files": {"tokenizer.json": {"bytes": 1, "sha256": "d" * 64}}, **fields}
    (folder / f"{name}.json").write_text(json.dumps(body))


@pytest.fixture
def pins(pin_project: Path) -> Path:
    """The project's pins: a bfloat16 cast of PIN, a 4-bit artifact of PIN and its dequantized snapshot."""
    folder = pin_project / "fixtures" / "pins"
    _pin(folder, BF16, precision={"weights": "bfloat16", "compute": "bfloat16"}, converted_from=PIN, reference=PIN)
    _pin(folder, Q4, precision={"weights": "affine", "compute": "float32", "bits": 4, "group_size": 64,
                                "mode": "affine"}, converted_from=PIN, reference=Q4_DEQUANT)
    _pin(folder, Q4_DEQUANT, precision={"weights": "float32", "compute": "float32", "dequantized_from": Q4})
    return pin_project


def _rows() -> np.ndarray:
    """``[3, V]`` step logits of the reference."""
    return np.stack([logits(100), logits(101), logits(7)]).astype("<f4")


def _top_dropped(rows: np.ndarray, by: float) -> np.ndarray:
    """``rows`` with each row's largest logit lowered by ``by``."""
    out = rows.copy()
    out[np.arange(rows.shape[0]), rows.argmax(-1)] -= np.float32(by)
    return out


def _compare(cli: Cli, folder: Path, ref: Path, port: Path, ref_pin: str, port_pin: str,
             *extra: str) -> tuple[int, str, str, dict[str, Any] | None]:
    out = folder / "cmp.json"
    status, text, err = cli("compare", str(ref), str(port), "--ref-pin", ref_pin, "--port-pin", port_pin,
                            "--out", str(out), *extra)
    return status, text, err, json.loads(out.read_text()) if out.exists() else None


@pytest.mark.dry
@pytest.mark.parametrize(("offset", "status"), [(1e-4, 0), (1e-2, 1)])
def test_exact_artifact_pair_is_held_to_float32(pins: Path, oracles_cli: Cli, offset: float, status: int) -> None:
    """A 4-bit artifact against the snapshot dequantized from it: FLOAT32 (max |Δlogit| 5e-3), so a
    1e-4 offset passes and a 1e-2 one fails, naming the float32 bound."""
    base = _rows()
    ref = write(pins / "a", "ref", [decode("torch", base, TOKENS, pin=Q4_DEQUANT)])
    port = write(pins / "b", "port", [decode("mlx", base + np.float32(offset), TOKENS, pin=Q4)])
    code, text, _, result = _compare(oracles_cli, pins, ref, port, Q4_DEQUANT, Q4)
    assert code == status and result is not None
    assert f"judged exact (float32): port pin {Q4} computes in float32 on the weights of {Q4_DEQUANT}" in text
    assert result["pins"][0]["judgment"]["kind"] == "exact" and result["rows"][0]["tolerance"] == "float32"
    if status:
        assert f"max |Δlogit| 1.000e-02 > {FLOAT32.max_abs_logit:g}" in result["rows"][0]["failures"][0]


@pytest.mark.dry
@pytest.mark.parametrize(("times", "status"), [(2, 0), (4, 1)])
def test_band_pair_is_held_to_the_band(pins: Path, oracles_cli: Cli, times: int, status: int) -> None:
    """A bfloat16 artifact against its float32 original: each unit's bound is BAND_RATIO (3) times the
    reference receipt's band unit (torch@bfloat16 on the reference pin) on the same rows; a port at twice
    the band's error passes, at four times fails (max |Δlogit| 20 > 15), though both are far past
    FLOAT32; a greedy token that changes is no failure by itself under a band."""
    base = _rows()
    ref = write(pins / "a", "ref", [decode("torch", base, TOKENS),
                                    decode("torch@bfloat16", _top_dropped(base, BAND_DROP), TOKENS)])
    port = write(pins / "b", "port", [decode("mlx", _top_dropped(base, times * BAND_DROP), [5, 7, 2], pin=BF16)])
    code, text, _, result = _compare(oracles_cli, pins, ref, port, PIN, BF16)
    assert code == status and result is not None
    assert result["pins"][0]["judgment"] == {
        "kind": "band", "dtype": "bfloat16",
        "why": f"port pin {BF16} computes in bfloat16: held to the band of the reference run in bfloat16 on {PIN}"}
    row = result["rows"][0]
    assert row["tolerance"] == f"band x{BAND_RATIO:g}" and f"band x{BAND_RATIO:g}" in text
    band_error = row["band"].get("stored_error", 0.0)  # the reference rows are stored to it
    assert abs(row["band"]["max_abs"] - BAND_DROP) <= band_error + 1e-6 and row["band"]["rows"] == 2  # through the divergence
    assert near(row, "max_abs", times * BAND_DROP, rel=1e-6)
    if status:
        assert f"max |Δlogit| 2.000e+01 > {BAND_RATIO * BAND_DROP:g}" in row["failures"][0]
    else:
        assert row["failures"] == [] and row["first_divergent_token"] == 1


@pytest.mark.dry
def test_band_pair_without_band_units_is_refused(pins: Path, oracles_cli: Cli) -> None:
    base = _rows()
    ref = write(pins / "a", "ref", [decode("torch", base, TOKENS)])
    port = write(pins / "b", "port", [decode("mlx", base, TOKENS, pin=BF16)])
    code, text, err, result = _compare(oracles_cli, pins, ref, port, PIN, BF16)
    assert (code, text, result) == (2, "", None)
    assert err == (f"oracles compare: error: {ref}: 1 of 1 matched units of pins {PIN}/{BF16} have no band unit "
                   f"(engine torch@bfloat16 on pin {PIN}; first: decode arith), and the bfloat16 band judges them: run "
                   f"the port tests with --port-pin {PIN}={BF16}, which attach them, and compare that receipt\n")


@pytest.mark.dry
def test_quantized_artifact_against_the_float32_original_is_refused_or_graded(pins: Path, oracles_cli: Cli) -> None:
    """4-bit weights against a reference that does not hold them: refused with judgment_of's line; with
    --graded, the figures are printed and recorded as graded, and the exit status is 0 though they are
    far past every float32 bound."""
    base = _rows()
    ref = write(pins / "a", "ref", [decode("torch", base, TOKENS)])
    port = write(pins / "b", "port", [decode("mlx", base + np.float32(3.0), [5, 7, 2], pin=Q4)])
    code, text, err, result = _compare(oracles_cli, pins, ref, port, PIN, Q4)
    assert (code, text, result) == (2, "", None)
    assert err.startswith(f"oracles compare: error: --port-pin {PIN}={Q4}: pin {Q4} holds affine weights, which pin "
                          f"{PIN} does not hold;") and err.endswith("; or oracles compare --graded: its figures, with "
                                                                    "no verdict\n")
    code, text, err, result = _compare(oracles_cli, pins, ref, port, PIN, Q4, "--graded")
    assert code == 0 and result is not None and result["all_ok"]
    assert "1 units matched on 1 pins, 1 of them graded (no verdict)" in text and "graded 1" in text
    assert f"judged graded (no verdict): --port-pin {PIN}={Q4}: pin {Q4} holds affine weights" in text
    row = result["rows"][0]
    assert (row["status"], row["ok"], row["tolerance"], row["failures"]) == ("graded", None, None, [])
    assert row["max_abs"] == pytest.approx(3.0, rel=1e-3)
    assert result["pins"][0]["judgment"]["kind"] == "graded" and result["figures"]["graded"] == 1
    assert result["figures"]["recorded_only"] == 0


@pytest.mark.dry
def test_a_pin_not_in_the_store(pins: Path, oracles_cli: Cli) -> None:
    """Another machine's pin: exact when both sides are that pin; across pins refused, naming the pin and
    the folders searched."""
    base = _rows()
    both = write(pins / "a", "both", [decode("torch", base, TOKENS, pin="elsewhere"),
                                      decode("mlx", base + np.float32(1e-4), TOKENS, pin="elsewhere"),
                                      decode("mlx", base, TOKENS, pin=BF16)])
    code, text, _, result = _compare(oracles_cli, pins, both, both, "elsewhere", "elsewhere")
    assert code == 0 and result is not None and result["pins"][0]["judgment"]["kind"] == "exact"
    code, _, err, _ = _compare(oracles_cli, pins / "x", both, both, "elsewhere", BF16)
    assert code == 2
    builtin = Path(__file__).resolve().parents[2] / "oracles" / "builtin" / "pins"
    assert err == (f"oracles compare: error: pin 'elsewhere' of the pair elsewhere/{BF16} is not in "
                   f"{pins.resolve() / 'fixtures' / 'pins'} then {builtin}: "
                   "its precision decides the thresholds (oracles --pins-dir DIR compare ...: the folder holding its pin "
                   "file)\n")


@pytest.mark.dry
def test_a_band_engine_is_never_the_default_port(pins: Path, oracles_cli: Cli) -> None:
    """Pin by pin, the band engine's units beside the reference's and the port's are not a second port."""
    base = _rows()
    both = write(pins / "a", "both", [decode("torch", base, TOKENS), decode("mlx", base, TOKENS),
                                      decode("torch@bfloat16", base + np.float32(1.0), TOKENS)])
    status, text, err = oracles_cli("compare", str(both), str(both), "--out", str(pins / "c.json"))
    assert status == 0, err
    assert f"== pin {PIN}: torch vs mlx: 1 units matched" in text


def test_compare_imports_no_torch(pins: Path, tmp_path: Path) -> None:
    """A band comparison, in a fresh interpreter, loads neither torch nor mlx. Not dry: it starts the
    interpreter (~0.2 s)."""
    base = _rows()
    ref = write(pins / "a", "ref", [decode("torch", base, TOKENS), decode("torch@bfloat16", base, TOKENS)])
    port = write(pins / "b", "port", [decode("mlx", base, TOKENS, pin=BF16)])
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
            "from test_compare_judged import declare_precision; declare_precision(setattr); "
            "from oracles.cli import main; "
            f"s = main(['compare', {str(ref)!r}, {str(port)!r}, '--ref-pin', {PIN!r}, '--port-pin', {BF16!r}, "
            f"'--out', {str(tmp_path / 'c.json')!r}]); "
            "print(s, sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'mlx', 'transformers')))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=pins, timeout=120)
    assert done.stdout.strip().splitlines()[-1] == "0 []", done.stdout + done.stderr
    assert "judged band (bfloat16)" in done.stdout  # the band path ran
