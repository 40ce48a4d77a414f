"""Where the torch reference runs: probing a device without importing torch (the CUDA build from
``torch/version.py``, the GPU through :mod:`oracles.engines.accel`), float32 switches on CUDA (TF32 off
for matmul and cuDNN), and the one tensor-to-numpy conversion every torch engine uses."""

from __future__ import annotations

import importlib.util
import platform
import re
from pathlib import Path
from typing import Any

import numpy as np


def torch_build_cuda() -> str | None:
    """The CUDA version torch was built with, read from ``torch/version.py`` without importing torch;
    None for a CPU-only build or when torch is not installed."""
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        return None
    version = Path(list(spec.submodule_search_locations)[0]) / "version.py"
    try:
        text = version.read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^cuda(?:\s*:\s*[^=]+)?\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


def probe_device(device: str) -> str | None:
    """None when ``device`` can run the torch reference here, else a reason naming what was probed."""
    if device == "cpu":
        return None
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    if device == "cuda":
        build = torch_build_cuda()
        if build is None:
            return "torch here is a CPU-only build (torch/version.py: cuda = None)"
        from oracles.engines.accel import probe_cuda

        why = probe_cuda()
        return None if why is None else f"torch built with CUDA {build}, but no GPU answered ({why})"
    if device == "mps":
        if (platform.system(), platform.machine()) != ("Darwin", "arm64"):
            return f"MPS needs macOS on arm64; this is {platform.system()} {platform.machine()}"
        return None
    return f"unknown device {device!r}: expected cpu, cuda or mps"


def strict_float32(device: str) -> dict[str, Any]:
    """Turn TF32 off for CUDA matmuls and cuDNN (module docstring); the switches and device name, for
    :meth:`~oracles.engines.base.Engine.describe`. Imports torch."""
    import torch

    if device != "cuda":
        return {}
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    return {"device_name": torch.cuda.get_device_name(0), "cuda": torch.version.cuda,
            "tf32": {"matmul": torch.backends.cuda.matmul.allow_tf32, "cudnn": torch.backends.cudnn.allow_tf32}}


def to_f4(t: Any) -> np.ndarray:
    """A torch tensor as a float32 numpy array on the CPU (a copy)."""
    return t.detach().float().cpu().numpy().astype("<f4", copy=True)
