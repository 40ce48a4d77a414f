"""The d1 reference on an LFM2-VL snapshot: transformers' ``Lfm2VlForConditionalGeneration`` in float32
on the CPU, fed by the System One prompt of :mod:`oracles.families.d1.system_one` and by its own
picture preprocessing (:func:`preprocess`), never by a processor class.

Why its own preprocessing: transformers 5.24's ``Lfm2VlImageProcessor`` is a torchvision backend, and
PyPI's Linux torchvision wheel is CUDA-linked (with the CPU torch it fails on import: ``operator
torchvision::nms does not exist``). :func:`preprocess` is that processor's published algorithm
(``transformers/models/lfm2_vl/image_processing_lfm2_vl.py``) written here in torch ops: LFM2-VL's
smart resize (both sides multiples of patch x downsample, the pixel count within
``min_image_tokens..max_image_tokens`` image tokens), the resize as torchvision's tensor path computes it
(``torch.nn.functional.interpolate`` with ``antialias=True`` on the float image, then rounded and clamped
back to 8 bits, for bilinear and bicubic), rescale and normalise, 16 x 16 patches flattened
``(patch_row, patch_col, channel)``, padded to ``max_num_patches`` with a mask; and the text expansion of
``Lfm2VlProcessor`` (``<|image_start|>`` + one ``<image>`` per image token + ``<|image_end|>``). An image
large enough to be split into tiles is refused (the records' pictures are single views; the tiling
path is not written here).

So importing mlx_vlm, which replaces ``Lfm2VlProcessor.__init__``/``__call__``/``from_pretrained`` and
its kwargs defaults, cannot reach the reference: it names no processor class. A suite test proves it
(the same bits in a process that never imported mlx_vlm).

torch and transformers are imported when the reference is built.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from oracles.families.d1 import system_one as so


@dataclass
class Pixels:
    """One picture's model inputs: ``pixel_values`` ``[1, P, patch*patch*3]`` float32,
    ``pixel_attention_mask`` ``[1, P]`` int32 (1 = a real patch), ``spatial_shapes`` ``[1, 2]`` int64
    (patch rows, cols), ``size`` the resized (height, width), ``tokens`` the image tokens it becomes."""

    pixel_values: np.ndarray
    pixel_attention_mask: np.ndarray
    spatial_shapes: np.ndarray
    size: tuple[int, int]
    tokens: int


def smart_size(height: int, width: int, cfg: dict[str, Any]) -> tuple[int, int]:
    """LFM2-VL's resized (height, width): each a multiple of ``encoder_patch_size * downsample_factor``,
    nearest the original, scaled down (floor) past ``max_image_tokens`` or up (ceil) below ``min_image_tokens``."""
    f = int(cfg["encoder_patch_size"]) * int(cfg["downsample_factor"])
    lo, hi = int(cfg["min_image_tokens"]) * f * f, int(cfg["max_image_tokens"]) * f * f
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > hi:
        beta = math.sqrt(height * width / hi)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < lo:
        beta = math.sqrt(lo / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    return h, w


def needs_tiles(height: int, width: int, cfg: dict[str, Any]) -> bool:
    """LFM2-VL's test for splitting a picture into tiles (its pixels past ``max_pixels_tolerance`` times the budget)."""
    p, d = int(cfg["encoder_patch_size"]), int(cfg["downsample_factor"])
    h, w = max(p, round(height / (p * d)) * p * d), max(p, round(width / (p * d)) * p * d)
    budget = int(cfg["max_image_tokens"]) * p * p * d * d * float(cfg["max_pixels_tolerance"])
    return bool(cfg["do_image_splitting"]) and h * w > budget


def preprocess(image: Any, cfg: dict[str, Any]) -> Pixels:
    """The reference's pixels for one PIL picture under ``preprocessor_config.json`` ``cfg`` (module docstring).

    Raises:
        NotImplementedError: the picture would be split into tiles.
        ValueError: a ``resample`` other than bilinear (2) or bicubic (3).
    """
    import torch

    rgb = np.asarray(image.convert("RGB"), dtype=np.uint8)
    height, width = rgb.shape[:2]
    if needs_tiles(height, width, cfg):
        raise NotImplementedError(f"a {width} x {height} picture is split into tiles; the reference's LFM2-VL "
                                  "preprocessing writes the single-view path only")
    mode = {2: "bilinear", 3: "bicubic"}.get(int(cfg["resample"]))
    if mode is None:
        raise ValueError(f"resample {cfg['resample']!r}: the reference resizes bilinear (2) or bicubic (3)")
    h, w = smart_size(height, width, cfg)
    x = torch.from_numpy(rgb.copy()).permute(2, 0, 1)[None].to(torch.float32)
    x = torch.nn.functional.interpolate(x, size=(h, w), mode=mode, align_corners=False, antialias=True)
    x = x.clamp(0, 255).round().to(torch.uint8).to(torch.float32)  # torchvision's uint8 round trip
    mean = torch.tensor(cfg["image_mean"], dtype=torch.float32).view(1, 3, 1, 1)
    std = torch.tensor(cfg["image_std"], dtype=torch.float32).view(1, 3, 1, 1)
    x = (x * float(cfg["rescale_factor"]) - mean) / std
    p = int(cfg["encoder_patch_size"])
    rows, cols = h // p, w // p
    patches = x.reshape(1, 3, rows, p, cols, p).permute(0, 2, 4, 3, 5, 1).reshape(1, rows * cols, p * p * 3)
    d = int(cfg["downsample_factor"])
    budget = max(int(cfg["max_image_tokens"]) * d * d, (int(cfg["tile_size"]) // p) ** 2 if cfg["do_image_splitting"] else 0)
    values = np.zeros((1, budget, p * p * 3), dtype=np.float32)
    values[0, : rows * cols] = patches[0].numpy()
    mask = np.zeros((1, budget), dtype=np.int32)
    mask[0, : rows * cols] = 1
    tokens = math.ceil(rows / d) * math.ceil(cols / d)
    return Pixels(values, mask, np.array([[rows, cols]], dtype=np.int64), (h, w), tokens)


def image_text(px: Pixels) -> str:
    """What ``Lfm2VlProcessor`` writes for one ``<image>`` of a single-view picture."""
    return "<|image_start|>" + "<image>" * px.tokens + "<|image_end|>"


def foreign_pixels(vision: dict[str, np.ndarray], own: Sequence[Pixels]) -> list[Pixels]:
    """Another processor's vision inputs (``pixel_values`` ``[N, P, 768]``, ``pixel_attention_mask``
    ``[N, P]``, ``spatial_shapes`` ``[N, 2]``: one row per single-view picture) as :class:`Pixels`, with the
    image-token counts of the reference's own ``own`` (so the reference can be fed a port's pixels).

    Raises:
        ValueError: the row count or a patch grid differs from ``own``'s.
    """
    values, mask, shapes = (np.asarray(vision[k]) for k in ("pixel_values", "pixel_attention_mask", "spatial_shapes"))
    if len(values) != len(own):
        raise ValueError(f"{len(values)} vision rows for {len(own)} pictures")
    out = []
    for i, px in enumerate(own):
        if [int(x) for x in shapes[i]] != [int(x) for x in px.spatial_shapes[0]]:
            raise ValueError(f"picture {i}: patch grid {shapes[i].tolist()} vs the reference's {px.spatial_shapes[0].tolist()}")
        out.append(Pixels(values[i:i + 1].astype(np.float32), mask[i:i + 1].astype(np.int32),
                          shapes[i:i + 1].astype(np.int64), px.size, px.tokens))
    return out


class Lfm2VlD1Reference:
    """The reference for System One requests on an LFM2-VL snapshot at ``root`` (module docstring).

    ``tokenizer`` is the snapshot's ``tokenizer.json`` through the ``tokenizers`` library (no processor,
    no special tokens added: the prompt writes its BOS itself).
    """

    id = "torch"

    def __init__(self, root: Path, threads: int = 0) -> None:
        import torch
        from tokenizers import Tokenizer
        from transformers import Lfm2VlForConditionalGeneration

        self.torch, self.root = torch, Path(root)
        if threads:
            torch.set_num_threads(threads)
        self.tok = Tokenizer.from_file(str(self.root / "tokenizer.json"))
        self.bos = str(json.loads((self.root / "tokenizer_config.json").read_text())["bos_token"])
        self.pre = json.loads((self.root / "preprocessor_config.json").read_text())
        self.model = Lfm2VlForConditionalGeneration.from_pretrained(self.root, dtype=torch.float32).eval()
        self.image_token_id = int(self.model.config.image_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)

    def decision_inputs(self, request: so.Request, images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]],
                                                                                          list[Pixels]]:
        """``(trunk, branches, pixels)`` of a request, as D1Model lays them out: one question is a single
        row (prefix + suffix, encoded as one text, no branches); several share the prefix as the trunk,
        each suffix a branch. ``<image>`` markup is expanded per picture (:func:`image_text`)."""
        pixels = [preprocess(im, self.pre) for im in images]
        # the template's markup is one <image> per picture at the head of the turn; each is expanded in order
        head = so.prefix(request.state, self.bos, "".join(image_text(px) for px in pixels))
        tails = [so.suffix(self.encode, q) for q in request.questions]
        if len(tails) == 1:
            return self.encode(head + tails[0]), [], pixels
        return self.encode(head), [self.encode(t) for t in tails], pixels

    def _vision(self, pixels: Sequence[Pixels]) -> dict[str, Any]:
        t = self.torch
        if not pixels:
            return {}
        return {"pixel_values": t.from_numpy(np.concatenate([p.pixel_values for p in pixels])),
                "pixel_attention_mask": t.from_numpy(np.concatenate([p.pixel_attention_mask for p in pixels])),
                "spatial_shapes": t.from_numpy(np.concatenate([p.spatial_shapes for p in pixels]))}

    def answer_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                        pixels: Sequence[Pixels] = ()) -> list[np.ndarray]:
        """Log-softmax ``[V]`` float32 at the answer slot: of ``trunk`` alone when there are no branches,
        else of each branch after the trunk's cache (a deep copy per branch, so one branch never sees
        another).

        Raises:
            ValueError: the ids' ``<image>`` count differs from the pictures' image tokens.
        """
        t = self.torch
        want = sum(p.tokens for p in pixels)
        if list(trunk).count(self.image_token_id) != want:
            raise ValueError(f"{list(trunk).count(self.image_token_id)} <image> ids for {want} image tokens")
        ids = t.tensor([list(trunk)], dtype=t.long)
        with t.no_grad():
            out = self.model(input_ids=ids, use_cache=bool(branches), logits_to_keep=1, **self._vision(pixels))
            if not branches:
                return [t.log_softmax(out.logits[0, -1].float(), dim=-1).numpy()]
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            res = []
            for branch in branches:
                b = t.tensor([list(branch)], dtype=t.long)
                step = self.model(input_ids=b, cache=copy.deepcopy(cache), use_cache=True, logits_to_keep=1)
                res.append(t.log_softmax(step.logits[0, -1].float(), dim=-1).numpy())
        return res

    def describe(self) -> dict[str, Any]:
        import transformers

        return {"engine": self.id, "class": f"{type(self).__module__}.{type(self).__qualname__}",
                "model_class": type(self.model).__name__, "dtype": "float32", "device": "cpu",
                "torch": str(self.torch.__version__), "transformers": str(transformers.__version__),
                "preprocessing": "oracles.engines.torch.lfm2_vl.preprocess (torch ops; no torchvision)"}


def main(argv: Sequence[str]) -> int:
    """``python -m oracles.engines.torch.lfm2_vl ROOT RECORD_ID OUT.npz THREADS``: the reference's API path of
    one System One record in a fresh process (the suite's unpatched-processor proof): ``trunk``, the
    pictures' ``pixel_values`` and each question's ``logz``; exits 3 if mlx_vlm got imported."""
    import sys

    root, rid, out = Path(argv[0]), argv[1], Path(argv[2])
    from oracles.families.d1 import system_one_run as sr

    req = next(r for r in so.load_requests() if r.id == rid)
    ref = Lfm2VlD1Reference(root, int(argv[3]))
    trunk, branches, pixels = ref.decision_inputs(req, sr.pictures(req))
    logz = ref.answer_logprobs(trunk, branches, pixels)
    arrays: dict[str, Any] = {"trunk": np.array(trunk), "pixel_values": np.concatenate([p.pixel_values for p in pixels]),
                              **{f"logz{i}": z for i, z in enumerate(logz)}}
    np.savez(out, **arrays)
    return 3 if "mlx_vlm" in sys.modules else 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
