"""System One runs of one request on any engine that answers System One decisions
(:class:`oracles.engines.systems.SystemOneDecisions`: the reference, a port), numpy only: the engines
compute, this module records what they computed.

A request runs the way D1Model's API runs it (the *API path*: one pass for a single question, the trunk
then a branch per question for several) and, where it has several questions, each question again as
its own single-question request (the *rows*), so the tree can be held against the rows. The answers
are the engine's own ``decision_predict``; the option probabilities are System One's read-out
(:func:`oracles.families.d1.system_one.readout`) of the engine's log-probabilities over the engine's
read-out groups. The reference also runs a picture request on a port's ids and pixels
(:func:`reference_on_port_pixels`), which separates what the model computes from what the two
processors feed it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from oracles.families.d1 import system_one as so

if TYPE_CHECKING:
    from PIL import Image

    from oracles.engines.base import Engine


@dataclass
class Run:
    """One engine's run of one request. ``logz``: per question ``[V]`` float32 on the API path;
    ``rows``: per question id ``(ids, logz [V])`` of its single-question request (several questions
    only); ``groups``/``probs``/``answers`` per question id; ``vision``: the pixels the engine fed
    (``pixel_values``, ``pixel_attention_mask``, ``spatial_shapes``; ``{}`` without pictures)."""

    engine: str
    trunk: list[int]
    branches: list[list[int]]
    vision: dict[str, np.ndarray]
    logz: list[np.ndarray]
    groups: dict[str, list[list[int]]]
    probs: dict[str, list[float]]
    answers: dict[str, dict[str, Any]]
    rows: dict[str, tuple[list[int], np.ndarray]] = field(default_factory=dict)
    seconds: float = 0.0


def pictures(request: so.Request) -> list["Image.Image"]:
    """The request's pictures, loaded (RGB) from ``oracles/builtin/images``."""
    from PIL import Image  # pillow comes with the torch and mlx extras; the dry suite runs without it

    out = []
    for name in request.images:
        with Image.open(so.IMAGES / name) as im:
            out.append(im.convert("RGB"))
    return out


def run(engine: "Engine", request: so.Request) -> Run:
    """The engine's API path, rows, read-out groups and ``decision_predict`` answers of ``request``.

    Raises:
        Unsupported: the engine answers no System One decisions (the test then skips naming it).
    """
    start = time.perf_counter()
    ims = pictures(request)
    qs = [q.as_request() for q in request.questions]
    trunk, branches, vision = engine.decision_inputs(request.state, qs, ims)
    logz = engine.decision_logprobs(trunk, branches, vision)
    groups = {q.qid: engine.decision_readout_ids(d) for q, d in zip(request.questions, qs)}
    probs = {q.qid: so.readout(z, groups[q.qid]) for q, z in zip(request.questions, logz)}
    rows = {}
    if len(request.questions) > 1:
        for q, d in zip(request.questions, qs):
            ids, _, v = engine.decision_inputs(request.state, [d], ims)
            rows[q.qid] = (ids, engine.decision_logprobs(ids, [], v)[0])
    answers = engine.decision_predict(request.state, {q.qid: d for q, d in zip(request.questions, qs)}, ims)["answers"]
    return Run(engine.id, trunk, branches, vision, logz, groups, probs, dict(answers), rows,
               seconds=time.perf_counter() - start)


def reference_on_port_pixels(reference: "Engine", ref_run: Run, port_run: Run) -> list[np.ndarray]:
    """The reference's API path on the port's ids and pixels (a picture request), per question ``[V]``.

    Raises:
        ValueError: the port's pictures are not the reference's patch grids (row count or a grid differs).
    """
    mine, theirs = np.asarray(ref_run.vision["spatial_shapes"]), np.asarray(port_run.vision["spatial_shapes"])
    if mine.shape != theirs.shape or not np.array_equal(mine, theirs):
        raise ValueError(f"{port_run.engine}'s patch grids {theirs.tolist()} vs the reference's {mine.tolist()}")
    return reference.decision_logprobs(port_run.trunk, port_run.branches, port_run.vision)
