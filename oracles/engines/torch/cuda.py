"""The torch reference on an accelerator: the same transformers code, float32, on CUDA (TF32 off) or MPS.

Two uses: ``--reference-device cuda|mps`` runs the reference itself there (the ``torch`` engine built
with ``device=``), and the ``torch-cuda`` engine is that same code registered as a port, so a GPU
machine's numbers are held against the CPU reference record by record like any port.

On CUDA, float32 matmuls and convolutions may run as TF32 (10-bit mantissa) unless told not to; the
reference turns both off (``torch.backends.cuda.matmul.allow_tf32`` and
``torch.backends.cudnn.allow_tf32``, PyTorch's "TensorFloat-32 (TF32) on Ampere (and later) devices"
notes) and records the switches and the device name in :meth:`describe`.

Whether a device can answer is probed without importing torch where that is possible: torch's build
(``torch/version.py`` is read as text: its ``cuda`` line is ``None`` in a CPU-only wheel), the NVIDIA
device nodes and ``nvidia-smi -L`` (:func:`oracles.engines.accel.probe_cuda`), and for MPS the
platform (macOS on arm64).
"""

from __future__ import annotations

from oracles.engines.torch.device import probe_device
from oracles.engines.torch.reference import TorchReference


class TorchCuda(TorchReference):
    """The torch reference's own code on CUDA, as a port (engine id ``torch-cuda``)."""

    id = "torch-cuda"
    device = "cuda"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return super().unavailable_reason() or probe_device("cuda")
