"""Cache-continuation decode (mtplx): greedy through the KV cache from the prefill to a stop token,
the cached logits held against full recomputes of the prefix; and the bad-input checks of forward.

Runs on the reference and on every port; each decode runs once per session (``runs``).
"""

from __future__ import annotations

import pytest

from oracles.checks.cache import cache_failure, cache_figures
from oracles.checks.exact import diff
from oracles.checks.fingerprint import as_f4, row_fingerprints
from oracles.engines.base import Engine
from oracles.families.execution import runs as ex
from oracles.families.execution.decode import recompute_steps
from oracles.families.execution.prompts import PromptRecord, load_prompts
from oracles.families.port_scope import EXECUTION_SAMPLE_TOKENS, PortScope
from oracles.plugin.fixtures import Runs
from oracles.receipts.table import Receipt
from oracles.receipts.units import attach_unit

pytestmark = [pytest.mark.mtplx, pytest.mark.slow]



@pytest.fixture(params=ex.GENERATION, ids=[r.id for r in ex.GENERATION])
def record(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    """The generation record bound to this test's pin (its tokenizer's ids)."""
    return request.param.bind(pin)


def test_decode_to_stop(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """Greedy decode through the cache reaches a stop token within the cap (the cap is recorded). On
    an untrained pin the figures are recorded and the stop check skips, naming the pin's declaration."""
    run = ex.decode(runs, engine, record)
    attach_unit(receipt, "decode", request_sha256=record.sha256, pin=engine.pin, engine=engine.id, record=record.id,
                ids=record.ids, tokens=run.tokens, argmax=run.step_logits.argmax(-1),
                arrays={"step_logits": run.step_logits})  # [S, V]: every step test_decode_vs_reference holds
    receipt.update(text=engine.decode(run.tokens), finish_reason=run.finish_reason, max_new_tokens=run.max_new_tokens,
                   row_sha256=row_fingerprints(run.step_logits, f"{record.id}: decode step logits"),
                   prefill_seconds=round(run.prefill_seconds, 4), decode_seconds=round(run.decode_seconds, 4),
                   decode_tokens_per_second=round(run.decode_tokens_per_second, 3))
    assert run.tokens, f"{record.id}: no token decoded"
    if why := engine.pin_file.untrained_reason("ending a generation with a stop token"):
        pytest.skip(why)
    assert run.finish_reason == "stop", (f"{record.id}: no stop token {sorted(engine.eos_token_ids)} within "
                                         f"max_new_tokens={run.max_new_tokens}; last tokens {run.tokens[-8:]}")


def test_decode_argmax_chain(runs: Runs, engine: Engine, record: PromptRecord) -> None:
    """Each decoded token is the argmax of the cached row it was chosen from (the loop fed what it chose)."""
    run = ex.decode(runs, engine, record)
    chosen = [int(i) for i in run.step_logits.argmax(-1)]
    assert len(chosen) == len(run.tokens), f"{record.id}: {len(chosen)} logit rows for {len(run.tokens)} tokens"
    first = next((i for i, (a, b) in enumerate(zip(chosen, run.tokens)) if a != b), None)
    assert first is None, f"{record.id}: step {first}: token {run.tokens[first]} but the row's argmax is {chosen[first]}"


def test_decode_matches_recompute(runs: Runs, engine: Engine, record: PromptRecord, receipt: Receipt) -> None:
    """Cached logits agree with a cold recompute of the whole prefix at the first, last and every k-th
    step, within :mod:`oracles.checks.cache`'s bounds (max |Δ|, NMSE, argmax) of the engine's tolerance."""
    run = ex.decode(runs, engine, record)
    tolerance = engine.tolerance()
    steps = recompute_steps(len(run.tokens), run.every)
    assert sorted(run.recomputed) == steps, f"{record.id}: recomputed steps {sorted(run.recomputed)} != {steps}"
    figures, failures = [], []
    for s in steps:
        cached, cold = as_f4(run.step_logits[s], f"{record.id} step {s}: cached row"), as_f4(run.recomputed[s])
        figures.append({"step": s, "prefix_tokens": len(run.prompt) + s, **cache_figures(cached, cold)})
        if msg := cache_failure(f"step {s} (prefix {len(run.prompt) + s} tokens)", cached, cold, tolerance=tolerance):
            failures.append(msg)
    receipt.update(request_sha256=record.sha256, every=run.every, compared_steps=steps, steps=figures,
                   atol=tolerance.cache_atol, nmse_max=tolerance.cache_nmse, recompute_seconds=round(run.recompute_seconds, 4),
                   max_abs=max(f["max_abs"] for f in figures), nmse=max(f["nmse"] for f in figures))
    assert not failures, f"{record.id}: {len(failures)} of {len(steps)} compared steps fail: " + "; ".join(failures)


def test_decode_first_step_equals_prefill(runs: Runs, engine: Engine, record: PromptRecord) -> None:
    """Step 0's row comes from a cold prefill with the cache on; the recompute is the same forward with
    the cache off: same rows through the same kernels, so the bits must be equal."""
    run = ex.decode(runs, engine, record)
    d = diff(run.step_logits[0], run.recomputed[0])
    assert d.equal, d.describe(f"{record.id}: prefill row with cache vs without", "differ in bits")


def test_prompt_longer_than_context(engine: Engine, receipt: Receipt) -> None:
    """A prompt longer than the context is refused before any compute, naming both lengths."""
    too_long = [1] * (engine.max_context + 1)
    refusal = rf"{engine.max_context + 1} new tokens exceed the context of {engine.max_context}"
    with pytest.raises(ValueError, match=refusal) as err:
        engine.forward(too_long, engine.make_cache(), keep=1)
    receipt.update(max_context=engine.max_context, message=str(err.value))


def test_prompt_longer_than_context_names_record(engine: Engine) -> None:
    """The decode oracle on such a record is refused (its tests skip on such a pin) naming the record and
    the position the context ends at."""
    record = PromptRecord("over-context", ({"role": "user", "content": "x"},), "0" * 64,
                          tuple([1] * (engine.max_context + 1)), engine.pin)
    with pytest.raises(ValueError) as err:
        ex.greedy_decode_checked(engine, record)
    assert "over-context" in str(err.value) and f"position {engine.max_context}" in str(err.value), str(err.value)


@pytest.fixture(params=load_prompts(), ids=[p.id for p in load_prompts()])
def prompt(request: pytest.FixtureRequest, pin: str) -> PromptRecord:
    """A prompt record bound to this test's pin."""
    return request.param.bind(pin)


def test_prefill_comparable(runs: Runs, engine: Engine, prompt: PromptRecord, receipt: Receipt,
                            pytestconfig: pytest.Config) -> None:
    """The prompt records' prefill (test_forward's run, same key) as a comparable record for
    ``oracles compare``: ids, per-row argmax and fingerprints, every position's logits ``[T, V]`` in the npz.

    A prompt outside ``--port-records`` attaches no unit: no port is held on it in this scope, and its
    rows are the npz's largest cost (SmolLM2's 1,294-position "readme": 254 MB of float32 logits)."""
    step = ex.prefill(runs, engine, prompt)
    argmax = [int(i) for i in step.logits.argmax(-1)]
    scope = PortScope.parse(pytestconfig.getoption("port_records"))
    if scope.selects(len(prompt.ids), EXECUTION_SAMPLE_TOKENS):
        attach_unit(receipt, "prefill", request_sha256=prompt.sha256, pin=engine.pin, engine=engine.id,
                    record=prompt.id, ids=prompt.ids, argmax=argmax,
                    arrays={"logits": step.logits})  # [T, V], as test_prefill_vs_reference holds
    else:
        receipt.update(unit_not_attached=f"{prompt.id}: {len(prompt.ids)} positions, outside --port-records "
                                         f"{pytestconfig.getoption('port_records')}: no port is held on it in this scope "
                                         f"(pass --port-records all to attach its [T, V] logits)")
    receipt.update(row_sha256=row_fingerprints(step.logits, f"{prompt.id}: prefill logits"))
    assert len(argmax) == len(prompt.ids), f"{prompt.id}: {len(argmax)} logit rows for {len(prompt.ids)} ids"
