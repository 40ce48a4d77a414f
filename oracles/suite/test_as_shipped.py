"""Port (port): the artifact as its user loads it, with no translation, against transformers' reading.

The MLX port passes mlx-lm a ``model_config`` override where mlx-lm reads a transformers config
otherwise than transformers does (the port's ``translations``: each field, both readings, how it was
applied), so the other port checks judge the port's code, not a config misreading. A user runs
``mlx_lm.load(path)`` without it. This check loads the artifact exactly so, compares every field
mlx-lm's ``ModelArgs`` reads against transformers' reading of the reference's config
(:func:`oracles.engines.mlx.config.reading_differences`: the RoPE base is mlx-lm's
``model.args.rope_theta`` against ``config.rope_parameters["rope_theta"]``), and fails naming each
field and both values, with the untranslated model's logits on "ping" against the reference.

Where it fails on a built-in pin for a known mlx-lm defect, the failure is a strict xfail quoting the
figure measured there (:data:`KNOWN_AS_SHIPPED`, by pin and mlx-lm version): a fixed mlx-lm passes it
and so fails the xfail, and another version or pin is judged afresh.
"""

from __future__ import annotations

from typing import Any

import pytest

from oracles.checks.port import held_figures
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt

pytestmark = [pytest.mark.port, pytest.mark.slow]

#: The record whose untranslated logits are reported (the shortest prompt record).
PING: PromptRecord = next(p for p in load_prompts() if p.id == "ping")

_ROPE = ("rope_theta: mlx-lm reads 10000, transformers reads 100000.0 (rope_parameters.rope_theta): mlx-lm "
         "0.32.2's Llama ModelArgs reads only a top-level rope_theta, and transformers 5 writes rope_parameters")
#: Measured as-shipped failures, (port pin, mlx-lm version) -> the figure (field, both values, the
#: untranslated load's max |Δlogit| and argmax agreement on "ping" against the reference on the same weights).
KNOWN_AS_SHIPPED: dict[tuple[str, str], str] = {
    ("smollm2-135m-instruct", "0.32.2"): f"{_ROPE}; 'ping' (31 tokens): max |Δlogit| 9.96, argmax agreement 83.9 %",
    # the mlx-lm conversions carry the source's rope_parameters unchanged (measured by a script on the same
    # folders: the port on the artifact untranslated, the torch reference on the named pin, "ping")
    ("smollm2-mlx-q4", "0.32.2"): f"{_ROPE}; 'ping' (31 tokens) against smollm2-mlx-q4-dequant: max |Δlogit| 11.1, "
                                  "argmax agreement 90.3 %",
    ("smollm2-mlx-q8", "0.32.2"): f"{_ROPE}; 'ping' (31 tokens) against smollm2-135m-instruct: max |Δlogit| 9.09, "
                                  "argmax agreement 87.1 %",
    ("smollm2-mlx-bf16", "0.32.2"): f"{_ROPE}; 'ping' (31 tokens) against smollm2-135m-instruct: max |Δlogit| 10.3, "
                                    "argmax agreement 83.9 %",
    ("smollm2-hybrid-twin", "0.32.2"): (
        "model_type: mlx-lm 0.32.2 refuses 'qwen3_5_text' ('Model type qwen3_5_text not supported.'), transformers "
        "reads it as the text-only Qwen3.5; the port loads it as mlx-lm's qwen3_5 with full_attention_interval "
        "from layer_types, a user's mlx_lm.load(path) cannot load the folder at all"),
}


def transformers_reading(reference: Engine) -> dict[str, Any]:
    """transformers' reading of the reference's config: its loaded model's ``config.to_dict()``, else
    ``AutoConfig`` of its snapshot folder."""
    config = getattr(getattr(reference, "model", None), "config", None)
    if config is None:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(str(reference.root))
    return dict(config.to_dict())


def test_config_as_shipped(runs: Runs, reference: Engine, port: Engine, pin: str, request: pytest.FixtureRequest,
                           receipt: Receipt) -> None:
    """``mlx_lm.load(path)`` reads every config field as transformers does; else fail naming each field,
    both values, and the untranslated load's logit figure on "ping" against the reference."""
    from oracles.engines.mlx.config import load_as_shipped, reading_differences
    from oracles.engines.mlx.lm import MlxPort

    if not isinstance(port, MlxPort):
        pytest.skip(f"port {port.id} ({type(port).__name__}) is not loaded by mlx-lm: the config readings compared "
                    "here are mlx-lm's, and a transformers port reads the config as the reference does")
    version = str(port.mlx_lm_version)
    known = KNOWN_AS_SHIPPED.get((port.pin, version))
    if known is not None:
        request.applymarker(pytest.mark.xfail(strict=True, reason=f"known mlx-lm {version} defect on {port.pin}: {known}"))
    shipped = runs(("as-shipped", port.pin), lambda: load_as_shipped(port.root))
    diffs = reading_differences(shipped.reads, transformers_reading(reference))
    receipt.update(kind="as-shipped", port=port.id, reference=reference.id, mlx_lm=version,
                   translations=port.translations, differences=[d.line() for d in diffs])
    figure = "mlx-lm refused the folder: no logits"
    if shipped.model is not None:
        record = PING.bind(pin)
        what = f"{record.id}: untranslated mlx_lm.load({port.pin}) vs {reference.id}"
        fig = held_figures(what, ex.prefill(runs, reference, record).logits, shipped.logits(record.ids))
        receipt.update(request_sha256=record.sha256, max_abs=fig["max_abs"], argmax_agreement=fig["argmax_agreement"],
                       kl_max=fig["kl_max"], rows=fig["rows"])
        figure = (f"'{record.id}' ({fig['rows']} tokens): max |Δlogit| {fig['max_abs']:.3g}, argmax agreement "
                  f"{100 * fig['argmax_agreement']:.1f} %")
    assert not diffs, (f"{port.pin}: mlx_lm.load(path) as shipped (mlx-lm {version}) reads "
                       + "; ".join(d.line() for d in diffs) + f"; {figure} against {reference.id} on {pin}")
