"""The system capabilities of the engine contract (oracles/engines/systems.py: MTP drafting, System One
decisions) and the checks of their returns (oracles/engines/contract_systems.py): every default refuses as
Unsupported naming engine and capability (a skip, never a pass); a port that serves them is checked on every
call, a wrong return one EngineContractError naming engine, method, field, what came back and what was
expected; the buffer digests likewise. And the registry: mlx-vlm's MTP adapter is a registered engine. No
framework is imported."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pytest
from cohort_fake import D, FakeEngine, V

from oracles.engines import BUILTIN, Registry
from oracles.engines.base import EngineContractError, MtpGeneration, Unsupported
from oracles.engines.contract import install_checks
from oracles.engines.systems import DECISIONS, MTP

pytestmark = pytest.mark.dry

#: Every system method with arguments it may be called with.
CALLS: dict[str, tuple[Any, ...]] = {
    "mtp_trunk_cache": (), "mtp_history_cache": (), "mtp_trunk": ([1, 2], None),
    "mtp_draft": ([1], np.zeros((1, D), "<f4"), 1, None), "mtp_head": (np.zeros((1, D), "<f4"),),
    "mtp_generate": ([1, 2], 3), "decision_inputs": ("a state", [{"type": "bool", "instructions": "x"}]),
    "decision_readout_ids": ({"type": "bool", "instructions": "x"},), "decision_logprobs": ([1, 2], []),
    "decision_predict": ("a state", {"q": {"type": "bool", "instructions": "x"}}),
}


@pytest.mark.parametrize("method", list(CALLS))
def test_every_system_default_refuses_naming_engine_and_capability(method: str) -> None:
    engine = FakeEngine()
    install_checks(engine)  # the checked methods refuse as the defaults do
    with pytest.raises(Unsupported) as refused:
        getattr(engine, method)(*CALLS[method])
    assert refused.value.engine == "fake"
    assert refused.value.capability == (MTP if method.startswith("mtp_") else DECISIONS)
    assert str(refused.value).startswith(f"engine 'fake' cannot {refused.value.capability}")


class Systems(FakeEngine):
    """A port serving every system capability with numpy; ``bug`` names the method whose return is wrong."""

    id = "systems"

    def __init__(self, bug: str = "") -> None:
        super().__init__()
        self.bug = bug

    def _rows(self, n: int, method: str) -> tuple[np.ndarray, np.ndarray]:
        logits = np.zeros((n, V), "<f4" if self.bug != method else "<f8")
        return logits, np.zeros((n + (self.bug == f"{method}.state"), D), "<f4")

    def mtp_trunk(self, ids: Sequence[int], cache: Any) -> tuple[np.ndarray, np.ndarray]:
        return self._rows(len(ids), "mtp_trunk")

    def mtp_draft(self, tokens: Sequence[int], state: np.ndarray, start: int, history: Any,
                  depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
        return self._rows(len(tokens), "mtp_draft")

    def mtp_head(self, state: np.ndarray) -> np.ndarray:
        return np.zeros((len(state), V if self.bug != "mtp_head" else V - 1), "<f4")

    def mtp_generate(self, ids: Sequence[int], max_new_tokens: int) -> MtpGeneration:
        tokens: list[Any] = [1, 2] if self.bug != "mtp_generate" else [1, np.float32(2.0)]
        return MtpGeneration(tokens=tokens, greedy=[1, 2], forwards=2, accepted=1, drafted=None)

    def decision_inputs(self, state: Any, questions: Sequence[dict[str, Any]],
                        images: Sequence[Any] = ()) -> tuple[list[int], list[list[int]], dict[str, np.ndarray]]:
        vision: Any = {} if self.bug != "decision_inputs" else {"pixel_values": [[0.0]]}
        return [1, 2], [[3]] * (len(questions) if len(questions) > 1 else 0), vision

    def decision_readout_ids(self, question: dict[str, Any]) -> list[list[int]]:
        return [[5], [6]] if self.bug != "decision_readout_ids" else [[5], []]

    def decision_logprobs(self, trunk: Sequence[int], branches: Sequence[Sequence[int]],
                          vision: dict[str, np.ndarray] | None = None) -> list[np.ndarray]:
        n = max(1, len(branches)) + (self.bug == "decision_logprobs")
        return [np.zeros(V, "<f4") for _ in range(n)]

    def decision_predict(self, state: Any, questions: dict[str, dict[str, Any]], images: Sequence[Any] = ()) -> dict[str, Any]:
        answers = {q: {"type": "bool", "value": True, "probability": 0.9} for q in questions}
        return {"answers": answers if self.bug != "decision_predict" else {}}


GOOD: dict[str, tuple[Any, ...]] = {**CALLS, "mtp_draft": ([1, 2], np.zeros((2, D), "<f4"), 1, None)}


def test_a_port_serving_every_capability_passes_its_checks() -> None:
    engine = Systems()
    install_checks(engine)
    for method in ("mtp_trunk", "mtp_draft", "mtp_head", "mtp_generate", "decision_inputs", "decision_readout_ids",
                   "decision_logprobs", "decision_predict"):
        getattr(engine, method)(*GOOD[method])


@pytest.mark.parametrize(("bug", "method", "message"), [
    ("mtp_trunk", "mtp_trunk", r"engine systems mtp_trunk\(\): logits is float64 \[2, 2003\]; expected float32 \[T, V\]"),
    ("mtp_trunk.state", "mtp_trunk", r"mtp_trunk\(\): state is float32 \[3, 8\]; expected float32 \[T, D\] = \[2, 8\]"),
    ("mtp_draft", "mtp_draft", r"mtp_draft\(\): logits is float64 \[2, 2003\]"),
    ("mtp_head", "mtp_head", r"mtp_head\(\): the return value is float32 \[1, 2002\]; expected float32 \[n, V\] = \[1, 2003\]"),
    ("mtp_generate", "mtp_generate",
     r"mtp_generate\(\): MtpGeneration.tokens\[1\] is float32 np.float32\(2.0\); expected an int token id"),
    ("decision_inputs", "decision_inputs", r"decision_inputs\(\): vision is a dict; expected a dict of numpy arrays"),
    ("decision_readout_ids", "decision_readout_ids", r"decision_readout_ids\(\): group 1 is a list; expected a non-empty"),
    ("decision_logprobs", "decision_logprobs", r"decision_logprobs\(\): the return value is a list; expected a list of 1 arrays"),
    ("decision_predict", "decision_predict", r"decision_predict\(\): answers is a dict; expected a dict of one answer per"),
])
def test_a_wrong_return_is_one_contract_line(bug: str, method: str, message: str) -> None:
    engine = Systems(bug)
    install_checks(engine)
    with pytest.raises(EngineContractError, match=message):
        getattr(engine, method)(*GOOD[method])


def test_buffer_digests_are_checked() -> None:
    class BadDigests(FakeEngine):
        def buffer_digests(self, snapshot: Any) -> dict[str, str]:
            return {"layers.0.keys": "not a digest"}

    engine = BadDigests()
    install_checks(engine)
    snap = engine.snapshot(engine.make_cache())
    assert set(engine.snapshot_buffers(snap)) and len(engine.snapshot_digest(snap)) == 64  # the real ones pass
    with pytest.raises(EngineContractError, match=r"buffer_digests\(\): the return value is a dict; expected a dict of "
                                                   r"sha256 hex digests"):
        engine.buffer_digests(snap)


def test_mlx_vlm_mtp_is_a_registered_engine() -> None:
    """Registered like the other adapters: the id resolves to its class without importing mlx."""
    from oracles.engines.mlx.mtp import MlxVlmMtp

    assert BUILTIN["mlx-vlm-mtp"] == "oracles.engines.mlx.mtp:MlxVlmMtp"
    assert Registry(dict(BUILTIN)).load("mlx-vlm-mtp") is MlxVlmMtp
