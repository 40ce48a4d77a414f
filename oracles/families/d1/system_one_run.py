"""System One runs of one request, on the reference and on mlx-vlm's d1 port (numpy only: the engines
compute, this module records what they computed).

A request runs the way D1Model's API runs it (the *API path*: one pass for a single question, the trunk
then a branch per question for several) and, where it has several questions, each question again as
its own single-question request (the *rows*), so the tree can be held against the rows. The reference
also runs a picture request on the port's pixels (``logz_port_pixels``), which separates what the
model computes from what the two processors feed it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

from oracles.families.d1 import system_one as so

if TYPE_CHECKING:
    from PIL import Image


class Reference(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decision_inputs(self, request: so.Request, images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]],
                                                                                          list[Any]]: ...
    def answer_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                        pixels: Sequence[Any] = ()) -> list[np.ndarray]: ...


class Port(Protocol):
    def decision_inputs(self, state: Any, questions: Sequence[dict[str, Any]],
                        images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]], dict[str, np.ndarray]]: ...
    def readout_ids(self, question: dict[str, Any]) -> list[list[int]]: ...
    def answer_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                        vision: dict[str, np.ndarray] | None = None) -> list[np.ndarray]: ...
    def predict(self, state: Any, questions: dict[str, dict[str, Any]], images: Sequence[Any] = ()) -> dict[str, Any]: ...


@dataclass
class Run:
    """One engine's run of one request. ``logz``: per question ``[V]`` float32 on the API path;
    ``rows``: per question id ``(ids, logz [V])`` of its single-question request (several questions
    only); ``groups``/``probs``/``answers`` per question id; ``vision``: the pixels the engine fed
    (the reference's :class:`oracles.engines.torch.lfm2_vl.Pixels` list, the port's numpy dict)."""

    engine: str
    trunk: list[int]
    branches: list[list[int]]
    vision: Any
    logz: list[np.ndarray]
    groups: dict[str, list[list[int]]]
    probs: dict[str, list[float]]
    answers: dict[str, dict[str, Any]]
    rows: dict[str, tuple[list[int], np.ndarray]] = field(default_factory=dict)
    logz_port_pixels: list[np.ndarray] | None = None
    seconds: float = 0.0


def pictures(request: so.Request) -> list["Image.Image"]:
    """The request's pictures, loaded (RGB) from ``oracles/builtin/images``."""
    from PIL import Image  # pillow comes with the torch and mlx extras; the dry suite runs without it

    out = []
    for name in request.images:
        with Image.open(so.IMAGES / name) as im:
            out.append(im.convert("RGB"))
    return out


def one(request: so.Request, q: so.Question) -> so.Request:
    """``request`` with question ``q`` alone (its row)."""
    return so.Request(request.id, request.state, request.images, (q,), request.sha256)


def run_reference(ref: Reference, request: so.Request) -> Run:
    """The reference's API path and rows of ``request`` (module docstring); answers by :func:`so.answer`."""
    start = time.perf_counter()
    ims = pictures(request)
    trunk, branches, pixels = ref.decision_inputs(request, ims)
    logz = ref.answer_logprobs(trunk, branches, pixels)
    groups = {q.qid: so.readout_groups(ref.encode, q) for q in request.questions}
    probs = {q.qid: so.readout(z, groups[q.qid]) for q, z in zip(request.questions, logz)}
    rows = {}
    if len(request.questions) > 1:
        for q in request.questions:
            ids, _, px = ref.decision_inputs(one(request, q), ims)
            rows[q.qid] = (ids, ref.answer_logprobs(ids, [], px)[0])
    return Run("torch", trunk, branches, pixels, logz, groups, probs,
               {q.qid: so.answer(q, probs[q.qid]) for q in request.questions}, rows,
               seconds=time.perf_counter() - start)


def run_port(port: Port, request: so.Request) -> Run:
    """The port's own API path, rows, read-out groups and ``predict`` answers of ``request``."""
    start = time.perf_counter()
    ims = pictures(request)
    qs = [q.as_request() for q in request.questions]
    trunk, branches, vision = port.decision_inputs(request.state, qs, ims)
    logz = port.answer_logprobs(trunk, branches, vision)
    groups = {q.qid: port.readout_ids(d) for q, d in zip(request.questions, qs)}
    probs = {q.qid: so.readout(z, groups[q.qid]) for q, z in zip(request.questions, logz)}
    rows = {}
    if len(request.questions) > 1:
        for q, d in zip(request.questions, qs):
            ids, _, v = port.decision_inputs(request.state, [d], ims)
            rows[q.qid] = (ids, port.answer_logprobs(ids, [], v)[0])
    answers = port.predict(request.state, {q.qid: d for q, d in zip(request.questions, qs)}, ims)["answers"]
    return Run(getattr(port, "id", "port"), trunk, branches, vision, logz, groups, probs, dict(answers), rows,
               seconds=time.perf_counter() - start)


def reference_on_port_pixels(ref: Reference, ref_run: Run, port_run: Run) -> list[np.ndarray]:
    """The reference's API path on the port's ids and pixels (a picture request), per question ``[V]``."""
    from oracles.engines.torch.lfm2_vl import foreign_pixels

    return ref.answer_logprobs(port_run.trunk, port_run.branches, foreign_pixels(port_run.vision, ref_run.vision))
