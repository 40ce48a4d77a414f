"""oracles.checks.bisect (pure) and oracles.commands.bisect's localise on fake engines: the rule
"first stage over budget whose input is within" names the right stage, never a downstream one."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest

from oracles.checks.bisect import budget, first_divergent, inside_layer, row_nmse, stages, sublayer_budget
from oracles.commands.bisect import table
from oracles.engines.base import Step, Unsupported
from oracles.engines.taps import Taps
from oracles.families.execution.localise import localise

pytestmark = pytest.mark.dry

L, T, D, V = 6, 5, 8, 11


def forward_arrays(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    stream = np.cumsum(rng.standard_normal((L + 1, T, D)), axis=0).astype("<f4")
    return {"stream": stream, "attn": rng.standard_normal((L, T, D)).astype("<f4"),
            "mlp": rng.standard_normal((L, T, D)).astype("<f4"), "hidden": stream[-1] / 3,
            "logits": rng.standard_normal((T, V)).astype("<f4")}


def perturbed(ref: dict[str, np.ndarray], layer: int, size: float, block: str | None = None) -> dict[str, np.ndarray]:
    """The reference with layer ``layer``'s output (and every later stage) moved by ``size``."""
    out = {k: v.copy() for k, v in ref.items()}
    out["stream"][layer + 1:] += size
    out["hidden"] += size
    out["logits"] += size
    if block:
        out[block][layer] += size
    return out


def test_budget_grows_with_depth() -> None:
    assert budget(0) == pytest.approx(5e-9) and budget(1) == pytest.approx(6e-9) and budget(30) == pytest.approx(3.5e-8)
    assert sublayer_budget() == pytest.approx(1.5e-7)


def test_row_nmse_per_position() -> None:
    ref = np.array([[1.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    port = np.array([[1.0, 0.5], [0.0, 0.0], [1.0, 0.0]])
    assert list(row_nmse(ref, port)) == [0.25, 0.0, np.inf]
    with pytest.raises(ValueError, match=r"shapes differ: reference \[3, 2\] vs port \[2, 2\]"):
        row_nmse(ref, port[:2])


def test_faithful_names_nothing() -> None:
    ref = forward_arrays()
    found = stages(ref, {k: v.copy() for k, v in ref.items()})
    assert [s.name for s in found][:2] == ["embedding", "layer 0"] and found[-2].name == "final norm"
    assert first_divergent(found) is None and all(s.cosine == pytest.approx(1.0) for s in found)


@pytest.mark.parametrize("layer", [0, 3, L - 1])
def test_names_the_first_layer_not_the_ones_after(layer: int) -> None:
    ref = forward_arrays()
    found = stages(ref, perturbed(ref, layer, 0.5, "mlp"))
    i = first_divergent(found)
    assert i is not None and found[i].name == f"layer {layer}", [s.name for s in found if s.over]
    assert all(s.over for s in found[i:]), "the error should carry downstream (over budget, but not blamed)"
    assert inside_layer(layer, ref, perturbed(ref, layer, 0.5, "mlp"))["verdict"] == "MLP"
    assert inside_layer(layer, ref, perturbed(ref, layer, 0.5, "attn"))["verdict"] == "attention"
    assert inside_layer(layer, ref, perturbed(ref, layer, 0.5))["verdict"] == "neither"


def test_noise_below_budget_is_not_named() -> None:
    ref = forward_arrays()
    found = stages(ref, perturbed(ref, 2, 1e-7))  # row NMSE ~1e-14, far below 5e-9
    assert first_divergent(found) is None


def test_head_and_final_norm_stages() -> None:
    ref = forward_arrays()
    head = {k: v.copy() for k, v in ref.items()}
    head["logits"][:, 4] += 3.0
    found = stages(ref, head)
    i = first_divergent(found)
    assert i is not None and found[i].name == "head"
    norm = {k: v.copy() for k, v in ref.items()}
    norm["hidden"] *= 2.0
    norm["logits"] *= 2.0
    found = stages(ref, norm)
    i = first_divergent(found)
    assert i is not None and found[i].name == "final norm"


def test_nan_is_over_budget() -> None:
    ref = forward_arrays()
    bad = {k: v.copy() for k, v in ref.items()}
    bad["stream"][2:, 1, 3] = np.nan
    found = stages(ref, bad)
    i = first_divergent(found)
    assert i is not None and found[i].name == "layer 1"
    assert np.isnan(found[2].nmse) and np.isnan(found[2].cosine) and found[2].nmse_position == 1


def test_layer_counts_must_match() -> None:
    ref = forward_arrays()
    with pytest.raises(ValueError, match=r"layer streams differ in shape: reference \[7, 5, 8\] vs port \[6, 5, 8\]"):
        stages(ref, {**ref, "stream": ref["stream"][:-1]})


class FakeEngine:
    """taps: 'yes' (attention and MLP, and the norms where ``arrays`` holds them), 'stream'
    (forward(layers=True) only) or 'no' (neither); ``notes``: its translation notes."""

    def __init__(self, engine_id: str, arrays: dict[str, np.ndarray], taps: str, notes: tuple[str, ...] = ()) -> None:
        self.id, self.pin, self.arrays, self.mode, self.notes = engine_id, "fake-pin", arrays, taps, notes

    def translation_notes(self) -> tuple[str, ...]:
        return self.notes

    def taps(self, ids: Sequence[int]) -> Taps:
        if self.mode != "yes":
            raise Unsupported(self.id, "tap the attention and MLP outputs inside its layers")
        a = self.arrays
        return Taps(a["stream"], a["attn"], a["mlp"], a["hidden"], a["logits"], mixers=["self_attn"] * L,
                    attn_norm=a.get("attn_norm"), mlp_norm=a.get("mlp_norm"))

    def forward(self, ids: Sequence[int], layers: bool = False) -> Step:
        if self.mode == "no":
            raise Unsupported(self.id, "return per-layer states", "its runtime runs the layers fused")
        a = self.arrays
        return Step(logits=a["logits"], hidden=a["hidden"], layers=a["stream"])


def test_localise_reports_layer_and_block() -> None:
    ref = forward_arrays()
    report = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", perturbed(ref, 3, 0.5, "attn"), "yes"),
                      [1, 2, 3], "rec")
    assert report["divergent"] == "layer 3" and report["inside"]["verdict"] == "attention"
    lines = table(report)
    assert any("<-- first over budget" in line and line.startswith("layer 3") for line in lines), lines
    assert lines[-1].endswith(": attention")


def test_localise_stream_only_engine() -> None:
    ref = forward_arrays()
    report = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", perturbed(ref, 1, 0.5), "stream"), [1], "rec")
    assert report["divergent"] == "layer 1" and report["inside"] is None


def test_localise_names_the_engine_it_cannot_localise() -> None:
    ref = forward_arrays()
    report = localise(FakeEngine("ref", ref, "yes"), FakeEngine("fused", ref, "no"), [1], "rec")
    assert report["cannot_localise"] == {"engine": "fused", "why": "its runtime runs the layers fused"}
    assert report["stages"] == [] and "cannot localise: engine 'fused'" in table(report)[-1]


@pytest.mark.parametrize("argv, message", [
    (["bisect", "--port", "fault:nope"], "unknown fault 'nope'; known: faithful, rope_base_default"),
    (["bisect", "--port", "mlx", "--record", "readmex"], "unknown record 'readmex'; known: arith, ping, readme"),
    (["bisect", "--reference", "fault:gate_up_swapped", "--port", "torch"],
     "--reference fault:gate_up_swapped: a fault port is a port (--port); the reference is an engine id"),
    (["bisect", "--port", "torch"], "--port torch: the reference itself, which can name no stage; the faithful "
                                    "control to hold against it is --port fault:faithful"),
])
def test_cli_refuses_bad_input_before_loading(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    from oracles.cli import main

    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_qk_fault_refuses_a_fused_projection_naming_it() -> None:
    """Phi3 keeps q, k and v in one ``qkv_proj``: the GGUF q/k permute has no faithful form there, so the
    fault port is refused naming the attention class (before: an AttributeError traceback in bisect)."""
    from types import SimpleNamespace

    from oracles.faults.kinds import QkInterleaved

    class Phi3Attention:
        qkv_proj = object()

    def engine(attn: object) -> Any:
        layers = [SimpleNamespace(_modules={"self_attn": attn}, self_attn=attn) for _ in range(3)]
        return SimpleNamespace(num_layers=3, model=SimpleNamespace(get_decoder=lambda: SimpleNamespace(layers=layers)))

    assert QkInterleaved().why_not(engine(Phi3Attention())) == \
        "no separate q_proj/k_proj in Phi3Attention (fused projection)"
    assert QkInterleaved().why_not(engine(SimpleNamespace(q_proj=1, k_proj=2))) is None  # positive control


def with_norms(arrays: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {**arrays, "attn_norm": rng.standard_normal((L, T, D)).astype("<f4"),
            "mlp_norm": rng.standard_normal((L, T, D)).astype("<f4")}


@pytest.mark.parametrize("block, verdict", [("attn_norm", "attention norm"), ("attn", "attention"),
                                            ("mlp_norm", "MLP norm"), ("mlp", "MLP")])
def test_inside_layer_names_the_first_block_in_running_order(block: str, verdict: str) -> None:
    """With both sides' norms the blocks are norm, attention, norm, MLP; the first over budget is named,
    though every block after it (which reads it) is over too."""
    ref = with_norms(forward_arrays())
    port = perturbed(ref, 2, 0.5, block)
    order = ["attn_norm", "attn", "mlp_norm", "mlp"]
    for later in order[order.index(block) + 1:]:
        port[later][2] += 0.5  # the error carried into every block that reads it
    inside = inside_layer(2, ref, port)
    assert inside["verdict"] == verdict
    assert [k for k in inside if k != "verdict"] == ["attention_norm", "attention", "mlp_norm", "mlp"]


def test_inside_layer_without_norms_on_one_side_reads_the_blocks_only() -> None:
    ref = with_norms(forward_arrays())
    port = {k: v for k, v in perturbed(ref, 2, 0.5, "attn").items() if k not in ("attn_norm", "mlp_norm")}
    inside = inside_layer(2, ref, port)
    assert inside["verdict"] == "attention" and "attention_norm" not in inside and "mlp_norm" not in inside


def test_the_norms_go_through_localise_into_the_table() -> None:
    ref = with_norms(forward_arrays())
    report = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", perturbed(ref, 0, 0.5, "attn_norm"), "yes"),
                      [1, 2, 3], "rec")
    assert report["divergent"] == "layer 0" and report["inside"]["verdict"] == "attention norm"
    assert table(report)[-1].startswith("inside it: attention norm NMSE ") and table(report)[-1].endswith(": attention norm")


NOTE = "rope_theta 100000.0 from rope_parameters.rope_theta (mlx-lm reads 10000)"


@pytest.mark.parametrize("port", [None, 3])
def test_every_verdict_names_the_ports_translations(port: int | None) -> None:
    """The verdict line and the report name what the port's adapter translated to load the artifact,
    whether a stage is named or none; a port that translated nothing has no bracket and an empty list."""
    ref = forward_arrays()
    arrays = ref if port is None else perturbed(ref, port, 0.5, "mlp")
    report = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", arrays, "yes", (NOTE, "second note")), [1], "rec")
    assert report["translations"] == [NOTE, "second note"]
    verdict = next(line for line in table(report) if line.startswith("verdict: "))
    assert verdict.endswith(f" [port loaded with {NOTE}; second note]"), verdict
    plain = localise(FakeEngine("ref", ref, "yes"), FakeEngine("port", arrays, "yes"), [1], "rec")
    assert plain["translations"] == [] and "[" not in next(x for x in table(plain) if x.startswith("verdict: "))
