"""The mtplx port: mtplx's own runtime on top of the mlx-lm model (macOS arm64 only).

Where ``import mtplx`` works, generation goes through mtplx's runtime (``MTPLXRuntime`` and its
``generate_ar``, with its ``SamplerConfig`` and seed), as the hand-written MTPLX oracle did; forward,
KV cache, snapshot/restore and lm_head are the mlx-lm model's (:class:`MlxPort`), which mtplx runs.
Elsewhere the engine registry reports it unavailable (platform named) and its tests skip; nothing in
this module has been run on this Linux machine, so it stays this small: any mtplx API mismatch shows
up as an error naming the call on the first macOS run.

Not covered: mtplx's MTP generation (``generate_mtpk``) needs a model with an MTP head; SmolLM2 has
none, so :meth:`MtplxPort.speculative` refuses, naming why.
"""

from __future__ import annotations

import importlib.util
import platform
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.base import Engine, Generation, Prompt, Sampler
from oracles.engines.mlx.lm import MlxPort

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


class MtplxPort(MlxPort):
    """mtplx's runtime over the mlx-lm model of a verified snapshot (float32, MLX default device)."""

    id = "mtplx"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if not (platform.system() == "Darwin" and platform.machine() == "arm64"):
            return f"mtplx imports only on macOS arm64, this is {platform.system()} {platform.machine()}"
        if importlib.util.find_spec("mtplx") is None:
            return "mtplx is not installed"
        return super().unavailable_reason()

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        import mtplx  # noqa: F401  (the registry checked the platform; fail here, loudly, if it is missing)
        from mtplx.runtime import MTPLXRuntime

        super().__init__(root, pin, threads)
        self.runtime = MTPLXRuntime(self.model, self.tokenizer, self.root, False, None)

    def describe(self) -> dict[str, Any]:
        import mtplx

        return {**super().describe(), "engine": self.id, "mtplx": str(getattr(mtplx, "__version__", "unknown"))}

    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """mtplx's ``generate_ar`` to a stop token or ``max_new_tokens`` (greedy when temperature is 0).

        Raises:
            Unsupported: ``max_kv_size`` (``generate_ar`` has no bounded cache).
        """
        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)", "mtplx generate_ar has no max_kv_size")
        ids = self.text_ids(prompt)
        from mtplx.generation import generate_ar
        from mtplx.sampling import SamplerConfig

        config = SamplerConfig(temperature=sampler.temperature, top_p=sampler.top_p, top_k=sampler.top_k)
        start = time.perf_counter()
        out = generate_ar(self.runtime, list(ids), max_tokens=max_new_tokens, sampler=config, seed=sampler.seed,
                          stop_token_ids=set(self.eos_token_ids), capture_final_state=True)
        end = time.perf_counter()
        final = getattr(out.final_state, "final_logits", None)
        logits = np.zeros((0, self.vocab_size), "<f4") if final is None else np.array(final, dtype=np.float32).reshape(1, -1)
        prefill = float(getattr(out.stats, "prompt_eval_time_s", 0.0) or 0.0)
        return Generation(tokens=[int(t) for t in out.tokens], text=str(out.text), finish_reason=str(out.finish_reason),
                          step_logits=logits, prefill_seconds=prefill, decode_seconds=(end - start) - prefill,
                          extra={"runtime": "mtplx.generate_ar", "only_final_logits": True})

    def speculative(self, prompt: Prompt | Sequence[int], draft: Engine, num_draft: int, max_new_tokens: int,
                    max_kv_size: int | None = None) -> Generation:
        raise self._unsupported("run speculative decoding with a separate draft",
                                "mtplx speculates with an MTP head (generate_mtpk), which this model lacks")
