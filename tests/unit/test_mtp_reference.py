"""The reference's MTP capability (:class:`oracles.engines.torch.mtp.TorchMtp`) on a pin without MTP
layers: refused as :class:`~oracles.engines.types.Unsupported` naming the capability, the pin and the
class (a skip in a family, never a pass), before any MTP weights are looked for; and the System One
capability on a model that is not LFM2-VL, likewise. Slow: loads the draft twin (~13 MB), which the
speculative oracles load anyway."""

from __future__ import annotations

import pytest

from oracles.engines.systems import DECISIONS, MTP
from oracles.engines.types import Unsupported
from oracles.plugin.fixtures import Engines

pytestmark = [pytest.mark.slow]


def test_mtp_on_a_model_without_mtp_layers_is_refused(engines: Engines) -> None:
    engine = engines("torch", "smollm2-draft-twin")
    for ask in (engine.mtp_trunk_cache, engine.mtp_history_cache, lambda: engine.mtp_generate([1, 2], 2)):
        with pytest.raises(Unsupported, match=r"LlamaForCausalLM\) has no num_mtp_layers") as refused:
            ask()
        assert refused.value.capability == MTP and "smollm2-draft-twin" in str(refused.value)


def test_system_one_on_another_model_is_refused(engines: Engines) -> None:
    engine = engines("torch", "smollm2-draft-twin")
    with pytest.raises(Unsupported, match=r"written for Lfm2VlForConditionalGeneration") as refused:
        engine.decision_readout_ids({"type": "bool", "instructions": "x"})
    assert refused.value.capability == DECISIONS
