"""The ExecuTorch port on the draft twin's ``.pte`` exports against the float32 torch reference on the twin:
prefill (one call, and two through the 511-token dynamic bound), decode through the program's own static
cache against a teacher-forced reference, trim by cache_position proven bitwise, snapshot/restore of the
named KV buffers, independent caches, greedy generation, the refusals; the 8da4w export graded with
llama-perplexity's statistics (into the receipt), and the 8w export's broken logits as a strict xfail.
Slow: both engines load (~10 s, most of it torch's and executorch's import)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from port_figures import held, prefill_held, prompt

from oracles.checks.judgment import BAND_RATIO
from oracles.engines.base import Engine, Sampler
from oracles.errors import PinError
from oracles.pins.pin import load_pin
from oracles.receipts.table import Receipt

pytestmark = pytest.mark.slow

PIN, REFERENCE = "smollm2-draft-twin-executorch", "smollm2-draft-twin"
Q4, Q8 = "smollm2-draft-twin-executorch-8da4w", "smollm2-draft-twin-executorch-8w"
#: The ids the 8w finding was measured on, and torchao's own quantized model's distance from float32 on
#: them (the eager model `quantize_model_(qlinear="8w")` makes, before export): max |Δlogit| 7.0e-3, argmax
#: 30/30. A faithful lowering of weight-only int8 is that far, give or take a second implementation's
#: rounding (BAND_RATIO, as a band judges one); the program is 2287 away.
Q8_IDS = list(range(100, 130))
Q8_EAGER_MAX_ABS = 7.0e-3
Q8_FINDING = ("optimum-executorch 1.1.0 `--qlinear 8w` (executorch 1.5.1, torchao 0.18.0, XNNPACK recipe) reports "
              "success and writes a program whose logits are garbage: on the draft twin, 30 ids, max |Δlogit| 2287 "
              "vs float32 and argmax 0/30, where torchao's quantized model before export is within 7.0e-3 (argmax "
              "30/30); the exported program is still within 7.0e-3, the break starts at to_edge_transform_and_lower "
              "with the XnnpackPartitioner, whose graphs hold no int8 value (202 fp32 values, the float32 export 204: "
              "the weights folded back to float32, wrongly) (SmolLM2: 12,023, argmax 0/35, issue 27)")


def _engine(verified_snapshot: Callable[[str], Path], name: str) -> Engine:
    pytest.importorskip("executorch")
    from oracles.engines.executorch.engine import ExecuTorchPort

    return ExecuTorchPort(verified_snapshot(name), load_pin(name), threads=1)


@pytest.fixture(scope="module")
def engines(verified_snapshot: Callable[[str], Path]) -> tuple[Engine, Engine]:
    from oracles.engines.torch.reference import TorchReference

    port = _engine(verified_snapshot, PIN)
    return port, TorchReference(verified_snapshot(REFERENCE), load_pin(REFERENCE), threads=1)


@pytest.mark.parametrize("n", [42, 512])
def test_prefill_matches_the_reference(engines: tuple[Engine, Engine], n: int) -> None:
    """One call (42 ids), and 511 + 1 (the forward's dynamic bound is get_max_seq_len - 1)."""
    prefill_held(*engines, n)


def test_the_runtime_extension_gives_executorch_runtimes_bits(verified_snapshot: Callable[[str], Path]) -> None:
    """The engine calls ExecuTorch's C++ extension without importing ``executorch.runtime`` (whose import loads the
    exporter, ``executorch.exir``): on the float32 and the 8da4w programs its prefill and a decode step are bitwise
    what ``executorch.runtime``'s public API gives for the same ids and cache positions."""
    import sys

    import torch

    pytest.importorskip("executorch")
    from oracles.engines.executorch.engine import ExecuTorchPort

    ports = {name: ExecuTorchPort(verified_snapshot(name), load_pin(name), threads=1) for name in (PIN, Q4)}
    ids, token = prompt(20, seed=11), 4242
    steps = {}
    for name, port in ports.items():
        cache = port.make_cache()
        steps[name] = (port.forward(ids, cache), port.forward([token], cache))
    imported = sorted(m for m in sys.modules if m.startswith("executorch.exir"))
    assert not imported, f"building and running the engine imported ExecuTorch's exporter: {imported[:3]}"
    from executorch.runtime import Runtime, Verification

    for name, port in ports.items():
        method = Runtime.get().load_program(str(port.path), verification=Verification.Minimal).load_method("forward")
        first = method.execute([torch.tensor([ids], dtype=torch.long), torch.arange(len(ids), dtype=torch.long)])[0][0]
        second = method.execute([torch.tensor([[token]], dtype=torch.long), torch.tensor([len(ids)], dtype=torch.long)])[0][0]
        vocab = port.vocab_size
        for got, want in ((steps[name][0], first.numpy()), (steps[name][1], second.numpy())):
            assert got.logits.tobytes() == np.ascontiguousarray(want[:, :vocab]).tobytes(), name
            assert got.hidden.tobytes() == np.ascontiguousarray(want[:, vocab:]).tobytes(), name
        prefill, decode = steps[name]
        # not a constant output: the decode row is its own, not the prefill's last
        assert np.ptp(prefill.logits) > 0 and not np.array_equal(decode.logits[0], prefill.logits[-1]), name


def test_decode_through_the_static_cache(engines: tuple[Engine, Engine]) -> None:
    """A 30-id prefill and 5 single-token steps through one cache, against the reference's cold forward
    of the whole sequence (teacher-forced)."""
    port, ref = engines
    ids = prompt(35, seed=2)
    cache = port.make_cache()
    rows = [port.forward(ids[:30], cache).logits] + [port.forward([t], cache).logits for t in ids[30:]]
    assert port.cache_length(cache) == 35
    held(np.concatenate(rows), ref.forward(ids).logits)


def test_trim_then_rerun_is_a_fresh_cache(engines: tuple[Engine, Engine]) -> None:
    """Trim is legitimate: rows past the valid length are masked by cache_position and overwritten, so a
    cache filled with 40 ids, trimmed to 30 and run on 10 others gives the bits a fresh cache gives on the
    same 30 + 10 in the same calls. The positive control: the same 10 ids at position 40 (no trim) differ."""
    port = engines[0]
    ids, other = prompt(40, seed=3), prompt(10, seed=4)
    used = port.make_cache()
    port.forward(ids, used)
    assert port.trim(used, 10) and port.cache_length(used) == 30
    trimmed = port.forward(other, used).logits
    fresh = port.make_cache()
    port.forward(ids[:30], fresh)
    assert trimmed.tobytes() == port.forward(other, fresh).logits.tobytes()
    control = port.make_cache()
    port.forward(ids, control)
    assert port.forward(other, control).logits.tobytes() != trimmed.tobytes()


def test_snapshot_restore_and_independent_caches(engines: tuple[Engine, Engine]) -> None:
    """A snapshot is a copy of the named KV buffers (later steps leave it unchanged); a restore in a freshly
    loaded program continues bit for bit as the original cache does; two live caches do not share rows."""
    port = engines[0]
    ids, more = prompt(24, seed=5), prompt(4, seed=6)
    cache = port.make_cache()
    port.forward(ids, cache)
    snap = port.snapshot(cache)
    digest = port.snapshot_digest(snap)
    buffers = port.snapshot_buffers(snap)
    assert buffers["layers.0.keys"].shape == (1, 2, 24, 16) and np.abs(buffers["layers.1.values"]).max() > 0
    other = port.make_cache()
    port.forward(prompt(24, seed=7), other)  # another cache's rows, interleaved
    after = port.forward(more, cache).logits
    assert port.snapshot_digest(snap) == digest
    restored = port.restore(snap)
    assert port.cache_length(restored) == 24
    assert port.forward(more, restored).logits.tobytes() == after.tobytes()


def test_greedy_generation_matches_the_reference(engines: tuple[Engine, Engine]) -> None:
    port, ref = engines
    ids = prompt(12, seed=8)
    a, b = port.generate(ids, Sampler(), 8), ref.generate(ids, Sampler(), 8)
    assert a.tokens == b.tokens
    held(a.step_logits, b.step_logits)


def test_past_the_cache_rows_is_refused(engines: tuple[Engine, Engine]) -> None:
    """The engine refuses a forward past get_max_seq_len in one line; the runtime's own refusal of a
    cache_position of 512 is an index error inside the program (quoted here: why the engine checks first)."""
    port = engines[0]
    cache = port.make_cache()
    port.forward(prompt(500), cache)
    with pytest.raises(ValueError, match=r"^forward: 500 cached \+ 13 new tokens exceed the context of 512 "):
        port.forward(prompt(13), cache)
    with pytest.raises(RuntimeError, match="failed with error"):
        cache.length = 512
        port._run([5], cache)  # type: ignore[attr-defined]


def test_truncated_program_is_one_line(engines: tuple[Engine, Engine], tmp_path: Path) -> None:
    from oracles.engines.executorch.artifact import read_pte

    port = engines[0]
    whole = port.path.read_bytes()  # type: ignore[attr-defined]
    cut = tmp_path / "model.pte"
    cut.write_bytes(whole[: len(whole) - 1000])
    with pytest.raises(PinError, match=rf"^{cut}: truncated: its segments end at byte {len(whole)} but the file has "
                                       rf"{len(whole) - 1000} bytes$"):
        read_pte(cut)


def test_conversion_carries_hidden_and_buffer_names(engines: tuple[Engine, Engine]) -> None:
    """The built-in conversion's forward outputs [1, S, V + D] and names its KV buffers (the two additions)."""
    facts = engines[0].facts  # type: ignore[attr-defined]
    assert facts.outputs[0].sizes[-1] == 49152 + 64
    assert {"key_cache_0", "value_cache_0", "key_cache_1", "value_cache_1"} <= {t.name for t in facts.buffers}


def test_delegates_say_what_each_export_quantized(verified_snapshot: Callable[[str], Path]) -> None:
    """The reader's quantization from the XNNPACK blobs: float32 holds only fp32 values; 8da4w holds int4
    blockwise weights and int8 dynamic activations (the positive control); 8w, asked for int8 weights,
    holds only fp32 values: its weights were folded back to float32 at lowering (what its xfail below quotes)."""
    from oracles.engines.executorch.artifact import quantization_of, read_pte

    got = {name: read_pte(verified_snapshot(name) / "model.pte") for name in (PIN, Q4, Q8)}
    assert set(got[PIN].xnnpack_datatypes) == {"fp32"}
    assert quantization_of(got[Q4]) == {"weights": "int4 blockwise", "activations": "int8 dynamic"}
    assert set(got[Q8].xnnpack_datatypes) == {"fp32"}, got[Q8].xnnpack_datatypes


def test_logits_only_program_is_refused(verified_snapshot: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A program whose forward returns logits only (what optimum-cli writes) is refused at load, one line
    naming the file and the field (the width read as V alone, as check_pte reads it from such a program)."""
    pytest.importorskip("executorch")
    from oracles.engines.executorch import engine

    monkeypatch.setattr(engine, "check_pte", lambda facts, config, n: (49152, 0))
    root = verified_snapshot(PIN)
    with pytest.raises(PinError, match=rf"^{root / 'model.pte'}: field 'forward.outputs\[0\]' is logits \[1, S, 49152\] "
                                       "only; the engine contract returns the final norm's hidden state too"):
        engine.ExecuTorchPort(root, load_pin(PIN), threads=1)


@pytest.mark.graded
def test_8da4w_graded_against_float32(engines: tuple[Engine, Engine], verified_snapshot: Callable[[str], Path],
                                      receipt: Receipt) -> None:
    """The 8da4w export (4-bit weights, 8-bit activations quantized at run time) has no dequantized
    reference: graded with llama-perplexity's statistics against the float32 reference over one 512-token
    chunk of the corpus (into the receipt). Graded, not a pass: the cost must be above zero (zero is the
    float32 model again) and every figure finite."""
    from oracles.families.graded.corpus import corpus_for
    from oracles.families.graded.run import graded

    ref = engines[1]
    port = _engine(verified_snapshot, Q4)
    corpus = corpus_for(port.tokenizer, n_ctx=512)
    fig = graded(ref, port, corpus, [0])
    pooled = fig["pooled"]
    receipt.update(kind="executorch-8da4w-graded", port_pin=Q4, reference_pin=REFERENCE, figures=fig,
                   band=None, why_no_band="the int4 weights are inside XNNPACK's delegate blob (no reader gives them "
                   "back as float32) and the int8 activation rounding is XNNPACK's qd8 kernels': no independent "
                   "reference computes either")
    assert pooled["kld"]["mean"] > 0, f"{Q4}: KL mean 0: the float32 model again, nothing was quantized"
    assert np.isfinite([pooled["kld"]["mean"], pooled["kld"]["max"], pooled["same_top_p"]["value"]]).all(), pooled


@pytest.mark.xfail(strict=True, reason=Q8_FINDING)
def test_8w_export_within_its_quantization_cost(engines: tuple[Engine, Engine],
                                                verified_snapshot: Callable[[str], Path]) -> None:
    """Weight-only int8 costs what torchao's own quantized model costs (Q8_EAGER_MAX_ABS on these ids): the
    program must be within BAND_RATIO times that of float32, every argmax equal."""
    ref = engines[1]
    port = _engine(verified_snapshot, Q8)
    a, b = port.forward(Q8_IDS).logits, ref.forward(Q8_IDS).logits
    max_abs = float(np.abs(a.astype(np.float64) - b).max())
    agree = int((a.argmax(-1) == b.argmax(-1)).sum())
    assert max_abs <= BAND_RATIO * Q8_EAGER_MAX_ABS and agree == len(Q8_IDS), \
        (f"{Q8}: max |Δlogit| {max_abs:.4g} vs float32 (bound {BAND_RATIO * Q8_EAGER_MAX_ABS:.3g}), argmax "
         f"{agree}/{len(Q8_IDS)}; its XNNPACK values: {port.facts.xnnpack_datatypes}")  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def roots(verified_snapshot: Callable[[str], Path]) -> dict[str, Path]:
    """The twin's and its 8da4w export's verified folders, found before a test points ``$ORACLES_HOME`` elsewhere."""
    return {name: verified_snapshot(name) for name in (REFERENCE, Q4)}


def test_a_users_pte_is_pinned_and_runs(roots: dict[str, Path], pin_project: Path, tmp_path: Path,
                                        verified_snapshot: Callable[[str], Path],
                                        oracles_cli: Callable[..., tuple[int, str, str]]) -> None:
    """``oracles pin mine --from FILE.pte --reference ref``: the program pinned beside the reference's config and
    tokenizer, its precision read from its delegates, and the engine loads the pin (the built-in twin export
    stands for the user's file; the reference is the twin pinned as a local folder). A truncated copy is refused
    in one line, nothing written."""
    from oracles.pins.pin import PinStore, snapshot_dir, verify_snapshot
    from oracles.pins.writer import write_pin

    pytest.importorskip("executorch")
    write_pin("ref", str(roots[REFERENCE]), pin_project / "fixtures" / "pins", trained=False)
    user = tmp_path / "user"
    user.mkdir()
    whole = (roots[Q4] / "model.pte").read_bytes()
    (user / "cut.pte").write_bytes(whole[:-1000])
    status, out, err = oracles_cli("pin", "mine", "--from", str(user / "cut.pte"), "--reference", "ref")
    assert status != 0 and f"{user / 'cut.pte'}: truncated: its segments end at byte {len(whole)}" in err, err
    assert not (pin_project / "fixtures" / "pins" / "mine.json").exists()
    (user / "model.pte").write_bytes(whole)
    status, out, err = oracles_cli("pin", "mine", "--from", str(user / "model.pte"), "--reference", "ref")
    assert status == 0, err
    pin = load_pin("mine", PinStore.with_project(pin_project / "fixtures" / "pins"))
    assert pin.precision.to_json() == {"weights": "int4", "compute": "dynamic_int8"}
    verify_snapshot(pin, snapshot_dir(pin))
    from oracles.engines.executorch.engine import ExecuTorchPort

    mine, builtin = ExecuTorchPort(snapshot_dir(pin), pin, threads=1), _engine(verified_snapshot, Q4)
    ids = prompt(20, seed=9)
    assert mine.forward(ids).logits.tobytes() == builtin.forward(ids).logits.tobytes()
