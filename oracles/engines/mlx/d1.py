"""The d1 port: mlx-vlm 0.7.10's own d1 decision model (``mlx_vlm.models.d1.Model``, LFM2-VL weights with
System One's prompt and read-out) and its processor, float32, on MLX's default device.

Loads the verified snapshot with ``mlx_vlm.utils.load``, which picks the d1 model for an ``lfm2_vl``
config whose ``auto_map.AutoModel`` ends in ``D1Model`` (as LiquidAI's d1 checkpoints ship it, and the
LFM2-VL twin does): no key is translated (``config_overrides`` is empty). The same snapshot with that
key removed loads as mlx-vlm's plain ``lfm2_vl`` model, whose decision API refuses
(:func:`plain_refusal`, a check of its own).

The System One capabilities (:class:`oracles.engines.systems.SystemOneDecisions`) are the port's own
calls, nothing recomputed in their place: :meth:`MlxVlmD1.decision_inputs` (``Model.decision_inputs``:
its prompt, its processor's pixels), :meth:`MlxVlmD1.decision_readout_ids` (its ``prompt.readout_ids``),
:meth:`MlxVlmD1.decision_logprobs` (``Model.answer_logprobs``: one pass for a row, the trunk once then
batched branches for a tree) and :meth:`MlxVlmD1.decision_predict` (``mlx_vlm.decision.predict``).
``forward`` runs the language model over ids (pictures through ``get_input_embeddings``) for the engine
contract. Its measured gap against the reference (the pictures' pixels) is :meth:`MlxVlmD1.known_gap`'s.

Importing mlx_vlm replaces ``transformers``' ``Lfm2VlProcessor`` methods and defaults
(``mlx_vlm/models/lfm2_vl/processing_lfm2_vl.py``); the reference never uses that class
(:mod:`oracles.engines.torch.lfm2_vl`). mlx and mlx-vlm are imported when the engine is built.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Prompt, Step, as_prompt, check_forward_length, hub_offline
from oracles.engines.mlx import mlx_vlm_unavailable

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

MODEL_CLASS = "Lfm2VlForConditionalGeneration"
#: The pin the pixel gaps were measured on, and the test that holds the pixels (its parameters: pin, engine, record).
PIN = "lfm2-vl-d1-twin"
PIXELS_TEST = "test_so_pixels"
#: Measured (test_so_pixels receipts, mlx-vlm 0.7.10 vs the reference's transformers algorithm): both
#: processors upscale the pictures to LFM2-VL's 64-token minimum with a bicubic kernel, but mlx-vlm's numpy
#: processor resizes with PIL, which rounds and clamps to 8 bits between its horizontal and vertical passes,
#: and transformers' Lfm2VlImageProcessor with torchvision's tensor path (torch's antialiased bicubic, one
#: rounding at the end). Where bicubic overshoots at a saturated edge the two part; a two-pass torch resize
#: with an 8-bit intermediate is within 1 step of PIL. By record.
PIXEL_GAP = {"so_pic_circle": "15 steps of the 8-bit scale on 1.3 % of values (96 x 64 -> 320 x 224; "
                              "log-probs at the read-out ids move by 2.3e-3, probabilities by 2.2e-4)",
             "so_pic_square_tree": "1 step of the 8-bit scale on 0.03 % of values (64 x 128 -> 192 x 384; "
                                   "log-probs move by 1.0e-4, probabilities by 2.6e-5)"}


def is_d1_config(config: dict[str, Any]) -> bool:
    """Whether mlx-vlm 0.7.10 reads ``config`` as its d1 model (``mlx_vlm.utils``' rule)."""
    auto = str((config.get("auto_map") or {}).get("AutoModel", ""))
    return config.get("model_type") == "d1" or config.get("model_type") == "lfm2_vl" and auto.endswith("D1Model")


def plain_refusal(root: Path, scratch: Path) -> tuple[str, str]:
    """Load a copy of the snapshot at ``root`` whose config lacks ``auto_map`` (files linked into
    ``scratch``) and ask mlx-vlm's ``decision.predict`` for one answer: ``(model class, the error line)``.

    Raises:
        AssertionError: the plain load answered instead of refusing.
    """
    from mlx_vlm import decision
    from mlx_vlm.utils import load

    scratch.mkdir(parents=True, exist_ok=True)
    for f in root.iterdir():
        if f.name != "config.json":
            (scratch / f.name).symlink_to(f)
    config = json.loads((root / "config.json").read_text())
    config.pop("auto_map", None)
    (scratch / "config.json").write_text(json.dumps(config))
    try:
        model, processor = load(str(scratch))
        cls = f"{type(model).__module__}.{type(model).__name__}"
        try:
            decision.predict(model, processor, "x", {"q": {"type": "noul", "instructions": "y"}})
        except ValueError as exc:
            return cls, str(exc)
        raise AssertionError(f"{cls} answered a decision without the d1 auto_map")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


class MlxVlmD1(Engine):
    """mlx-vlm's d1 model and processor from a verified LFM2-VL snapshot, float32 (module docstring).

    Raises:
        Unsupported: the snapshot's config is not one mlx-vlm reads as its d1 model.
        TypeError: a loaded parameter is not float32.
    """

    id = "mlx-vlm-d1"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return mlx_vlm_unavailable()

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        if pin.model_class != MODEL_CLASS:
            return f"mlx-vlm's d1 model is LFM2-VL; pin {pin.name} is {pin.model_class}"
        return None

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        hub_offline()
        config = json.loads((self.root / "config.json").read_text())
        if not is_d1_config(config):
            raise self._unsupported(f"load pin {self.pin} as d1", "its config carries neither model_type d1 nor an "
                                    "auto_map AutoModel ending in D1Model; mlx-vlm loads it as plain lfm2_vl")
        import mlx.core as mx
        import mlx_vlm
        from mlx_vlm.utils import load

        from oracles.engines.mlx.cohort import flat_parameters

        self.mx = mx
        self.model, self.processor = load(str(self.root))
        dtypes = {str(v.dtype) for _, v in flat_parameters(self.model)}
        if dtypes != {"mlx.core.float32"}:
            raise TypeError(f"mlx-vlm d1 port of {self.pin}: parameters are {sorted(dtypes)}, not float32 only")
        text = config["text_config"]
        self.tokenizer = self.processor.tokenizer
        self.vocab_size, self.hidden_size = int(text["vocab_size"]), int(text["hidden_size"])
        self.lm = self.model.language_model
        self.num_layers = len(self.lm.model.layers)
        self.max_context = int(text.get("max_position_embeddings", 0) or 0)
        eos = config.get("eos_token_id", text.get("eos_token_id"))
        self.eos_token_ids = frozenset(int(i) for i in (eos if isinstance(eos, list) else [eos]) if i is not None)
        self.versions = {"mlx": str(getattr(mx, "__version__", "?")), "mlx_vlm": str(mlx_vlm.__version__)}

    def known_gap(self, oracle: str, any_pin: bool = False) -> str | None:
        """:data:`PIXEL_GAP` of a picture record on :data:`PIXELS_TEST` (under this engine's own id, so an
        adapter built on this one expects it too), on :data:`PIN` (any pin with ``any_pin``)."""
        if not (oracle.startswith(f"{PIXELS_TEST}[") and f"-{self.id}" in oracle and (any_pin or self.pin == PIN)):
            return None
        rid = next((r for r in PIXEL_GAP if re.search(rf"[\[-]{r}[\]-]", oracle)), None)
        return None if rid is None else (f"mlx-vlm 0.7.10's LFM2-VL pixels differ from transformers' by {PIXEL_GAP[rid]}: "
                                         "PIL's two-pass 8-bit bicubic vs torch's")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "model_class": f"{type(self.model).__module__}.{type(self.model).__name__}",
                "processor": type(self.processor).__name__,
                "image_processor": type(self.processor.image_processor).__name__, "dtype": "float32",
                "device": str(self.mx.default_device()), **self.versions, "threads": self.threads or None,
                "config_overrides": {}, "loaded_as": "d1 through auto_map AutoModel modeling_d1.D1Model"}

    # -- the decision API (mlx-vlm's own calls) ----------------------------------------------------
    def decision_inputs(self, state: Any, questions: Sequence[dict[str, Any]],
                        images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]], dict[str, np.ndarray]]:
        """``Model.decision_inputs`` of the published-form questions: trunk ids, branch ids, and the
        vision inputs as numpy (``pixel_values`` ``[N, P, 768]`` float32 trimmed to the real patches,
        ``pixel_attention_mask`` ``[N, P]``, ``spatial_shapes`` ``[N, 2]``)."""
        from mlx_vlm.models.d1.prompt import as_question

        qs = [as_question(dict(q)) for q in questions]
        trunk, branches, vision = self.model.decision_inputs(self.processor, state, qs, list(images) or None)
        return ([int(i) for i in trunk], [[int(i) for i in b] for b in branches],
                {k: np.array(v) for k, v in vision.items()})

    def decision_readout_ids(self, question: dict[str, Any]) -> list[list[int]]:
        """``prompt.readout_ids``: the token ids scored per option."""
        from mlx_vlm.models.d1.prompt import as_question, readout_ids

        return [[int(i) for i in g] for g in readout_ids(self.tokenizer, as_question(dict(question)))]

    def decision_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                          vision: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        """``Model.answer_logprobs``: ``[V]`` float32 log-probabilities at each answer slot."""
        mx = self.mx
        arrays = {k: mx.array(v) for k, v in (vision or {}).items()}
        out = self.model.answer_logprobs(list(trunk), [list(b) for b in branches], arrays or None)
        return [np.asarray(z, dtype=np.float32) for z in out]

    def decision_predict(self, state: Any, questions: dict[str, dict[str, Any]], images: Sequence[Any] = ()) -> dict[str, Any]:
        """``mlx_vlm.decision.predict``: the answers as the port's API returns them."""
        from mlx_vlm import decision

        kwargs = {"images": list(images)} if images else {}
        return dict(decision.predict(self.model, self.processor, state, questions, **kwargs))

    # -- the engine contract -------------------------------------------------------------------------
    def make_cache(self) -> list[Any]:
        return list(self.lm.make_cache())

    def cache_length(self, cache: Any) -> int:
        offsets = [int(c.offset) for c in (cache or []) if hasattr(c, "offset")]
        return max(offsets, default=0)

    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """The language model over ``prompt`` (pictures through ``get_input_embeddings`` on a cold cache):
        ``[T, V]`` logits and the final-norm hidden ``[T, D]``, float32.

        Raises:
            Unsupported: ``layers=True``, or pictures after a cached prefix.
        """
        mx = self.mx
        p = as_prompt(prompt)
        cached = self.cache_length(cache)
        check_forward_length(self, cached, len(p.ids))
        if layers:
            raise self._unsupported("tap its layers")
        if cached and p.images:
            raise self._unsupported("add pictures after a cached prefix")
        ids = mx.array([list(p.ids)], dtype=mx.int32)
        kw: dict[str, Any] = {}
        if p.images:
            px = self.processor.image_processor(list(p.images))
            n = int(np.asarray(px["pixel_attention_mask"]).sum(1).max())
            kw = {"pixel_values": mx.array(np.asarray(px["pixel_values"])[:, :n]),
                  "pixel_attention_mask": mx.array(np.asarray(px["pixel_attention_mask"])[:, :n]),
                  "spatial_shapes": mx.array(np.asarray(px["spatial_shapes"]))}
        embeds = self.model.get_input_embeddings(ids, **kw).inputs_embeds
        hidden = self.lm.model(ids, cache=cache, input_embeddings=embeds)
        logits = self._head(hidden)
        mx.eval(logits, hidden)
        lg, hd = np.array(logits[0], dtype=np.float32), np.array(hidden[0], dtype=np.float32)
        return Step(logits=lg[-keep:] if keep else lg, hidden=hd[-keep:] if keep else hd)

    def _head(self, hidden: Any) -> Any:
        lm = self.lm
        return lm.model.embed_tokens.as_linear(hidden) if lm.args.tie_word_embeddings else lm.lm_head(hidden)

    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        out = self._head(self.mx.array(np.ascontiguousarray(hidden, dtype=np.float32)))
        self.mx.eval(out)
        return np.array(out, dtype=np.float32)


__all__ = ["MlxVlmD1", "is_d1_config", "plain_refusal"]
