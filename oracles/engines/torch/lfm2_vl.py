"""The reference's System One capability (:class:`oracles.engines.systems.SystemOneDecisions`) on an
LFM2-VL snapshot: transformers' ``Lfm2VlForConditionalGeneration`` in float32 (the
:class:`~oracles.engines.torch.reference.TorchReference` loaded on the pin), fed by the System One prompt
and read-out of :mod:`oracles.families.d1.system_one` and by its own picture preprocessing
(:func:`preprocess`), never by a processor class nor by a port's code.

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
(the same bits in a process that never imported mlx_vlm: :mod:`oracles.engines.torch.lfm2_vl_fresh`).

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

from oracles.engines.base import Engine
from oracles.engines.systems import DECISIONS
from oracles.families.d1 import system_one as so

#: The model class whose System One path this module writes.
MODEL_CLASS = "Lfm2VlForConditionalGeneration"
#: The vision inputs a decision carries, in the order the model takes them.
VISION_KEYS = ("pixel_values", "pixel_attention_mask", "spatial_shapes")


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


def image_tokens(spatial_shapes: np.ndarray, downsample: int) -> int:
    """The ``<image>`` ids the pictures of ``spatial_shapes`` ``[N, 2]`` (patch rows, columns) become: per
    picture ``ceil(rows / d) * ceil(cols / d)`` (LFM2-VL's pixel unshuffle by ``downsample_factor`` d)."""
    return sum(math.ceil(int(r) / downsample) * math.ceil(int(c) / downsample) for r, c in np.asarray(spatial_shapes))


class _SystemOne:
    """What the System One path reads besides the model: the snapshot's ``tokenizer.json`` through the
    ``tokenizers`` library (no processor, no special tokens added: the prompt writes its BOS itself), the
    BOS text, ``preprocessor_config.json`` and the image token id."""

    def __init__(self, root: Path, model: Any) -> None:
        from tokenizers import Tokenizer

        self.tok = Tokenizer.from_file(str(root / "tokenizer.json"))
        self.bos = str(json.loads((root / "tokenizer_config.json").read_text())["bos_token"])
        self.pre = json.loads((root / "preprocessor_config.json").read_text())
        self.image_token_id = int(model.config.image_token_id)

    def encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False).ids)


def parse_questions(questions: Sequence[dict[str, Any]]) -> list[so.Question]:
    """Published-form questions parsed by :func:`oracles.families.d1.system_one.parse_question` (named by position).

    Raises:
        FixtureError: a malformed question, naming its position and field.
    """
    return [so.parse_question(f"q{i}", dict(q), "decision request") for i, q in enumerate(questions)]


class TorchDecisions(Engine):
    """Mixin of :class:`oracles.engines.torch.reference.TorchReference`: System One on an LFM2-VL pin
    (module docstring). Reads the reference's ``model`` and ``root``; refuses another model class."""

    model: Any
    _so: _SystemOne | None = None

    def _system_one(self) -> _SystemOne:
        """The System One path of this pin, built once.

        Raises:
            Unsupported: the pin is not an LFM2-VL model (the prompt and preprocessing are LFM2-VL's).
        """
        if self._so is None:
            if self.pin_file.model_class != MODEL_CLASS:
                raise self._unsupported(DECISIONS, f"the reference's System One path is written for {MODEL_CLASS} "
                                                   f"(its picture preprocessing); pin {self.pin} is {self.pin_file.model_class}")
            self._so = _SystemOne(self.root, self.model)
        return self._so

    def decision_inputs(self, state: str | dict[str, Any] | None, questions: Sequence[dict[str, Any]],
                        images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]], dict[str, np.ndarray]]:
        """D1Model's layout written from the request form: one question is a single row (prefix + suffix,
        encoded as one text); several share the prefix as the trunk, each suffix a branch; ``<image>``
        markup is expanded per picture (:func:`image_text`) and its pixels are :func:`preprocess`'s."""
        sys1 = self._system_one()
        pixels = [preprocess(im, sys1.pre) for im in images]
        # the template's markup is one <image> per picture at the head of the turn; each is expanded in order
        head = so.prefix(state, sys1.bos, "".join(image_text(px) for px in pixels))
        tails = [so.suffix(sys1.encode, q) for q in parse_questions(questions)]
        vision = {k: np.concatenate([getattr(p, k) for p in pixels]) for k in VISION_KEYS} if pixels else {}
        if len(tails) == 1:
            return sys1.encode(head + tails[0]), [], vision
        return sys1.encode(head), [sys1.encode(t) for t in tails], vision

    def decision_readout_ids(self, question: dict[str, Any]) -> list[list[int]]:
        """System One's read-out groups (:func:`oracles.families.d1.system_one.readout_groups`) in this tokenizer."""
        sys1 = self._system_one()
        return so.readout_groups(sys1.encode, parse_questions([question])[0])

    def decision_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                          vision: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """Log-softmax ``[V]`` float32 at the answer slot: of ``trunk`` alone when there are no branches,
        else of each branch after the trunk's cache (a deep copy per branch, so one branch never sees
        another). ``vision`` may be another processor's (a port's), its rows trimmed to any patch count.

        Raises:
            ValueError: the ids' ``<image>`` count differs from the pictures' image tokens.
        """
        import torch as t

        sys1 = self._system_one()
        vision = vision or {}
        want = image_tokens(vision["spatial_shapes"], int(sys1.pre["downsample_factor"])) if vision else 0
        if list(trunk).count(sys1.image_token_id) != want:
            raise ValueError(f"{list(trunk).count(sys1.image_token_id)} <image> ids for {want} image tokens")
        inputs = {} if not vision else {
            "pixel_values": t.from_numpy(np.asarray(vision["pixel_values"], dtype=np.float32)),
            "pixel_attention_mask": t.from_numpy(np.asarray(vision["pixel_attention_mask"], dtype=np.int32)),
            "spatial_shapes": t.from_numpy(np.asarray(vision["spatial_shapes"], dtype=np.int64))}
        ids = t.tensor([list(trunk)], dtype=t.long)
        with t.no_grad():
            out = self.model(input_ids=ids, use_cache=bool(branches), logits_to_keep=1, **inputs)
            if not branches:
                return [t.log_softmax(out.logits[0, -1].float(), dim=-1).numpy()]
            cache = out.cache if hasattr(out, "cache") else out.past_key_values
            res = []
            for branch in branches:
                b = t.tensor([list(branch)], dtype=t.long)
                step = self.model(input_ids=b, cache=copy.deepcopy(cache), use_cache=True, logits_to_keep=1)
                res.append(t.log_softmax(step.logits[0, -1].float(), dim=-1).numpy())
        return res

    def decision_predict(self, state: str | dict[str, Any] | None, questions: dict[str, dict[str, Any]],
                         images: Sequence[Any] = ()) -> dict[str, Any]:
        """System One's answers (:func:`oracles.families.d1.system_one.answer`) of this engine's read-out
        of its own log-probabilities, on the API path."""
        names, forms = list(questions), list(questions.values())
        trunk, branches, vision = self.decision_inputs(state, forms, images)
        logz = self.decision_logprobs(trunk, branches, vision)
        parsed = parse_questions(forms)
        return {"answers": {n: so.answer(q, so.readout(z, self.decision_readout_ids(f)))
                            for n, q, f, z in zip(names, parsed, forms, logz)}}
