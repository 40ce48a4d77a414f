"""The fault kinds: each is one thing real ports have shipped wrong, injected into a faithful
transformers engine (:class:`oracles.engines.torch.reference.TorchReference`) for the length of a call.

A fault never copies an engine: it edits a weight, a config value or a buffer of the loaded model,
or adds a hook, inside :meth:`Fault.applied`, and undoes it on the way out, so one loaded model
serves the reference and every fault port (:class:`oracles.faults.port.FaultPort`). ``stage`` says
where ``oracles bisect`` must localise it (``"layer 7"``, ``"final norm"``, ``"head"``), or None for a
fault that a cold prefill does not see (a cache trim, decode positions, a cohort's mask): the family
check that catches those names record and position instead.

torch is imported inside the methods (a fault is built only where a torch engine runs).
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any, ClassVar, Iterator, Protocol, Sequence

if TYPE_CHECKING:
    from oracles.engines.types import Prompt, Step


class Faultable(Protocol):
    """What a fault is injected into: an engine running the transformers ``model`` it holds, which the fault
    edits in place for its span. Which engines are such (the torch reference, or a fault port over one: a
    variant, such as the windowed model) is :func:`oracles.faults.port.faultable`'s to say; this is what a
    fault reads of one."""

    model: Any

    @property
    def num_layers(self) -> int: ...
    @property
    def eos_token_ids(self) -> frozenset[int]: ...
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step: ...
    def make_cache(self) -> Any: ...
    def is_trimmable(self, cache: Any) -> bool: ...
    def trim(self, cache: Any, n: int) -> bool: ...
    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step: ...

#: The rotary base transformers and mlx-lm fall back to when a port reads ``rope_theta`` from the
#: wrong key (mlx-lm 0.32's Llama ``ModelArgs`` default; the adapter's own measured case, README).
LIBRARY_ROPE_BASE = 10_000.0


def decoder(engine: Faultable) -> Any:
    """The engine's transformers decoder (``model.get_decoder()``: embed_tokens, layers, norm)."""
    return engine.model.get_decoder()


@contextlib.contextmanager
def swapped(obj: Any, name: str, value: Any) -> Iterator[None]:
    """``obj.name = value`` for the block, the old value put back after (also on error)."""
    old = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, old)


@contextlib.contextmanager
def hooked(handles: list[Any]) -> Iterator[None]:
    """Remove the given torch hook handles when the block ends."""
    try:
        yield
    finally:
        for h in handles:
            h.remove()


class Fault:
    """One fault kind. Subclasses set :attr:`name`, :attr:`title` and override :meth:`applied`
    (and :meth:`trim` for a cache fault)."""

    name: ClassVar[str] = ""
    #: One line: what the port got wrong, as a person porting a model would find it (a class
    #: attribute; a parametrized kind such as the sliding window sets its own per instance).
    title: str = ""
    #: The panel families whose path the fault is on (None: every family). A family off its path
    #: would run the reference's own computation, so its checks are "untouched", not "passed".
    touches: ClassVar[tuple[str, ...] | None] = None

    def why_not(self, engine: Faultable) -> str | None:
        """Why this fault cannot be injected into ``engine`` (no such part), or None."""
        return None

    def stage(self, engine: Faultable) -> str | None:
        """The bisect stage the fault sits in on ``engine``, or None when a cold prefill cannot see it."""
        return None

    def describe(self, engine: Faultable) -> str:
        """The title with where it was injected."""
        where = self.stage(engine)
        return self.title + (f" (injected at {where})" if where else "")

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        """The fault in force on ``engine``'s model for the block."""
        yield

    def trim(self, engine: Faultable, cache: Any, n: int) -> bool:
        """The port's ``trim``: the engine's own unless a fault replaces it."""
        return bool(engine.trim(cache, n))


class Faithful(Fault):
    """Not a fault: the control. The same model with transformers' eager attention instead of SDPA,
    a faithful port that differs from the reference in float32 summation order only (another
    attention kernel, an additive mask), so the checks' tolerances are exercised, not bypassed."""

    name = "faithful"
    title = "faithful port: eager attention instead of SDPA (float32 reordering only)"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        before = engine.model.config._attn_implementation
        engine.model.set_attn_implementation("eager")
        try:
            yield
        finally:
            engine.model.set_attn_implementation(before)


class RopeBaseDefault(Fault):
    name = "rope_base_default"
    title = f"rotary base read from the wrong config key: the library default {LIBRARY_ROPE_BASE:,.0f}"

    def _rotary(self, engine: Faultable) -> Any:
        return getattr(decoder(engine), "rotary_emb", None)

    def _base(self, engine: Faultable) -> float | None:
        params = getattr(engine.model.config, "rope_parameters", None) or {}
        return params.get("rope_theta", getattr(engine.model.config, "rope_theta", None))

    def why_not(self, engine: Faultable) -> str | None:
        if self._rotary(engine) is None or self._base(engine) is None:
            return "the decoder has no rotary embedding with a rope_theta"
        if self._base(engine) == LIBRARY_ROPE_BASE:
            return f"its rotary base is the library default {LIBRARY_ROPE_BASE:g} already"
        if not attention_layers(engine):
            return "no softmax-attention layer reads the rotary embedding"
        return None

    def stage(self, engine: Faultable) -> str | None:
        # the rotary phases are read by the attention layers only (the hybrid's linear layers have none)
        return f"layer {attention_layers(engine)[0]}"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        rotary, base = self._rotary(engine), self._base(engine)
        if rotary is None or base is None:
            raise ValueError(f"{self.name}: {self.why_not(engine)}")
        # inv_freq_i = base^(-2i/d), so the same frequencies under another base are a power of them.
        power = math.log(LIBRARY_ROPE_BASE) / math.log(float(base))
        with swapped(rotary, "inv_freq", rotary.inv_freq.double().pow(power).to(rotary.inv_freq.dtype)):
            yield


def attention_layers(engine: Faultable) -> list[int]:
    """Indices of the decoder layers with a ``self_attn`` (softmax attention) child."""
    return [i for i, layer in enumerate(decoder(engine).layers) if "self_attn" in layer._modules]


class QkInterleaved(Fault):
    """GGUF stores q/k rows of each head interleaved for ggml's rotary; a port loading them into a
    half-split rotary without undoing ``convert_hf_to_gguf.py``'s ``permute`` rotates the wrong pairs.
    Injected into one attention layer (the first at or after a third of the depth)."""

    name = "qk_interleaved"
    title = "q/k rows in GGUF's interleaved rotary layout under a half-split rotary"

    def layer(self, engine: Faultable) -> int | None:
        found = attention_layers(engine)
        return next((i for i in found if i >= engine.num_layers // 3), found[-1] if found else None)

    def why_not(self, engine: Faultable) -> str | None:
        index = self.layer(engine)
        if index is None:
            return "no softmax-attention layer"
        attn = decoder(engine).layers[index].self_attn
        if not (hasattr(attn, "q_proj") and hasattr(attn, "k_proj")):
            # convert_hf_to_gguf.py permutes separate q and k tensors (LlamaModel); a fused qkv_proj
            # (Phi3) is written another way, so this fault has no faithful form there
            return f"no separate q_proj/k_proj in {type(attn).__name__} (fused projection)"
        return None

    def stage(self, engine: Faultable) -> str | None:
        return f"layer {self.layer(engine)}"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        import torch

        attn = decoder(engine).layers[self.layer(engine)].self_attn
        cfg = engine.model.config
        head_dim = attn.head_dim
        rot = 2 * decoder(engine).rotary_emb.inv_freq.numel()  # rotated dims of a head (partial rotary)
        q, k = attn.q_proj.weight, attn.k_proj.weight
        q_block = q.shape[0] // cfg.num_attention_heads  # Qwen3.5 packs query and gate per head
        new_q = gguf_permute(q.detach(), cfg.num_attention_heads, q_block, rot)
        new_k = gguf_permute(k.detach(), cfg.num_key_value_heads, head_dim, rot)
        with swapped(attn.q_proj, "weight", torch.nn.Parameter(new_q, requires_grad=False)), \
                swapped(attn.k_proj, "weight", torch.nn.Parameter(new_k, requires_grad=False)):
            yield


def gguf_permute(weight: Any, heads: int, block: int, rot: int) -> Any:
    """``convert_hf_to_gguf.py``'s ``LlamaModel.permute`` on the first ``rot`` rows of each head's
    ``block`` rows of a ``[heads * block, in]`` projection: within a head, rows ``(j, rot/2 + j)``
    become neighbours ``(2j, 2j + 1)``. Returns a new tensor."""
    w = weight.reshape(heads, block, -1).clone()
    part = w[:, :rot]
    w[:, :rot] = part.reshape(heads, 2, rot // 2, -1).transpose(1, 2).reshape(heads, rot, -1)
    return w.reshape(weight.shape)


class RmsEps(Fault):
    name = "rms_eps"
    title = "RMSNorm epsilon 1e-6 where the config says 1e-5 (or the other way)"

    def _norms(self, engine: Faultable) -> list[tuple[Any, str]]:
        out = []
        for module in engine.model.modules():
            if "RMSNorm" in type(module).__name__:
                out += [(module, a) for a in ("variance_epsilon", "eps") if isinstance(getattr(module, a, None), float)][:1]
        return out

    def why_not(self, engine: Faultable) -> str | None:
        return None if self._norms(engine) else "no RMSNorm module with an epsilon"

    def stage(self, engine: Faultable) -> str | None:
        return "layer 0"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for module, attr in self._norms(engine):
                eps = getattr(module, attr)
                stack.enter_context(swapped(module, attr, 1e-6 if math.isclose(eps, 1e-5, rel_tol=1e-3) else 1e-5))
            yield


class FinalNormSkipped(Fault):
    name = "final_norm_skipped"
    title = "the final norm skipped: the head reads the raw residual stream"

    def stage(self, engine: Faultable) -> str | None:
        return "final norm"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        norm = decoder(engine).norm
        norm.forward = lambda hidden, *a, **k: hidden  # an instance attribute shadows the class's forward
        try:
            yield
        finally:
            del norm.forward


class UntiedHeadRow(Fault):
    """A port that unties the head keeps a copy of the embedding whose stop-token row is the next
    token's row (an off-by-one while adding or moving special tokens)."""

    name = "untied_head_row"
    title = "untied LM head: a copy of the embedding with the stop token's row replaced by the next row"

    def stage(self, engine: Faultable) -> str | None:
        return "head"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        import torch

        head = engine.model.get_output_embeddings()
        row = min(engine.eos_token_ids)
        copy = engine.model.get_input_embeddings().weight.detach().clone()
        copy[row] = copy[row + 1]
        with swapped(head, "weight", torch.nn.Parameter(copy, requires_grad=False)):
            yield


class DecodePositionOffByOne(Fault):
    """After the prefill, every new token is placed one position early (the port takes the cache
    length minus one as the next position). A cold prefill is untouched."""

    name = "decode_position_off_by_one"
    title = "decode positions one early after the prefill (cache length - 1)"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        import torch

        def shift(_module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
            cache = kwargs.get("cache", kwargs.get("past_key_values"))
            past = int(cache.get_seq_length()) if cache is not None else 0
            if past == 0:
                return None
            pos = kwargs.get("position_ids")
            if pos is None:
                x = kwargs.get("input_ids")
                if x is None:
                    x = kwargs["inputs_embeds"]
                pos = (torch.arange(x.shape[1], device=x.device) + past).unsqueeze(0)
            return args, {**kwargs, "position_ids": pos - 1}

        with hooked([decoder(engine).register_forward_pre_hook(shift, with_kwargs=True)]):
            yield


class TrimKeepsStaleRow(Fault):
    """Cutting ``n`` rejected positions drops ``n - 1``: one stale row stays in the cache."""

    name = "trim_keeps_stale_row"
    title = "KV-cache trim keeps one stale row (drops n - 1 of n rejected positions)"
    touches = ("speculative",)  # the only family that trims; chat, d1 and cohort restore snapshots

    def why_not(self, engine: Faultable) -> str | None:
        cache = engine.make_cache()
        engine.forward([1, 2], cache, keep=1)
        return None if engine.is_trimmable(cache) else ("its caches cannot be trimmed (rolled back by "
                                                         "snapshot/restore), so no trim runs")

    def trim(self, engine: Faultable, cache: Any, n: int) -> bool:
        return bool(engine.trim(cache, n - 1)) if n > 0 else bool(engine.trim(cache, 0))


class CohortSeesPadding(Fault):
    """The batched decode's 2-D attention mask is all ones: a left-padded lane attends to its padding."""

    name = "cohort_sees_padding"
    title = "cohort attention mask lets a padded lane see its padding"
    touches = ("cohort",)  # the only family whose forwards carry a 2-D mask with padding in it

    def why_not(self, engine: Faultable) -> str | None:
        from oracles.engines.base import Unsupported

        a, b = engine.make_cache(), engine.make_cache()
        engine.forward([1, 2], a, keep=1)
        engine.forward([1], b, keep=1)
        try:
            engine.decode_cohort([3, 3], [a, b])
        except Unsupported as exc:
            return str(exc)
        return None

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        import torch

        def unmask(_module: Any, args: Any, kwargs: dict[str, Any]) -> Any:
            mask = kwargs.get("attention_mask")
            if isinstance(mask, torch.Tensor) and mask.ndim == 2 and not bool(mask.all()):
                return args, {**kwargs, "attention_mask": torch.ones_like(mask)}
            return None

        with hooked([engine.model.register_forward_pre_hook(unmask, with_kwargs=True)]):
            yield


class Bf16PerLayer(Fault):
    name = "bf16_per_layer"
    title = "activations rounded through bfloat16 after every decoder layer"

    def stage(self, engine: Faultable) -> str | None:
        return "layer 0"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        import torch

        def rounded(_module: Any, _inputs: Any, output: Any) -> Any:
            if isinstance(output, tuple):
                return (output[0].to(torch.bfloat16).to(output[0].dtype), *output[1:])
            return output.to(torch.bfloat16).to(output.dtype)

        # prepend: before the engine's own layer tap, so the stream it records is the rounded one
        handles = [layer.register_forward_hook(rounded, prepend=True) for layer in decoder(engine).layers]
        with hooked(handles):
            yield


class GateUpSwapped(Fault):
    """The MLP's gate and up projections swapped (one tensor-name mapping wrong), in the middle layer."""

    name = "gate_up_swapped"
    title = "MLP gate and up projections swapped"

    def layer(self, engine: Faultable) -> int:
        return engine.num_layers // 2

    def why_not(self, engine: Faultable) -> str | None:
        mlp = getattr(decoder(engine).layers[self.layer(engine)], "mlp", None)
        return None if hasattr(mlp, "gate_proj") and hasattr(mlp, "up_proj") else "no gate_proj/up_proj MLP"

    def stage(self, engine: Faultable) -> str | None:
        return f"layer {self.layer(engine)}"

    @contextlib.contextmanager
    def applied(self, engine: Faultable) -> Iterator[None]:
        mlp = decoder(engine).layers[self.layer(engine)].mlp
        gate, up = mlp.gate_proj.weight, mlp.up_proj.weight
        with swapped(mlp.gate_proj, "weight", up), swapped(mlp.up_proj, "weight", gate):
            yield
