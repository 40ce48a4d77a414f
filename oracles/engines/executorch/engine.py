"""The ExecuTorch port: a pin's ``.pte`` run by ExecuTorch's Python runtime, as optimum-executorch's
text-generation export lays it out.

The program's ``forward(input_ids [1, S] int64, cache_position [S] int64)`` returns every position's
output; its KV cache is a static buffer of ``get_max_seq_len`` rows held as mutable state inside the loaded
method (no cache inputs or outputs). The built-in conversion's output is ``[1, S, V + D]``: logits, then the
final norm's output (:mod:`oracles.pins.executorch_script`); a logits-only program is refused at load, since
the contract returns that hidden state.

The runtime is ExecuTorch's own C++ extension, ``executorch.extension.pybindings._C``, called as the
``executorch.runtime`` module calls it (``_load_program(path, program_verification=...)``, the program's
``load_method``, the method called on its inputs, ``get_attribute``), imported after torch as that module's
``portable_lib`` imports it. ``executorch.runtime`` itself is not imported: its ``portable_lib`` imports
``executorch.exir._warnings`` for the class of one warning, and that loads ExecuTorch's whole exporter
(``executorch.exir``: torch's dynamo and inductor, the edge dialect's operator tables) for none of the
runtime's work: ``from executorch.runtime import Runtime`` took 20.2 s in a fresh process on this 2-core
machine under load, torch and the extension alone 4.4 s, and it adds 8.5 s to a process that already
holds the torch reference. The two paths give the same bits (``tests/unit/test_executorch_port.py``: this
engine's prefill and decode against ``Runtime.get().load_program(...).load_method("forward").execute``).

A cache is one loaded program (:class:`ExecuTorchCache`): every host-memory method of one program shares
its planned arenas, so two caches are two loaded programs, never two methods of one. The cache's rows are
written at ``cache_position`` and every row past the query's own position is masked (transformers'
static-cache causal mask, exported with the graph), so a row past the valid length is never read before a
later forward overwrites it: :meth:`ExecuTorchPort.trim` only lowers the valid length
(``tests/unit/test_executorch_port.py`` holds a trimmed and re-run cache bitwise equal to a fresh one). A
snapshot reads the method's named mutable buffers (``get_attribute``: a view of the live buffer) and a
restore writes them into a freshly loaded program; a program exported without buffer names cannot be
snapshot (Unsupported, naming why).

Greedy generation is this adapter's loop over ``forward`` (argmax of each step's logits, lowest id on ties);
the tokenizer is the pin's own, copied beside the program at conversion and read with transformers'
``AutoTokenizer``. executorch's extension, torch and transformers are imported when the engine is built.
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
from oracles.engines.executorch.artifact import PteFacts, check_pte, quantization_of, read_pte
from oracles.errors import PinError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin

#: ExecuTorch's Python runtime: the C++ extension ``executorch.runtime`` wraps (module docstring).
RUNTIME = "executorch.extension.pybindings._C"


@dataclass
class ExecuTorchCache:
    """A live cache: ``program`` (one loaded ``ExecuTorchProgram``, held so its method's memory lives), its
    ``method`` (its ``forward``, an ``ExecuTorchMethod`` whose mutable buffers are the KV cache), ``length``
    the valid rows."""

    program: Any
    method: Any
    length: int = 0


@dataclass(frozen=True)
class ExecuTorchSnapshot:
    """A copy of a cache: each named mutable buffer as a numpy array, and the valid rows."""

    buffers: dict[str, np.ndarray]
    length: int


def pte_of(pin: "Pin") -> str | None:
    """The pin's ``.pte`` file (relative to its snapshot folder), or None when it lists none."""
    return artifact_of(pin, ".pte")


class ExecuTorchPort(ArtifactPort):
    """A pin's ``.pte`` in ExecuTorch's Python runtime (the XNNPACK delegate its export names; the runtime's
    thread pool set to ``threads`` when given).

    Args:
        root: the verified snapshot folder (the ``.pte``, config.json, generation_config.json, tokenizer).
        pin: the loaded pin; threads: the runtime's thread pool size (0: the runtime's default).

    Raises:
        PinError: a file that is not a whole ExecuTorch program, a program without a ``forward`` of the
            export's form, a vocabulary, width or layer count other than config.json's, or a logits-only
            output; one line naming the file and the field.
    """

    id = "executorch"
    suffix, runtime_name, convert = ".pte", "ExecuTorch", "convert one: an executorch-convert:PIN pin"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if missing := [m for m in ("executorch", "torch") if importlib.util.find_spec(m) is None]:
            return f"{missing[0]} is not installed (pip install --no-deps executorch==1.5.1: the 'executorch' extra)"
        return None

    def __init__(self, root: Path, pin: "Pin", threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        config = self.open_artifact()
        self.facts: PteFacts = read_pte(self.path)
        self.vocab_size, hidden = check_pte(self.facts, config, self.tokenizer_size)
        if not hidden:
            raise PinError(f"{self.path}: field 'forward.outputs[0]' is logits [1, S, {self.vocab_size}] only; the engine "
                           "contract returns the final norm's hidden state too: convert with an executorch-convert:PIN "
                           "pin (optimum-executorch's export, its head also returning the hidden state)")
        self.hidden_size = hidden
        self.num_layers = int(self.facts.constants.get("get_n_layers") or config.get("num_hidden_layers", 0))
        self.rows = int(self.facts.constants["get_max_seq_len"])
        self.chunk = int(self.facts.inputs[0].sizes[1])  # the dynamic input's upper bound (rows - 1)
        positions = int(config.get("max_position_embeddings", 0) or 0)
        self.max_context = min(self.rows, positions) if positions else self.rows
        self.runtime = load_runtime(threads)
        if missing := [b for b in self.facts.backends if not self.runtime._is_available(b)]:
            raise PinError(f"{self.path}: field 'delegates' names back end {missing[0]!r}, which this runtime lacks "
                           f"(executorch {dist_version('executorch')}: {self.runtime._get_registered_backend_names()})")

    def describe(self) -> dict[str, Any]:
        """Runtime, version, threads, back ends, file and sha256, the program's constants and shapes, the
        cache rows, and the converter's recipe from the pin (tool, version, arguments, additions)."""
        recipe = dict(self.pin_file.recipe or {})
        return {**super().describe(), "runtime": RUNTIME, "executorch": dist_version("executorch"),
                "dtype": "float32", "device": "cpu", "threads": self.threads or None,
                "threadpool_threads": int(self.runtime._threadpool_get_thread_count()),
                "backends": list(self.facts.backends), "file": self.path.name,
                "sha256": self.pin_file.files[self.path.name].sha256, "constants": dict(self.facts.constants),
                "forward": {"inputs": [list(t.sizes) for t in self.facts.inputs],
                            "output": list(self.facts.outputs[0].sizes), "layout": "logits then hidden"},
                "kv_rows": self.rows, "context": self.max_context,
                "named_buffers": [t.name for t in self.facts.buffers],
                "xnnpack_datatypes": dict(self.facts.xnnpack_datatypes), "quantization": quantization_of(self.facts),
                "converter": {k: recipe.get(k) for k in ("tool", "version", "arguments", "additions") if k in recipe}}

    # -- cache --------------------------------------------------------------------------------
    def make_cache(self) -> ExecuTorchCache:
        """A fresh cache: the program loaded anew (its own arenas, so its own KV buffers), verified as
        ``executorch.runtime``'s ``load_program(path, verification=Verification.Minimal)`` verifies it."""
        program = self.runtime._load_program(str(self.path), program_verification=self.runtime.Verification.Minimal)
        return ExecuTorchCache(program, program.load_method("forward"))

    def _buffers(self, cache: ExecuTorchCache) -> dict[str, Any]:
        """The live cache's named mutable buffers (torch tensors viewing the method's memory).

        Raises:
            Unsupported: the program names no mutable buffer.
        """
        if not self.facts.buffers:
            raise self._unsupported("snapshot a cache", f"{self.path.name} names no mutable buffer (exported without "
                                    "emit_mutable_buffer_names), so the runtime cannot read its KV cache")
        return {str(t.name): cache.method.get_attribute(str(t.name)) for t in self.facts.buffers}

    def snapshot(self, cache: Any) -> ExecuTorchSnapshot:
        return ExecuTorchSnapshot({k: v.numpy().copy() for k, v in self._buffers(cache).items()}, cache.length)

    def restore(self, snapshot: Any) -> ExecuTorchCache:
        import torch

        cache = self.make_cache()
        for name, live in self._buffers(cache).items():
            live.copy_(torch.from_numpy(snapshot.buffers[name]))
        cache.length = snapshot.length
        return cache

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        """``layers.<i>.keys`` / ``values`` float32 ``[1, H, T, Dh]``: each layer's valid rows of
        ``key_cache_<i>`` / ``value_cache_<i>`` (transformers' static cache layout)."""
        if not isinstance(snapshot, ExecuTorchSnapshot):
            raise TypeError(f"snapshot_buffers: {type(snapshot).__name__} is not an ExecuTorchSnapshot")
        out = {}
        for i in range(self.num_layers):
            for kind, field in (("key", "keys"), ("value", "values")):
                out[f"layers.{i}.{field}"] = np.ascontiguousarray(
                    snapshot.buffers[f"{kind}_cache_{i}"][:, :, : snapshot.length], np.float32)
        return out

    def cache_capacity(self, cache: Any) -> int:
        """``get_max_seq_len``: the rows the program's static cache was exported with (never grows)."""
        return self.rows

    def resident_bytes(self, obj: Any) -> int:
        if isinstance(obj, ExecuTorchSnapshot):
            return int(sum(a.nbytes for a in obj.buffers.values()))
        return int(sum(t.numel() * t.element_size() for t in self._buffers(obj).values()))

    # -- forward ------------------------------------------------------------------------------
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """Logits ``[T, V]`` and the final norm's hidden ``[T, D]``, float32, for every position of
        ``prompt`` after what ``cache`` holds (the cache gains them; ``cache=None``: a cold prefill), in
        calls of at most the forward's dynamic bound (``get_max_seq_len - 1``) tokens.

        Raises:
            ValueError: an empty prompt, or more positions than the cache's rows (:func:`check_forward_length`).
            Unsupported: ``layers=True`` (the program outputs no per-layer stream).
        """
        self.refuse_layers(layers)
        ids = self.text_ids(prompt)
        cache = self.make_cache() if cache is None else cache
        check_forward_length(self, cache.length, len(ids))
        rows = []
        for start in range(0, len(ids), self.chunk):
            rows.append(self._run(ids[start:start + self.chunk], cache))
        out = np.concatenate(rows)
        if keep:
            out = out[-keep:]
        return Step(logits=np.ascontiguousarray(out[:, : self.vocab_size], np.float32),
                    hidden=np.ascontiguousarray(out[:, self.vocab_size:], np.float32))

    def _run(self, ids: list[int], cache: ExecuTorchCache) -> np.ndarray:
        """One ``forward`` call on ``ids`` at ``cache_position`` ``cache.length`` onwards; the ``[n, V + D]`` rows."""
        import torch

        positions = torch.arange(cache.length, cache.length + len(ids), dtype=torch.long)
        out = cache.method([torch.tensor([ids], dtype=torch.long), positions])[0]
        cache.length += len(ids)
        return np.array(out[0].numpy(), np.float32)

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """Greedy generation: the prompt's forward, then one ``forward`` call per token, argmax of each
        step's logits (lowest id on ties); stops after the first stop token (kept) or ``max_new_tokens``.

        Raises:
            Unsupported: a sampled ``sampler``, ``max_kv_size`` (the cache is the program's fixed rows).
            ContextTooShort: prompt and new tokens pass the cache's rows.
        """
        if not sampler.greedy:
            raise self._unsupported("sample (temperature > 0)", "this adapter's loop over forward is greedy")
        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)", f"{self.path.name} has a fixed {self.rows}-row cache")
        ids = self.text_ids(prompt)
        if len(ids) + max_new_tokens - 1 > self.max_context:
            raise ContextTooShort(self.id, f"generate {max_new_tokens} tokens after {len(ids)}",
                                  f"the program's KV cache holds {self.max_context} rows")
        return self.greedy_over_forward(ids, max_new_tokens, "greedy over forward")


def load_runtime(threads: int) -> Any:
    """ExecuTorch's runtime extension module (:data:`RUNTIME`, imported after torch, whose libraries it links
    against: module docstring), its thread pool reset to ``threads`` when given (the XNNPACK delegate runs
    on it)."""
    import torch  # noqa: F401 - loads libtorch, which the extension links against
    from executorch.extension.pybindings import _C as runtime
    if threads and int(runtime._threadpool_get_thread_count()) != threads:
        runtime._unsafe_reset_threadpool(threads)
    return runtime


