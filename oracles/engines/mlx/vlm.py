"""The MLX vision-language port: mlx-vlm's own model and processor code, float32, on MLX's default device.

Loads the verified snapshot with ``mlx_vlm.utils.load`` (model and its torch-free Qwen3-VL processor:
numpy + PIL image and video processors that read ``preprocessor_config.json`` and
``video_preprocessor_config.json``). A forward runs as mlx-vlm's own ``generate_step`` prefill does:
``Model.get_input_embeddings`` (vision tower, scatter over the pads, ``get_rope_index``), then
``language_model(ids, inputs_embeds=..., cache=..., position_ids=..., rope_deltas=...)``; a step on a
warm cache is ``language_model(ids, cache=...)``, whose positions mlx-vlm derives from its stored
rope delta.

Gotchas of mlx-vlm 0.7.10 the adapter handles (measured on the Qwen3.5 twin):

* full attention sits where ``(layer + 1) % full_attention_interval == 0`` (default 4); the config's
  ``layer_types`` is not read. A pin whose ``layer_types`` differ from that rule is refused by
  :meth:`MlxVlmPort.unsupported_config` (a skip naming it) instead of loading a different model.
* ``rope_parameters`` must hold ``mrope_section`` (and ``partial_rotary_factor``); without them its
  ``TextConfig`` raises. Refused by :meth:`MlxVlmPort.unsupported_config` with that reason.
* ``LanguageModel`` keeps ``_position_ids`` / ``_rope_deltas`` between calls, and a call without
  explicit positions on a fresh cache reuses a stored ``_position_ids`` that is long enough: a second
  request would be served the first one's planes. Both are reset before every cold forward, as
  mlx-vlm's own ``generate_step`` does before a speculative run.
* images and video in one prompt: ``get_input_embeddings`` of its Qwen3.5 model reads
  ``pixel_values`` or ``pixel_values_videos``, not both; refused (:class:`Unsupported`).

Taps (MLX has no hooks): for the one call, each decoder layer in the model's layer list is wrapped
(:class:`_Tap`, the mlx port's ``_LayerTap`` manner) to keep its input, output and ``position_ids``
argument, and the vision tower is shadowed on the model instance to keep its output; the list and
the attribute are restored afterwards, so the model is unchanged between calls. A ``[B, T]``
position array is what mlx-vlm's rotary reads as the same position on all three planes
(``rope_utils.compute_mrope_frequencies``), so it is reported as three equal planes.

mlx and mlx-vlm are imported when the engine is built, so the registry can import this file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Prompt, as_prompt, check_forward_length, hub_offline
from oracles.engines.mlx import mlx_vlm_unavailable
from oracles.engines.vision import MediaRun, VisionSpec, VisionStep, check_pads, split_rows

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

#: The rope_parameters keys mlx-vlm's Qwen3.5 ``TextConfig`` requires.
MLX_VLM_ROPE_KEYS = ("mrope_section", "rope_theta", "partial_rotary_factor")
#: mlx-vlm's default ``full_attention_interval`` (``mlx_vlm/models/qwen3_5/config.py``).
DEFAULT_INTERVAL = 4


class _Tap:
    """Stands in for one callable during a tapped forward: calls it, keeps ``(args, kwargs, output)``;
    every other attribute is the original's."""

    def __init__(self, inner: Any, sink: list[tuple[Any, dict[str, Any], Any]]) -> None:
        self._inner, self._sink = inner, sink

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        out = self._inner(*args, **kwargs)
        self._sink.append((args, kwargs, out))
        return out

    def __getattr__(self, attr: str) -> Any:
        return getattr(self._inner, attr)


class MlxVlmPort(Engine):
    """mlx-vlm model and processor from a verified VL snapshot, float32 (module docstring).

    Raises:
        Unsupported: the snapshot's config is not one mlx-vlm reads as transformers does (:meth:`unsupported_config`).
        TypeError: a loaded parameter is not float32.
    """

    id = "mlx-vlm"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return mlx_vlm_unavailable()

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        """Why mlx-vlm cannot port ``pin`` (judged from the pin file: a text-only model; and from its pinned
        config.json where materialised: :meth:`unsupported_config`), or None."""
        from oracles.engines.guards import pinned_config

        if pin.modality != "vision":
            return f"mlx-vlm ports vision-language models; pin {pin.name} is {pin.model_class} (its port is mlx)"
        config = pinned_config(pin)
        return None if config is None else cls.unsupported_config(config)

    @staticmethod
    def unsupported_config(config: dict[str, Any]) -> str | None:
        """Why mlx-vlm would not read this ``config.json`` as transformers does, or None (module docstring)."""
        text = config.get("text_config")
        if not isinstance(config.get("vision_config"), dict) or not isinstance(text, dict):
            return "its config has no vision_config and text_config"
        params = text.get("rope_parameters") or {}
        missing = [k for k in MLX_VLM_ROPE_KEYS if k not in params]
        if missing:
            return f"mlx-vlm's Qwen3.5 TextConfig requires rope_parameters {missing} (not in this config)"
        interval = int(text.get("full_attention_interval", DEFAULT_INTERVAL))
        rule = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(int(text["num_hidden_layers"]))]
        if text.get("layer_types") not in (None, rule):
            return (f"mlx-vlm places full attention every {interval} layers and ignores layer_types; this config's "
                    f"layer_types {text['layer_types']} differ from that rule")
        return None

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        hub_offline()
        config = json.loads((self.root / "config.json").read_text())
        reason = self.unsupported_config(config)
        if reason:
            raise self._unsupported(f"load pin {self.pin}", reason)
        import mlx.core as mx
        import mlx_vlm
        from mlx_vlm.utils import load

        from oracles.engines.mlx.cohort import flat_parameters

        self.mx = mx
        self.model, self.processor = load(str(self.root))
        dtypes = {str(v.dtype) for _, v in flat_parameters(self.model)}
        if dtypes != {"mlx.core.float32"}:
            raise TypeError(f"mlx-vlm port of {self.pin}: parameters are {sorted(dtypes)}, not float32 only")
        video_cfg = self.root / "video_preprocessor_config.json"
        self.spec = VisionSpec.from_config(config, json.loads(video_cfg.read_text()) if video_cfg.is_file() else None)
        text = config["text_config"]
        self.tokenizer = self.processor.tokenizer
        self.vocab_size = int(text["vocab_size"])
        self.hidden_size = int(text["hidden_size"])
        self.lm = self.model.language_model
        self.num_layers = len(self.lm.model.layers)
        self.max_context = int(text.get("max_position_embeddings", 0) or 0)
        eos = config.get("eos_token_id", text.get("eos_token_id"))
        self.eos_token_ids = frozenset(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)
        mlx_version = mx.__version__  # type: ignore[attr-defined]  # mlx.core's stubs (core/__init__.pyi) omit it
        self.versions = {"mlx": str(mlx_version), "mlx_vlm": str(mlx_vlm.__version__)}

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model_class": f"{type(self.model).__module__}.{type(self.model).__name__}",
                "processor": type(self.processor).__name__, "dtype": "float32", "device": str(self.mx.default_device()),
                **self.versions, "threads": self.threads or None, "config_overrides": {},
                "full_attention_interval": int(self.lm.args.full_attention_interval)}

    # -- cache ----------------------------------------------------------------------------------
    def make_cache(self) -> list[Any]:
        """mlx-vlm's own cache for its Qwen3.5 language model (``ArraysCache`` per linear-attention
        layer, ``KVCache`` per full-attention layer)."""
        return self.lm.make_cache()

    def cache_length(self, cache: Any) -> int:
        if not cache:
            return 0
        return int(cache[self.lm.model.fa_idx].offset)

    # -- pixels ---------------------------------------------------------------------------------
    def pixel_inputs(self, prompt: Prompt) -> dict[str, Any]:
        """mlx-vlm's processor outputs for the prompt's pictures (numpy), keyed as its model reads them.

        Raises:
            Unsupported: images and video in one prompt (module docstring).
            ValueError: the pads do not match the processor's grids.
        """
        if prompt.images and prompt.videos:
            raise self._unsupported("read images and video in one prompt", "mlx-vlm's Qwen3.5 get_input_embeddings "
                                    "takes pixel_values or pixel_values_videos, not both")
        out: dict[str, Any] = {}
        if prompt.images:
            out.update(self.processor.image_processor(list(prompt.images)))
        if prompt.videos:
            out.update(self.processor.video_processor([list(v) for v in prompt.videos]))
        grids = {k: [[int(x) for x in g] for g in np.asarray(out[k])] for k in ("image_grid_thw", "video_grid_thw") if k in out}
        check_pads(prompt.ids, self.spec, grids.get("image_grid_thw", []), grids.get("video_grid_thw", []), self.id)
        return out

    # -- forward --------------------------------------------------------------------------------
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> VisionStep:
        """:meth:`Engine.forward` through mlx-vlm (module docstring), returning a :class:`VisionStep`.

        Raises:
            Unsupported: pictures after a cached prefix, or images with video.
            ValueError: see :func:`check_forward_length` and :meth:`pixel_inputs`.
        """
        mx = self.mx
        p = as_prompt(prompt)
        cached = self.cache_length(cache)
        check_forward_length(self, cached, len(p.ids))
        if cached and p.has_media:
            raise self._unsupported("add pictures after a cached prefix", "M-RoPE is placed for a whole prompt")
        pixels = self.pixel_inputs(p) if not cached else {}
        x = mx.array([list(p.ids)], dtype=mx.int32)
        calls: list[tuple[Any, dict[str, Any], Any]] = []
        tower: list[tuple[Any, dict[str, Any], Any]] = []
        inner = self.lm.model
        originals = list(inner.layers)
        inner.layers[:] = [_Tap(layer, calls) for layer in originals]
        self.model.__dict__["vision_tower"] = _Tap(self.model.vision_tower, tower)
        try:
            out = self._call(x, cache, cached, pixels)
            hidden = out.hidden_states[-1][0]
            mx.eval(out.logits, hidden, *[c[2] for c in calls], *[t[2][0] for t in tower])
        finally:
            inner.layers[:] = originals
            del self.model.__dict__["vision_tower"]
        positions = self._planes(calls, len(p.ids))
        stream = None
        if layers:
            stream = np.stack([np.array(calls[0][0][0][0], dtype=np.float32),
                               *[np.array(c[2][0], dtype=np.float32) for c in calls]])
        logits = np.array(out.logits[0], dtype=np.float32)
        hid = np.array(hidden, dtype=np.float32)
        if keep:
            logits, hid, positions = logits[-keep:], hid[-keep:], positions[:, -keep:]
            stream = stream[:, -keep:] if stream is not None else None
        return VisionStep(logits=logits, hidden=hid, layers=stream, positions=positions,
                          media=tuple(self._media(pixels, tower)))

    def _call(self, x: Any, cache: Any, cached: int, pixels: dict[str, Any]) -> Any:
        mx = self.mx
        if cached:
            return self.lm(x, cache=cache, return_hidden=True)
        self.lm._position_ids = None  # mlx-vlm's per-model state (module docstring)
        self.lm._rope_deltas = None
        arrays = {k: mx.array(v) for k, v in pixels.items()}
        emb = self.model.get_input_embeddings(x, arrays.pop("pixel_values", None), **arrays)
        return self.lm(x, inputs_embeds=emb.inputs_embeds, cache=cache, position_ids=emb.position_ids,
                       rope_deltas=emb.rope_deltas, return_hidden=True,
                       **{k: v for k, v in arrays.items() if k.endswith("grid_thw")})

    def _planes(self, calls: list[tuple[Any, dict[str, Any], Any]], T: int) -> np.ndarray:
        """The ``position_ids`` the first full-attention layer received, as ``[3, T]`` int64."""
        layer = next((i for i, layer in enumerate(self.lm.model.layers) if not layer.is_linear), None)
        if layer is None or calls[layer][1].get("position_ids") is None:
            raise self._unsupported("report its position planes", "no full-attention layer received position_ids")
        pos = np.array(calls[layer][1]["position_ids"]).astype(np.int64)
        pos = pos[:, 0] if pos.ndim == 3 else np.broadcast_to(pos[0], (3, pos.shape[-1]))
        return np.ascontiguousarray(pos[:, -T:])

    def _media(self, pixels: dict[str, Any], tower: list[tuple[Any, dict[str, Any], Any]]) -> list[MediaRun]:
        if not tower:
            return []
        kind, grid_key, pixel_key = (("image", "image_grid_thw", "pixel_values") if "image_grid_thw" in pixels
                                     else ("video", "video_grid_thw", "pixel_values_videos"))
        grids = [(int(t), int(h), int(w)) for t, h, w in np.asarray(pixels[grid_key])]
        rows = split_rows(np.array(tower[-1][2][0], dtype=np.float32), grids, self.spec)
        px = np.split(np.asarray(pixels[pixel_key], dtype=np.float32), np.cumsum([t * h * w for t, h, w in grids])[:-1])
        return [MediaRun(kind, g, r, q) for g, r, q in zip(grids, rows, px)]

    # -- head, norm, independent forward ---------------------------------------------------------
    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        out = self.lm.lm_head(self.mx.array(np.ascontiguousarray(hidden, dtype=np.float32)))
        self.mx.eval(out)
        return np.array(out, dtype=np.float32)

    def final_norm(self, residual: np.ndarray) -> np.ndarray:
        out = self.lm.model.norm(self.mx.array(np.ascontiguousarray(residual, dtype=np.float32)))
        self.mx.eval(out)
        return np.array(out, dtype=np.float32)

    def plain_logits(self, prompt: Prompt | Sequence[int]) -> np.ndarray:
        """``[T, V]`` float32 logits of mlx-vlm's own ``Model.__call__`` on a cold prompt, no taps."""
        mx = self.mx
        p = as_prompt(prompt)
        arrays = {k: mx.array(v) for k, v in self.pixel_inputs(p).items()}
        self.lm._position_ids = None
        self.lm._rope_deltas = None
        out = self.model(mx.array([list(p.ids)], dtype=mx.int32), arrays.pop("pixel_values", None), **arrays)
        mx.eval(out.logits)
        return np.array(out.logits[0], dtype=np.float32)

    def text_ids(self, prompt: Prompt | Sequence[int]) -> list[int]:
        return list(as_prompt(prompt).ids)


__all__ = ["MlxVlmPort"]
