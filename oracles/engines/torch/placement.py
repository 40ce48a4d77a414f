"""Where the reference's weights live when they do not fit one device: accelerate's ``device_map``.

Two placements, each a ``from_pretrained`` argument set of transformers' big-model loading (the
"Big Model Inference" guide of accelerate):

- **offload** (``--reference-max-memory SIZE``): ``device_map="auto"`` with ``max_memory={"cpu": SIZE}``.
  accelerate keeps the modules that fit the budget in memory and leaves the rest on disk as meta
  tensors; an ``AlignDevicesHook`` on each offloaded module reads its weights before it runs and drops
  them after. Weights that sit unchanged in the snapshot's safetensors are read from that file in
  place (transformers' ``accelerate_disk_offload``); the offload folder receives only weights the load
  converts, and is removed when the model is collected or the process ends.
- **spread** (``--reference-device-map auto`` with ``--reference-device cuda``): ``device_map="auto"``
  over every visible GPU (then the CPU and disk, as accelerate decides, if they do not hold it all).

The same float32 kernels run on the same weights either way; only where a weight waits between
layers changes, so the outputs are the in-memory reference's bit for bit (tests/unit/test_offload.py
proves it on SmolLM2 with a budget below its size).

torch, transformers and accelerate are imported inside the functions, never at module import.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: ``SIZE`` of ``--reference-max-memory``: a number and a unit, as accelerate's
#: ``convert_file_size_to_int`` reads them (decimal KB/MB/GB/TB, binary KiB/MiB/GiB/TiB; no unit: bytes).
SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(B|KB|MB|GB|TB|KIB|MIB|GIB|TIB)?\s*", re.IGNORECASE)
UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
         "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}
#: The values of ``--reference-device-map``: accelerate's own name for "place it over what is here".
DEVICE_MAPS = ("auto",)


def parse_size(text: str) -> int:
    """``"500MB"`` -> 500,000,000; ``"2GiB"`` -> 2,147,483,648; ``"1000"`` -> 1,000 (bytes, int).

    Raises:
        ValueError: not a positive number with one of :data:`UNITS` (the units named).
    """
    match = SIZE.fullmatch(text)
    value = int(float(match.group(1)) * UNITS[(match.group(2) or "B").upper()]) if match else 0
    if value <= 0:
        raise ValueError(f"{text!r}: expected a positive size such as 500MB or 2GiB (units B, KB, MB, GB, TB, "
                         "KiB, MiB, GiB, TiB)")
    return value


@dataclass(frozen=True)
class Placement:
    """How the reference places its weights: ``max_memory`` bytes of them in CPU memory and the rest on
    disk (offload), or ``device_map="auto"`` over the GPUs (spread); neither: one device, in memory.

    Raises:
        ValueError: both given, or a ``device_map`` other than :data:`DEVICE_MAPS`.
    """

    max_memory: int | None = None
    device_map: str | None = None

    def __post_init__(self) -> None:
        if self.max_memory is not None and self.device_map is not None:
            raise ValueError("a placement is an offload (max_memory) or a spread (device_map), not both")
        if self.device_map is not None and self.device_map not in DEVICE_MAPS:
            raise ValueError(f"device_map {self.device_map!r}: expected one of {', '.join(DEVICE_MAPS)}")

    @property
    def placed(self) -> bool:
        """Whether accelerate places the weights (False: ``from_pretrained(device_map=device)``)."""
        return self.max_memory is not None or self.device_map is not None

    def from_pretrained_kwargs(self, device: str, offload_folder: Path | None) -> dict[str, Any]:
        """The placement arguments of ``from_pretrained``: ``device_map`` (and ``max_memory``,
        ``offload_folder`` when accelerate places the weights)."""
        folder = {} if offload_folder is None else {"offload_folder": str(offload_folder)}
        if self.max_memory is not None:  # only the devices max_memory names are used: the CPU and disk
            return {"device_map": "auto", "max_memory": {"cpu": self.max_memory}, **folder}
        if self.device_map is not None:
            return {"device_map": self.device_map, **folder}
        return {"device_map": device}


def load_placed(model_class: Any, root: Path, dtype: Any, device: str, placement: Placement) -> Any:
    """``model_class.from_pretrained(root, dtype=dtype, ...)`` placed by ``placement``, in eval mode.

    An offload folder, when accelerate may need one, is made under ``$ORACLES_HOME/offload`` (a disk
    folder: a system temp folder may be memory, which would defeat the offload) and removed when the
    model is collected or the interpreter exits.

    A budget that holds every module places nothing on disk: not an error (the weights fit), and
    :func:`placement_facts` records where each module went.

    Raises:
        whatever transformers and accelerate raise on a snapshot they cannot load or place (the
        folder made for it is removed first).
    """
    if not placement.placed:
        return model_class.from_pretrained(root, dtype=dtype, device_map=device).eval()
    from oracles.pins.pin import oracles_home

    base = oracles_home() / "offload"
    base.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"{root.name}-", dir=base))
    try:
        model = model_class.from_pretrained(root, dtype=dtype, **placement.from_pretrained_kwargs(device, folder)).eval()
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    weakref.finalize(model, shutil.rmtree, folder, True)
    return model


def placement_facts(model: Any, placement: Placement) -> dict[str, Any]:
    """What the receipt records of a placed model: the budget, and how many top-level modules of
    accelerate's map went to each device (``{"cpu": 7, "disk": 27}``); ``{}`` for an unplaced model."""
    if not placement.placed:
        return {}
    where = Counter(str(d) for d in (getattr(model, "hf_device_map", None) or {}).values())
    facts: dict[str, Any] = {"device_map": placement.device_map or "auto", "placed_modules": dict(sorted(where.items()))}
    if placement.max_memory is not None:
        facts["max_memory_bytes"] = placement.max_memory
    return facts


def offloaded_bytes(model: Any) -> int:
    """Bytes of the model's parameters that are not in memory (meta tensors accelerate reads from disk
    when their module runs); 0 for a model held whole. A tied weight counts once: offloaded, the head and
    the embedding are two meta tensors of one stored weight (``all_tied_weights_keys``: target -> source)."""
    tied = set(getattr(model, "all_tied_weights_keys", None) or {})
    return sum(p.numel() * p.element_size() for name, p in model.named_parameters(remove_duplicate=False)
               if p.device.type == "meta" and name not in tied)
