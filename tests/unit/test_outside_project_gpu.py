"""The reference on an accelerator (``--reference-device``) and the ``torch-cuda`` port, as a GPU machine
outside this one would run them. Here (no GPU, a CPU-only torch) every way in is refused in one line
naming what was probed; the one check that needs a GPU is marked ``gpu`` and skips naming the probe.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import pytest

from oracles.engines.torch.cuda import TorchCuda
from oracles.engines.torch.device import probe_device, torch_build_cuda

NO_CUDA = probe_device("cuda")


def test_torch_build_is_read_without_importing_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('never imported')\n")
    (fake / "version.py").write_text("from typing import Optional\n__version__ = '2.13.0+cu128'\ncuda: Optional[str] = '12.8'\n")
    real = importlib.util.find_spec
    spec = importlib.util.spec_from_file_location("torch", fake / "__init__.py", submodule_search_locations=[str(fake)])
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: spec if name == "torch" else real(name, *a))
    assert torch_build_cuda() == "12.8"
    (fake / "version.py").write_text("cuda: Optional[str] = None\n")
    assert torch_build_cuda() is None


@pytest.mark.skipif(NO_CUDA is None, reason="a CUDA GPU answers here: nothing to refuse")
def test_cuda_port_says_what_was_probed() -> None:
    reason = TorchCuda.unavailable_reason()
    assert reason is not None and reason == NO_CUDA
    assert "cuda = None" in reason or "/dev/nvidia" in reason or "nvidia-smi" in reason, reason


@pytest.mark.parametrize("args, expected", [
    (("--reference-device", "cuda"), f"ERROR: --reference-device cuda: {NO_CUDA}"),
    (("--reference-device", "mps"), "ERROR: --reference-device mps: MPS needs macOS on arm64; this is "),
    (("--port", "torch-cuda"), f"ERROR: --port 'torch-cuda': engine cannot run here: {NO_CUDA}; drop it, or use "
                               "--port auto to run the ports that can"),
], ids=["reference-cuda", "reference-mps", "port-torch-cuda"])
def test_no_accelerator_is_one_usage_line(pytester: pytest.Pytester, args: tuple[str, ...], expected: str) -> None:
    if NO_CUDA is None and "cuda" in " ".join(args):
        pytest.skip("a CUDA GPU answers here: nothing to refuse")
    if args[1] == "mps" and probe_device("mps") is None:
        pytest.skip("this is macOS on arm64: MPS may answer")
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest(*args, "--receipts-dir=receipts")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if line.startswith("ERROR:")]
    assert len(errors) == 1 and errors[0].startswith(expected), result.errlines
    assert not (pytester.path / "receipts").exists()


def test_reference_device_is_recorded(pytester: pytest.Pytester, only_receipt: Callable[..., Any]) -> None:
    pytester.makepyfile("def test_a():\n    pass\n")
    result = pytester.runpytest("--reference-device", "cpu", "--receipts-dir=receipts")
    result.assert_outcomes(passed=1)
    _, receipt = only_receipt(pytester.path / "receipts")
    assert receipt["invocation"]["reference_device"] == "cpu"


@pytest.mark.gpu
@pytest.mark.slow
def test_reference_on_cuda_is_held_like_a_port_with_tf32_off(verified_snapshot: Callable[[str], Path],
                                                             pins: Callable[[str], Any]) -> None:
    """The draft twin's prefill on CUDA (float32, TF32 off) held against the CPU reference with the CUDA
    engine's port thresholds (float32: oracles.checks.tolerance); its receipt facts say TF32 is off."""
    from oracles.checks.port import assert_within_thresholds, held_figures
    from oracles.engines.torch.reference import TorchReference

    if NO_CUDA is not None:  # the gpu gate passes for Metal too
        pytest.skip(f"gpu: this check needs CUDA: {NO_CUDA}")
    root = verified_snapshot("smollm2-draft-twin")
    ids = list(range(1, 40))
    pin = pins("smollm2-draft-twin")
    cpu, gpu = TorchReference(root, pin, 1), TorchReference(root, pin, 1, device="cuda")
    facts = gpu.describe()
    assert facts["device"] == "cuda" and facts["device_name"] and facts["tf32"] == {"matmul": False, "cudnn": False}
    what = f"draft twin prefill, cuda ({facts['device_name']}) vs cpu"
    assert_within_thresholds(what, held_figures(what, cpu.forward(ids).logits, gpu.forward(ids).logits),
                             tolerance=gpu.tolerance())
