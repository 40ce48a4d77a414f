"""The ONNX Runtime port: a pin's ``.onnx`` in an ``onnxruntime.InferenceSession`` on the CPU provider.

The artifact is a decoder-with-past export (:mod:`oracles.engines.onnx.artifact` says its tensors). A
forward feeds ``input_ids`` and the cache's ``past_key_values.<i>.key / .value`` (zero rows for a cold
prefill) and keeps the ``present.<i>.*`` outputs as the new cache, as ONNX Runtime's own decoding
loops (optimum, transformers.js) feed ``present`` back. The cache is those arrays (:class:`OnnxCache`,
``[1, H_kv, T, Dh]`` float32 each), so a snapshot is a copy, a restore a copy back, and a trim a slice.

The session is built as a user builds one: ``SessionOptions`` with ONNX Runtime's defaults but for the
intra-op thread count (``threads``; 0 keeps the runtime's own), ``providers=["CPUExecutionProvider"]``.
The graph optimisation level is ``ORT_ENABLE_ALL``, the runtime's default; it changes the numbers
(fused kernels round differently: ``ORT_DISABLE_ALL`` and ``ORT_ENABLE_BASIC`` differ from it by 1.0e-4
max |Δlogit| on SmolLM2's float32 export over a 46-token prefill, 3.6e-7 on the draft twin's over 40),
so :meth:`OnnxRuntimePort.describe` records it with the threads and providers (1 and 2 intra-op threads
gave the same bits on that prefill).

Greedy generation is this adapter's loop (ONNX Runtime has no generation API of its own; onnxruntime-genai
is another package with its own model format): argmax of each step's logits, lowest id on ties. The
tokenizer is the pin's own (copied beside the ``.onnx`` at export), loaded with transformers'
``AutoTokenizer``. A batched cohort decode needs per-lane positions and masks the export does not take,
so :meth:`~oracles.engines.base.Engine.decode_cohort` stays ``Unsupported``.

onnxruntime, onnx and transformers are imported when the engine is built, never at module import.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from oracles.engines.artifact_port import ArtifactPort, artifact_of, dist_version
from oracles.engines.base import ContextTooShort, Generation, Prompt, Sampler, Step, check_forward_length
from oracles.engines.onnx.artifact import check_external, check_model, read_graph, read_layout
from oracles.errors import PinError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

#: The session's graph optimisation level (ONNX Runtime's default; it changes the numbers: module docstring).
OPTIMIZATION = "ORT_ENABLE_ALL"
PROVIDERS = ("CPUExecutionProvider",)


@dataclass
class OnnxCache:
    """The KV cache as the graph returns it: per layer ``(keys, values)``, each float32 ``[1, H_kv, T, Dh]``."""

    layers: list[tuple[np.ndarray, np.ndarray]]

    @property
    def length(self) -> int:
        return int(self.layers[0][0].shape[2]) if self.layers else 0


def onnx_of(pin: "Pin") -> str | None:
    """The pin's ``.onnx`` file (relative to its snapshot folder), or None when it lists none."""
    return artifact_of(pin, ".onnx")


class OnnxRuntimePort(ArtifactPort):
    """A pin's ``.onnx`` in ONNX Runtime's ``InferenceSession`` (CPU provider; module docstring).

    Args:
        root: the verified snapshot folder (the ``.onnx``, its external-data file, config.json,
            generation_config.json and the tokenizer files).
        pin: the loaded pin; threads: the session's intra-op thread count (0: the runtime's default).

    Raises:
        PinError: a file that is not a loadable ``.onnx`` (truncated, an external-data file missing or
            short), inputs this engine cannot feed, outputs without ``logits`` / ``hidden`` / ``present``,
            or sizes that differ from config.json or the tokenizer; one line naming the file and the field.
    """

    id = "onnxruntime"
    suffix, runtime_name, convert = ".onnx", "ONNX Runtime", "export one: an onnx-export:PIN pin"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        for module in ("onnxruntime", "onnx"):
            if importlib.util.find_spec(module) is None:
                return f"{module} is not installed (pip install 'pytest-oracles[onnx]')"
        return None

    def __init__(self, root: Path, pin: "Pin", threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        config = self.open_artifact()
        self.graph = read_graph(self.path)
        self.external = check_external(self.path, self.graph)
        self.layout = layout = read_layout(self.path, self.graph.inputs, self.graph.outputs)
        self.session = load_session(self.path, threads)
        check_model(self.path, layout, config, self.tokenizer_size)
        self.vocab_size, self.hidden_size, self.num_layers = layout.vocab, layout.hidden_size, layout.num_layers
        self.max_context = int(config.get("max_position_embeddings", 0) or 0)
        self._outputs = ["logits", "hidden", *(n for pair in layout.present for n in pair)]

    def describe(self) -> dict[str, Any]:
        """Runtime, version, providers, threads, graph optimisation level, file and its external data,
        opset and producer, the graph's inputs and outputs, and the exporter's recipe from the pin."""
        options, recipe = self.session.get_session_options(), dict(self.pin_file.recipe or {})
        return {**super().describe(), "runtime": "onnxruntime", "onnxruntime": dist_version("onnxruntime"),
                "dtype": self.pin_file.precision.compute, "device": "cpu", "providers": self.session.get_providers(),
                "threads": {"intra_op": int(options.intra_op_num_threads), "inter_op": int(options.inter_op_num_threads)},
                "graph_optimization_level": OPTIMIZATION, "execution_mode": str(options.execution_mode).split(".")[-1],
                "file": self.path.name, "sha256": self.pin_file.files[self.path.name].sha256,
                "external_data": self.external, "opset": self.graph.opset, "producer": self.graph.producer,
                "inputs": {io.name: list(io.shape) for io in self.graph.inputs},
                "outputs": {io.name: list(io.shape) for io in self.graph.outputs}, "context": self.max_context,
                "exporter": {k: recipe.get(k) for k in ("tool", "version", "arguments", "packages") if k in recipe}}

    # -- cache --------------------------------------------------------------------------------
    def make_cache(self) -> OnnxCache:
        """An empty cache: zero rows per layer, ``[1, H_kv, 0, Dh]`` float32 (what a cold prefill feeds)."""
        shape = (1, self.layout.kv_heads, 0, self.layout.head_dim)
        return OnnxCache([(np.zeros(shape, np.float32), np.zeros(shape, np.float32)) for _ in range(self.num_layers)])

    def trim(self, cache: Any, n: int) -> bool:
        """Keep the first rows: the cache is the rows the graph returned."""
        self.check_trim(cache, n)
        keep = cache.length - n
        cache.layers = [(k[:, :, :keep].copy(), v[:, :, :keep].copy()) for k, v in cache.layers]
        return True

    def snapshot(self, cache: Any) -> OnnxCache:
        return OnnxCache([(k.copy(), v.copy()) for k, v in cache.layers])

    def restore(self, snapshot: Any) -> OnnxCache:
        return self.snapshot(snapshot)

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        """``layers.<i>.keys`` / ``values`` float32 ``[1, H_kv, T, Dh]`` (the reference's layout), copies."""
        return {f"layers.{i}.{field}": np.array(a, dtype="<f4", copy=True)
                for i, pair in enumerate(snapshot.layers) for field, a in zip(("keys", "values"), pair)}

    def cache_capacity(self, cache: Any) -> int:
        """The cache's length: every forward returns new ``present`` arrays (no spare rows)."""
        return cache.length

    def resident_bytes(self, obj: Any) -> int:
        return int(sum(k.nbytes + v.nbytes for k, v in obj.layers))

    # -- forward ------------------------------------------------------------------------------
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """Logits ``[T, V]`` and the final norm's hidden ``[T, D]``, float32, for every position of
        ``prompt`` after what ``cache`` holds (the cache gains them; ``cache=None``: a cold prefill), in
        one session run.

        Raises:
            ValueError: an empty prompt, or more positions than the context (:func:`check_forward_length`).
            Unsupported: ``layers=True`` (the graph outputs no per-layer stream).
        """
        self.refuse_layers(layers)
        ids = self.text_ids(prompt)
        cache = self.make_cache() if cache is None else cache
        check_forward_length(self, cache.length, len(ids))
        out = self.session.run(self._outputs, self._feed(ids, cache))
        logits, hidden = out[0][0], out[1][0]
        cache.layers = [(out[2 + 2 * i], out[3 + 2 * i]) for i in range(self.num_layers)]
        if keep:
            logits, hidden = logits[-keep:], hidden[-keep:]
        return Step(logits=np.ascontiguousarray(logits, np.float32), hidden=np.ascontiguousarray(hidden, np.float32))

    def _feed(self, ids: list[int], cache: OnnxCache) -> dict[str, np.ndarray]:
        """The session's inputs: ``ids`` at positions ``cache.length`` onwards after the cache's rows."""
        layout, start = self.layout, cache.length
        feed = {"input_ids": np.asarray([ids], dtype=layout.ids_dtype)}
        for (key, value), (k, v) in zip(layout.past, cache.layers):
            feed[key], feed[value] = k, v
        if layout.attention_mask:
            feed["attention_mask"] = np.ones((1, start + len(ids)), np.int64)
        if layout.position_ids:
            feed["position_ids"] = np.arange(start, start + len(ids), dtype=np.int64)[None]
        return feed

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """Greedy generation through the graph: the prompt's forward, then one session run per token
        with ``present`` fed back, argmax of each step's logits (lowest id on ties); stops after the
        first stop token (kept) or ``max_new_tokens``.

        Raises:
            Unsupported: a sampled ``sampler`` or ``max_kv_size`` (this loop keeps every row).
            ContextTooShort: prompt and new tokens pass the context.
        """
        if not sampler.greedy:
            raise self._unsupported("sample (temperature > 0)", "this adapter's loop over the session is greedy")
        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)", "the graph's cache keeps every row")
        ids = self.text_ids(prompt)
        if self.max_context and len(ids) + max_new_tokens - 1 > self.max_context:
            raise ContextTooShort(self.id, f"generate {max_new_tokens} tokens after {len(ids)}",
                                  f"the model's context is {self.max_context} positions")
        return self.greedy_over_forward(ids, max_new_tokens, "greedy over session runs, present fed back")


def load_session(path: Path, threads: int) -> Any:
    """An ``onnxruntime.InferenceSession`` on ``path``: the CPU provider, :data:`OPTIMIZATION`, and
    ``threads`` intra-op threads (0: the runtime's default).

    Raises:
        PinError: the runtime refuses the file, with its own message's first line.
    """
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, OPTIMIZATION)
    if threads:
        options.intra_op_num_threads = threads
    try:
        return ort.InferenceSession(str(path), options, providers=list(PROVIDERS))
    except Exception as exc:  # noqa: BLE001 - the runtime's own error types (InvalidProtobuf, Fail, ...) named in one line
        raise PinError(f"{path}: ONNX Runtime cannot load it: {type(exc).__name__}: "
                       f"{(str(exc).splitlines() or [''])[0]}") from None


