"""The reference larger than memory (``--reference-max-memory``, ``--reference-device-map``:
:mod:`oracles.engines.torch.placement`): the options refused at session start where they cannot hold,
and the offloaded reference bit-identical to the one held in memory.

The bit-identical proof loads SmolLM2-135M (538 MB of float32 weights) with a 200 MB budget, so most of
its layers are read from disk as they run, and holds one short prefill (with every layer's stream) and
two cached decode steps to the in-memory reference's, bit for bit. It would pass vacuously if nothing
were offloaded, so it first asserts that the map put modules on disk and that their weights are not in
memory. The GPU check spreads the draft twin over the visible GPUs and holds it to one GPU, bit for bit.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from oracles.engines.torch.placement import Placement, parse_size
from oracles.plugin.options import BY_FLAG, Resolving

SMOL = "smollm2-135m-instruct"
#: Below SmolLM2's 538 MB: accelerate keeps the tied embedding and the first layers in memory and
#: puts the other layers on disk (probed: 5 of 30 layers in memory, 25 on disk plus the final norm).
BUDGET = "200MB"
#: A chat-templated prompt's first ids (SmolLM2's tokenizer) and the decode steps held after it.
IDS = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3458, 2]
STEPS = 2


@pytest.mark.dry
@pytest.mark.parametrize(("text", "expected"), [("200MB", 200_000_000), ("2GiB", 2 * 2**30), ("1.5 gb", 1_500_000_000),
                                                ("4096", 4096), ("64KiB", 65536)])
def test_sizes_read_as_accelerate_reads_them(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.dry
@pytest.mark.parametrize("text", ["", "0MB", "-1GB", "2 GBs", "lots", "1e9"])
def test_a_size_that_is_no_size_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match="expected a positive size such as 500MB or 2GiB"):
        parse_size(text)


@pytest.mark.dry
def test_a_placement_is_an_offload_or_a_spread() -> None:
    with pytest.raises(ValueError, match="not both"):
        Placement(max_memory=1, device_map="auto")
    with pytest.raises(ValueError, match="expected one of auto"):
        Placement(device_map="balanced")
    assert Placement().from_pretrained_kwargs("cpu", None) == {"device_map": "cpu"}
    assert Placement(5).from_pretrained_kwargs("cpu", Path("/o")) == {
        "device_map": "auto", "max_memory": {"cpu": 5}, "offload_folder": "/o"}


class _Engines:
    """The registry as a placement parser reads it: one engine class by id."""

    def __init__(self, cls: type) -> None:
        self.cls = cls

    def engine_class(self, engine_id: str) -> type:
        return self.cls


class _Project:
    def __init__(self, cls: type) -> None:
        self.engines = _Engines(cls)


@pytest.mark.dry
@pytest.mark.parametrize(("flag", "value", "device", "expected"), [
    ("--reference-max-memory", "1GB", "cuda", "--reference-max-memory 1GB with --reference-device cuda: "
     "--reference-max-memory places the reference on cpu (CPU memory, then disk); drop one of the two"),
    ("--reference-max-memory", "1GB", "mps", "--reference-max-memory 1GB with --reference-device mps: "),
    ("--reference-device-map", "auto", "cpu", "--reference-device-map auto with --reference-device cpu: "
     "--reference-device-map places the reference on cuda (the visible GPUs); drop one of the two"),
    ("--reference-max-memory", "lots", "cpu", "--reference-max-memory 'lots': expected a positive size"),
])
def test_a_placement_that_cannot_hold_is_refused(flag: str, value: str, device: str, expected: str) -> None:
    """Each conflict is one usage line naming both options (parsed after --reference-device: table order)."""
    from oracles.engines.torch.reference import TorchReference

    resolving = Resolving({"reference": "torch", "reference_device": device}, _Project(TorchReference))  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError) as raised:
        BY_FLAG[flag].resolve(value, resolving)
    assert str(raised.value).startswith(expected), raised.value


@pytest.mark.dry
def test_a_reference_that_places_its_own_weights_takes_no_placement() -> None:
    class Elsewhere:
        placements = ()

    resolving = Resolving({"reference": "far", "reference_device": "cpu"}, _Project(Elsewhere))  # type: ignore[arg-type]
    with pytest.raises(pytest.UsageError, match="reference engine far places its own weights"):
        BY_FLAG["--reference-max-memory"].resolve("1GB", resolving)
    assert BY_FLAG["--reference-max-memory"].resolve(None, resolving) == {"reference_max_memory": None}


@pytest.mark.dry
def test_the_placement_reaches_the_reference_only() -> None:
    from oracles.plugin.settings import Settings

    settings = Settings(reference="torch", ports=("mlx",), reference_max_memory=200_000_000)
    assert settings.engine_kwargs("torch") == {"max_memory": 200_000_000}
    assert settings.engine_kwargs("mlx") == {}
    assert "200,000,000 bytes in memory and the rest on disk" in settings.header_line()


def test_placement_options_refused_in_a_session(pytester: pytest.Pytester) -> None:
    """The session refuses at start (exit 4, one line, no receipt): a spread on the CPU."""
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--reference-device-map", "auto", "--receipts-dir=receipts")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert errors == ["ERROR: --reference-device-map auto with --reference-device cpu: --reference-device-map places "
                      "the reference on cuda (the visible GPUs); drop one of the two"], result.errlines
    assert not (pytester.path / "receipts").exists()


def _steps(engine: Any) -> tuple[list[np.ndarray], list[int]]:
    """The prefill's logits, hidden rows and layer stream, then ``STEPS`` greedy decode steps through one cache."""
    cache = engine.make_cache()
    first = engine.forward(IDS, cache, layers=True)
    out, tokens = [first.logits, first.hidden, first.layers], [int(first.logits[-1].argmax())]
    for _ in range(STEPS):
        step = engine.forward([tokens[-1]], cache)
        out += [step.logits, step.hidden]
        tokens.append(int(step.logits[-1].argmax()))
    return out, tokens


@pytest.mark.slow
def test_offloaded_reference_is_bit_identical(engines: Callable[..., Any], verified_snapshot: Callable[[str], Path],
                                              pins: Callable[[str], Any]) -> None:
    """SmolLM2 under a 200 MB budget (most layers read from disk per forward) against the reference held
    in memory: logits, final-norm rows and every layer's stream of a prefill, then two cached decode
    steps, all bit-identical. Built through the session's engine loader, as ``--reference-max-memory``
    builds it (its contract checks installed)."""
    from oracles.engines.torch.placement import offloaded_bytes
    from oracles.engines.torch.reference import TorchReference
    from oracles.plugin.fixtures import EngineLoader
    from oracles.plugin.settings import Settings

    plain: Any = engines("torch", SMOL)
    if plain.describe().get("device_map"):  # this run placed its reference itself: compare with one in memory
        plain = TorchReference(verified_snapshot(SMOL), pins(SMOL), 1)
    settings = Settings(reference="torch", reference_max_memory=parse_size(BUDGET))
    loader = EngineLoader(verified_snapshot, 1, settings.engine_kwargs, lambda *a, **k: None, pins)
    offloaded: Any = loader.get("torch", SMOL)
    facts = offloaded.describe()
    assert facts["max_memory_bytes"] == 200_000_000 and facts["placed_modules"].get("disk", 0) > 0, facts
    weights = sum(p.numel() * p.element_size() for p in plain.model.parameters())
    on_disk = offloaded_bytes(offloaded.model)
    assert weights - on_disk <= parse_size(BUDGET) < weights and on_disk > weights // 2, (weights, on_disk)
    want, want_tokens = _steps(plain)
    got, got_tokens = _steps(offloaded)
    assert got_tokens == want_tokens
    for i, (a, b) in enumerate(zip(want, got)):
        assert a.shape == b.shape and np.array_equal(a, b), (i, a.shape, b.shape, float(np.abs(a - b).max()))


@pytest.mark.gpu
@pytest.mark.slow
def test_spread_over_the_gpus_is_bit_identical(verified_snapshot: Callable[[str], Path],
                                               pins: Callable[[str], Any]) -> None:
    """The draft twin with ``device_map="auto"`` over every visible GPU (accelerate balances the layers
    across them) against the same twin on one GPU: prefill and decode steps bit-identical, the map
    naming every GPU. Identical kernels on identical GPUs: one GPU model name across the map is checked
    first, as different GPU models may order a reduction differently."""
    import torch

    from oracles.engines.torch.device import probe_device
    from oracles.engines.torch.reference import TorchReference

    if (why := probe_device("cuda")) is not None:  # the gpu gate passes for Metal too
        pytest.skip(f"gpu: this check needs CUDA: {why}")
    name = "smollm2-draft-twin"
    root, pin = verified_snapshot(name), pins(name)
    one, spread = TorchReference(root, pin, 1, device="cuda"), TorchReference(root, pin, 1, device="cuda",
                                                                               device_map="auto")
    used = set(spread.model.hf_device_map.values()) if hasattr(spread.model, "hf_device_map") else {0}
    assert used == set(range(torch.cuda.device_count())), used
    assert len({torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}) == 1
    want, want_tokens = _steps(one)
    got, got_tokens = _steps(spread)
    assert got_tokens == want_tokens
    for i, (a, b) in enumerate(zip(want, got)):
        assert np.array_equal(a, b), (i, float(np.abs(a - b).max()))
