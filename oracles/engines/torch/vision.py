"""The reference's vision path: a transformers vision-language model (``Qwen3_5ForConditionalGeneration``
and its kin) in float32, fed by transformers' own torchvision-free processors, tapped by forward hooks.

:class:`~oracles.engines.torch.reference.TorchReference` is one engine for text and vision pins: it loads the
class the snapshot's config names (:func:`is_vision_config`: a config with a ``vision_config`` loads
through ``AutoModelForImageTextToText``) and hands a VL forward to :class:`VisionPath`.

Pixels. Images go through ``Qwen2VLImageProcessorPil`` (PIL resize, rescale, normalise, patchify; the
snapshot's ``preprocessor_config.json``). transformers' Qwen3-VL video processor needs torchvision, so a
video's frames go through the same image processor frame by frame (its resize to the size transformers'
Qwen3-VL video ``smart_resize`` chooses, then rescale, normalise and patchify with one frame per
temporal patch) and numpy stacks each ``temporal_patch_size`` consecutive frames into one patch row,
``[C, t, p, p]`` per row in the processor's row order (temporal group, merged block, position inside
it), repeating the last frame to fill the last group as the video processors do.

Taps (hooks; nothing in the model is replaced), recorded only while a forward of this path runs:
the rotary embedding's ``position_ids`` argument (the planes the text model received); the vision
tower's merged output (``pooler_output``, the rows scattered over the pads), per call; the first
decoder layer's input (the embeddings with the picture rows scattered in: row 0 of ``layers``); each
MLP down-projection's input absmax. The final-norm output and the layer outputs come from the text
path's own hooks (``TorchReference._captured`` / ``_layer_rows``).

State: ``Qwen3_5Model.rope_deltas`` keeps the last prefill's delta on the model, and a decode step with a
cache adds it to its positions. A cold forward (no cached positions) resets it, so a text request
after a picture request is not served the picture's delta.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol, Sequence

import numpy as np

from oracles.engines.base import Prompt, Unsupported, as_prompt, check_forward_length
from oracles.engines.guards import Guarded
from oracles.engines.vision import MediaRun, VisionSpec, VisionStep, check_pads, mm_token_types, split_rows


class VisionHost(Guarded, Protocol):
    """What the vision path reads and sets of the reference it serves
    (:class:`~oracles.engines.torch.reference.TorchReference`): its snapshot folder, loaded model, facts for the
    guards, and the capture lists its hooks fill (the final norm's outputs; the layers' rows while a
    ``layers=True`` forward runs)."""

    root: Path
    model: Any
    _captured: list[Any]
    _layer_rows: list[Any] | None


#: The vision-language classes this path reads (its processor, tower and rope-delta state are Qwen3.5's).
VISION_CLASSES = ("Qwen3_5ForConditionalGeneration",)


def is_vision_config(root: Path) -> bool:
    """Whether the snapshot at ``root`` is a vision-language model (its config has a ``vision_config``)."""
    config = json.loads((Path(root) / "config.json").read_text())
    return isinstance(config.get("vision_config"), dict)


def model_class(root: Path) -> Any:
    """The transformers auto class a snapshot loads through: ``AutoModelForImageTextToText`` for a VL
    config, else ``AutoModelForCausalLM``."""
    import transformers

    return transformers.AutoModelForImageTextToText if is_vision_config(root) else transformers.AutoModelForCausalLM


def _pil(image: Any) -> Any:
    """A PIL RGB image from a PIL image or a ``uint8`` ``[H, W, 3]`` array."""
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[2] != 3:
        raise ValueError(f"a picture must be a PIL image or a uint8 [H, W, 3] array, got {arr.dtype} {list(arr.shape)}")
    return Image.fromarray(arr)


class VisionPath:
    """The VL forward of a loaded :class:`~oracles.engines.torch.reference.TorchReference` (see the module
    docstring)."""

    def __init__(self, engine: VisionHost) -> None:
        from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

        self.engine = engine
        root = engine.root
        config = json.loads((root / "config.json").read_text())
        video_cfg_path = root / "video_preprocessor_config.json"
        self.video_config = json.loads(video_cfg_path.read_text()) if video_cfg_path.is_file() else {}
        self.spec = VisionSpec.from_config(config, self.video_config)
        self.image_processor = Qwen2VLImageProcessorPil.from_pretrained(root)
        vlm = engine.model.model
        self.vlm, self.text = vlm, vlm.language_model
        self._active = False
        self._positions: list[Any] = []
        self._tower: list[Any] = []
        self._layer0: list[Any] = []
        self._down: list[float] = []
        self.text.rotary_emb.register_forward_pre_hook(self._tap_positions)
        vlm.visual.register_forward_hook(self._tap_tower)
        self.text.layers[0].register_forward_pre_hook(self._tap_layer0)
        for i, layer in enumerate(self.text.layers):
            layer.mlp.down_proj.register_forward_pre_hook(self._down_hook(i))

    # -- hooks --------------------------------------------------------------------------------
    def _tap_positions(self, _m: Any, args: Any) -> None:
        if self._active:
            self._positions.append(args[1].detach().clone())

    def _tap_tower(self, _m: Any, _args: Any, output: Any) -> None:
        if self._active:
            self._tower.append(output.pooler_output.detach().clone())

    def _tap_layer0(self, _m: Any, args: Any) -> None:
        if self._active:
            self._layer0.append(args[0].detach().clone())

    def _down_hook(self, i: int) -> Any:
        def hook(_m: Any, args: Any) -> None:
            if self._active:
                self._down[i] = max(self._down[i], float(args[0].detach().abs().max()))
        return hook

    # -- pixels -------------------------------------------------------------------------------
    def video_rows(self, frames: Sequence[Any]) -> tuple[np.ndarray, list[int]]:
        """One video's pixel rows ``[t * h * w, C * temporal * patch^2]`` float32 and its grid ``[t, h, w]``
        (module docstring).

        Raises:
            ValueError: no frames, or frames of different sizes.
        """
        from PIL import Image
        from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize

        pics = [_pil(f) for f in frames]
        if not pics or len({p.size for p in pics}) != 1:
            raise ValueError(f"a video needs frames of one size, got {[p.size for p in pics]}")
        width, height = pics[0].size
        size = self.video_config.get("size") or {}
        th, tw = smart_resize(len(pics), height, width, temporal_factor=self.spec.temporal,
                              factor=self.spec.patch * self.spec.merge,
                              min_pixels=size.get("shortest_edge", 128 * 32 * 32),
                              max_pixels=size.get("longest_edge", 32 * 32 * 768))
        if (th, tw) != (height, width):
            pics = [p.resize((tw, th), Image.Resampling.BICUBIC) for p in pics]
        pics += [pics[-1]] * (-len(pics) % self.spec.temporal)
        out = self.image_processor.preprocess(pics, do_resize=False, temporal_patch_size=1, return_tensors="np")
        rows = np.asarray(out["pixel_values"], dtype=np.float32)
        per_frame = rows.shape[0] // len(pics)
        t = len(pics) // self.spec.temporal
        # [F, N, C, p, p] -> [t, temporal, N, C, p, p] -> [t, N, C, temporal, p, p]
        x = rows.reshape(t, self.spec.temporal, per_frame, 3, self.spec.patch, self.spec.patch)
        x = x.transpose(0, 2, 3, 1, 4, 5).reshape(t * per_frame, -1)
        gh, gw = th // self.spec.patch, tw // self.spec.patch
        return np.ascontiguousarray(x), [t, gh, gw]

    def inputs(self, prompt: Prompt) -> dict[str, Any]:
        """The model's keyword inputs for ``prompt`` (ids, token types, pixels, grids), batch of one.

        Raises:
            ValueError: the pads do not match the processor's grids (:func:`check_pads`).
        """
        import torch

        out: dict[str, Any] = {"input_ids": torch.tensor([list(prompt.ids)], dtype=torch.long),
                               "mm_token_type_ids": torch.from_numpy(mm_token_types(prompt.ids, self.spec))[None]}
        image_grids: list[list[int]] = []
        video_grids: list[list[int]] = []
        if prompt.images:
            feats = self.image_processor([_pil(im) for im in prompt.images], return_tensors="np")
            out["pixel_values"] = torch.from_numpy(np.asarray(feats["pixel_values"], dtype=np.float32))
            image_grids = [[int(v) for v in g] for g in feats["image_grid_thw"]]
            out["image_grid_thw"] = torch.tensor(image_grids, dtype=torch.long)
        if prompt.videos:
            runs = [self.video_rows(v) for v in prompt.videos]
            video_grids = [grid for _, grid in runs]
            out["pixel_values_videos"] = torch.from_numpy(np.concatenate([rows for rows, _ in runs]))
            out["video_grid_thw"] = torch.tensor(video_grids, dtype=torch.long)
        check_pads(prompt.ids, self.spec, image_grids, video_grids, "torch")
        return out

    # -- forward ------------------------------------------------------------------------------
    def forward(self, prompt: Prompt | Sequence[int], cache: Any = None, keep: int = 0, layers: bool = False) -> VisionStep:
        """:meth:`Engine.forward` for a VL model (contract there), returning a :class:`VisionStep`.

        Raises:
            Unsupported: pictures after a cached prefix (the libraries place M-RoPE for a whole prompt).
            ValueError: see :func:`check_forward_length` and :meth:`inputs`.
        """
        import torch

        from oracles.engines.torch.device import to_f4

        p = as_prompt(prompt)
        eng = self.engine
        cached = eng.cache_length(cache)
        check_forward_length(eng, cached, len(p.ids))
        if cached and p.has_media:
            raise Unsupported(eng.id, "add pictures after a cached prefix", "M-RoPE is placed for a whole prompt")
        inputs = self.inputs(p)
        if not cached:
            self.vlm.rope_deltas = None  # the library keeps the last prefill's delta (module docstring)
        eng._captured.clear()
        eng._layer_rows = [] if layers else None
        self._positions, self._tower, self._layer0 = [], [], []
        self._down = [0.0] * len(self.text.layers)
        self._active = True
        try:
            with torch.inference_mode():
                out = eng.model(**inputs, cache=cache, use_cache=cache is not None, logits_to_keep=keep)
            hidden = eng._captured[-1][0]
            stream = None
            if layers:
                rows = [self._layer0[-1], *(eng._layer_rows or [])[1:]]
                stream = np.stack([to_f4(t[0]) for t in rows])
            positions = self._positions[-1][:, 0].numpy().astype(np.int64)
            media = self._media(inputs, [to_f4(t) for t in self._tower])
        finally:
            self._active = False
            eng._captured.clear()
            eng._layer_rows = None
        if keep:
            hidden, positions = hidden[-keep:], positions[:, -keep:]
            stream = stream[:, -keep:] if stream is not None else None
        return VisionStep(logits=to_f4(out.logits[0]), hidden=to_f4(hidden), layers=stream, positions=positions,
                          media=tuple(media), down_in_absmax=np.asarray(self._down, dtype=np.float32))

    def _media(self, inputs: dict[str, Any], tower: list[np.ndarray]) -> list[MediaRun]:
        """One :class:`MediaRun` per picture: tower calls come images first, then videos."""
        out: list[MediaRun] = []
        calls = iter(tower)
        for kind, grid_key, pixel_key in (("image", "image_grid_thw", "pixel_values"),
                                          ("video", "video_grid_thw", "pixel_values_videos")):
            if grid_key not in inputs:
                continue
            grids = [(int(t), int(h), int(w)) for t, h, w in inputs[grid_key].tolist()]
            pixels = inputs[pixel_key].numpy()
            rows = split_rows(next(calls), grids, self.spec)
            patch_rows = np.split(pixels, np.cumsum([t * h * w for t, h, w in grids])[:-1])
            out += [MediaRun(kind, g, r, np.asarray(px, dtype=np.float32)) for g, r, px in zip(grids, rows, patch_rows)]
        return out

    def plain_logits(self, prompt: Prompt | Sequence[int]) -> np.ndarray:
        """``[T, V]`` float32 logits of a plain ``model(**inputs)`` call on a cold prompt, no capture."""
        import torch

        from oracles.engines.torch.device import to_f4

        p = as_prompt(prompt)
        inputs = self.inputs(p)
        self.vlm.rope_deltas = None
        try:
            with torch.inference_mode():
                out = self.engine.model(**inputs)
        finally:
            self.engine._captured.clear()
        return to_f4(out.logits[0])


__all__ = ["VISION_CLASSES", "VisionPath", "is_vision_config", "model_class"]
