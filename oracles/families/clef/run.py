"""clef runs on any vision-language engine of the protocol: rows, decode steps after a prefill, and the
absmax reduction of a text run. Numpy only; the engine does every forward and every picture goes through
its own processor. What a run computed is kept as it ran, so the checks read the run's own values.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from oracles.checks.absmax import layer_stats, row_stats
from oracles.checks.readout import group_probabilities, log_softmax
from oracles.engines.base import Engine, Prompt
from oracles.engines.vision import VisionSpec, VisionStep
from oracles.families.clef import records as clef
from oracles.families.d1 import records as d1

if TYPE_CHECKING:
    from oracles.families.callables import Runs

#: clef's port sample under ``--port-records sample``: rows of at most this many tokens, i.e. every row of
#: the built-in records (the longest, img_circle/g128 and img_pair/native, are ~90 tokens; the mlx-vlm
#: port runs the twin's rows in ~40 ms each here).
CLEF_SAMPLE_TOKENS = 256
#: The two runs whose every residual-stream layer ``[L + 1, T, D]`` goes into the npz sidecar (one text,
#: one image, as the clef reference program chose).
STREAM_RUNS = (("txt_count", "text", "circles"), ("img_circle", "g128", "red"))

Key = tuple[str, str, str]


@dataclass(frozen=True)
class Row:
    """One question of one record in one arm; ``key`` = (record id, arm, question id)."""

    record: clef.Record
    arm: str
    question: d1.Question

    @property
    def key(self) -> Key:
        return (self.record.id, self.arm, self.question.qid)

    @property
    def label(self) -> str:
        return "/".join(self.key)


def all_rows(records: Sequence[clef.Record]) -> list[Row]:
    """Every row of ``records``: per record, per arm, per accepted question, in file order."""
    return [Row(r, arm, q) for r in records for arm in r.arms for q in r.request.questions]


def vision_spec(root: Path) -> VisionSpec:
    """The :class:`VisionSpec` of the snapshot folder ``root`` (its config and video processor config)."""
    config = json.loads((root / "config.json").read_text())
    video = root / "video_preprocessor_config.json"
    return VisionSpec.from_config(config, json.loads(video.read_text()) if video.is_file() else None)


@dataclass
class RowPrompt:
    """A row rendered for one engine: the prompt (ids and pictures) and the grid each picture must get."""

    prompt: Prompt
    grids: list[tuple[int, int, int]]
    kinds: list[str]


def build_prompt(engine: Engine, row: Row, spec: VisionSpec, manifest: dict[str, Any]) -> RowPrompt:
    """Render ``row`` with ``engine``'s tokenizer and chat template (:mod:`oracles.families.clef.records`).

    Raises:
        FixtureError: a picture that does not fit its arm, or whose bytes differ from the manifest.
    """
    names = engine.tokenizer.convert_ids_to_tokens([spec.start_id, spec.end_id, spec.image_id, spec.video_id])
    tokens = clef.Tokens(*names)
    media = row.record.media
    grids = [clef.expected_grid(p, row.arm, spec.patch, spec.merge, spec.temporal) for p in media]
    text = clef.media_text(media, grids, tokens, spec.merge, spec.temporal, spec.fps)
    ids = engine.chat_ids(clef.row_messages(row.record, row.question, text))
    pictures = [clef.load_pictures(p, row.arm, manifest) for p in media]
    images = tuple(im for p, ims in zip(media, pictures) if p.kind == "image" for im in ims)
    videos = tuple(tuple(ims) for p, ims in zip(media, pictures) if p.kind == "video")
    return RowPrompt(Prompt(tuple(ids), images, videos), grids, [p.kind for p in media])


@dataclass
class RowRun:
    """One row on one engine: the rendered prompt, the forward's :class:`VisionStep` (every position,
    with the residual stream), the read-out at the answer slot (``logz`` ``[V]`` float32, one probability
    per read-out group) and the seconds the forward took."""

    engine: str
    row: Row
    rendered: RowPrompt
    step: VisionStep
    groups: list[list[int]]
    logz: np.ndarray
    probs: list[float]
    seconds: float

    @property
    def ids(self) -> list[int]:
        return list(self.rendered.prompt.ids)


def encoder(engine: Engine) -> Callable[[str], list[int]]:
    """``text -> ids`` without special tokens, with the engine's tokenizer (for the read-out groups)."""
    return lambda text: list(engine.tokenizer.encode(text, add_special_tokens=False))


def run_row(engine: Engine, row: Row, spec: VisionSpec, manifest: dict[str, Any]) -> RowRun:
    """Render and run one row cold with ``layers=True``, and read it out at its last position."""
    rendered = build_prompt(engine, row, spec, manifest)
    start = time.perf_counter()
    step = engine.forward(rendered.prompt, layers=True)
    seconds = time.perf_counter() - start
    if not isinstance(step, VisionStep):
        raise TypeError(f"engine {engine.id}: a forward of a prompt with pictures returned a {type(step).__name__}, "
                        "not a VisionStep (its vision taps)")
    groups = d1.readout_groups(encoder(engine), row.question)
    logz = log_softmax(step.logits[-1])
    return RowRun(engine.id, row, rendered, step, groups, logz, group_probabilities(logz, groups), seconds)


@dataclass
class DecodeRun:
    """A cold prefill into a fresh cache, then greedy one-token steps on it.

    ``prefill``: the prefill's planes ``[3, T]``; ``steps``: each step's planes ``[3, 1]``;
    ``tokens``: the fed tokens; ``lengths``: the cache length before each step."""

    ids: list[int]
    prefill: np.ndarray
    steps: list[np.ndarray]
    tokens: list[int]
    lengths: list[int]


def run_decode(engine: Engine, prompt: Prompt, steps: int = 2) -> DecodeRun:
    """Prefill ``prompt`` into ``engine.make_cache()`` and decode ``steps`` greedy tokens one at a time."""
    cache = engine.make_cache()
    first = engine.forward(prompt, cache)
    token = int(np.argmax(first.logits[-1]))
    planes, tokens, lengths = [], [], []
    for _ in range(steps):
        lengths.append(engine.cache_length(cache))
        step = engine.forward([token], cache)
        planes.append(np.asarray(step.positions))
        tokens.append(token)
        token = int(np.argmax(step.logits[-1]))
    return DecodeRun(list(prompt.ids), np.asarray(first.positions), planes, tokens, lengths)


def absmax_record(step: Any, label: str) -> dict[str, Any]:
    """The absmax figures of one run for the survey (:mod:`oracles.checks.absmax`): per residual-stream
    row (row 0: the first layer's input; row i: layer i - 1's output), the final norm's output, and the
    MLP down-projection inputs where the engine taps them (None elsewhere)."""
    down = getattr(step, "down_in_absmax", None)
    return {"run": label, "tokens": int(step.layers.shape[1]), "layer_input": row_stats(step.layers[0]),
            "layers": layer_stats(step.layers[1:]), "final_norm": row_stats(step.hidden),
            "mlp_down_in": None if down is None else [float(v) for v in down]}


def memo_row(runs: Runs, engine: Engine, row: Row, spec: VisionSpec, manifest: dict[str, Any]) -> tuple[RowRun, bool]:
    """``run_row`` through the session memo ``runs(key, fn)``: (the run, whether this call computed it)."""
    made: list[bool] = []

    def compute() -> RowRun:
        made.append(True)
        return run_row(engine, row, spec, manifest)

    return runs(("clef", engine.id, engine.pin, row.key), compute), bool(made)


__all__ = ["CLEF_SAMPLE_TOKENS", "STREAM_RUNS", "DecodeRun", "Row", "RowPrompt", "RowRun", "absmax_record",
           "all_rows", "build_prompt", "encoder", "memo_row", "run_decode", "run_row", "vision_spec"]
