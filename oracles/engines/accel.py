"""Which accelerator answers here, probed without importing torch or mlx on Linux."""

from __future__ import annotations

import glob
import platform
import shutil
import subprocess


def probe_cuda() -> str | None:
    """None when an NVIDIA GPU answers (``/dev/nvidia[0-9]*`` and ``nvidia-smi -L`` listing a GPU),
    else what was probed and found."""
    devices = glob.glob("/dev/nvidia[0-9]*")
    smi = shutil.which("nvidia-smi")
    if not (devices and smi):
        return f"CUDA: {len(devices)} /dev/nvidia* devices, nvidia-smi {'found' if smi else 'not found'}"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"nvidia-smi -L failed: {exc}"
    if out.returncode == 0 and "GPU" in out.stdout:
        return None
    return f"nvidia-smi -L exit {out.returncode}"


def probe_accelerator() -> str | None:
    """Return None when an accelerator answers, else a reason naming everything that was probed.

    Probes: CUDA (:func:`probe_cuda`) and, on macOS arm64, Metal through ``mlx.core.metal.is_available()``.
    """
    probed = []
    cuda = probe_cuda()
    if cuda is None:
        return None
    probed.append(cuda)
    if platform.system() == "Darwin" and platform.machine() == "arm64":
        try:
            import mlx.core as mx

            if mx.metal.is_available():
                return None
            probed.append("Metal: mlx.core.metal.is_available() is False")
        except ImportError as exc:
            probed.append(f"Metal: mlx not importable ({exc})")
    else:
        probed.append(f"Metal: not on macOS arm64 ({platform.system()} {platform.machine()})")
    return "; ".join(probed)
