"""The reference's MTP attach (``TorchReference.mtp``) on a pin without MTP layers: refused in one line
naming the class, before any MTP weights are looked for. Slow: loads the draft twin (~13 MB), which the
speculative oracles load anyway."""

from __future__ import annotations

import pytest

from oracles.plugin.fixtures import Engines

pytestmark = [pytest.mark.slow]


def test_mtp_on_a_model_without_mtp_layers_is_refused(engines: Engines) -> None:
    engine = engines("torch", "smollm2-draft-twin")
    with pytest.raises(ValueError, match=r"LlamaForCausalLM: config has no num_mtp_layers"):
        engine.mtp()  # type: ignore[attr-defined]
