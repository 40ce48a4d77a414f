"""``python -m oracles.engines.torch.lfm2_vl_fresh PIN ROOT RECORD_ID OUT.npz THREADS``: the reference's System One
path (:mod:`oracles.engines.torch.lfm2_vl`) on one record in a process of its own, which never imports mlx_vlm:
what the suite's unpatched-processor proof compares the in-process answers to, bit for bit.

torch and transformers are imported when the reference is built.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.engines.torch.reference import TorchReference
from oracles.families.d1 import system_one as so
from oracles.families.d1 import system_one_run as sr
from oracles.pins.pin import load_pin


def main(argv: Sequence[str]) -> int:
    """``python -m oracles.engines.torch.lfm2_vl_fresh PIN ROOT RECORD_ID OUT.npz THREADS``: the reference
    (:class:`~oracles.engines.torch.reference.TorchReference` on pin ``PIN``, its verified snapshot at
    ``ROOT``) on one System One record's API path in a fresh process (the suite's unpatched-processor
    proof): ``trunk``, the pictures' ``pixel_values`` and each question's ``logz``; exits 3 if mlx_vlm got
    imported."""
    pin, root, rid, out = load_pin(argv[0]), Path(argv[1]), argv[2], Path(argv[3])
    req = next(r for r in so.load_requests() if r.id == rid)
    ref = TorchReference(root, pin, int(argv[4]))
    trunk, branches, vision = ref.decision_inputs(req.state, [q.as_request() for q in req.questions], sr.pictures(req))
    logz = ref.decision_logprobs(trunk, branches, vision)
    arrays: dict[str, Any] = {"trunk": np.array(trunk), "pixel_values": vision["pixel_values"],
                              **{f"logz{i}": z for i, z in enumerate(logz)}}
    np.savez(out, **arrays)
    return 3 if "mlx_vlm" in sys.modules else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
