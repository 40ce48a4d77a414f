"""The LiteRT port: a pin's ``.tflite`` run by ai-edge-litert's interpreter (XNNPACK on the CPU).

The artifact is litert-torch's generative export or a plain graph (:mod:`oracles.engines.litert.artifact`
says their signatures). On the generative export a forward runs the ``prefill_<T>`` signature on chunks
of ``T`` tokens, each padded to ``T`` when shorter, and single tokens through ``decode``; the KV cache
is the signatures' own external cache buffers, held here as numpy arrays with the number of valid rows
(:class:`LiteRtCache`). A plain graph serves a cold forward of up to its ``T`` positions (padded the
same way) and nothing that needs a cache: :meth:`LiteRtPort.make_cache` raises Unsupported, so cache
continuation, the d1 tree path, generation and the cohort skip naming it, while prefill records and the
d1 row path run.

Why the padding is harmless: the exported prefill writes its ``T`` rows into the cache at
``input_pos[0]`` onwards and masks each row causally by its position, so a valid row never reads a pad
row, and the pad rows it writes (past the valid length) are overwritten by the next forward before
any valid row can read them. A plain graph is the causal model itself on ``T`` ids, so its pad rows
come after every valid row and no valid row reads them. The slow tests hold it: the valid rows match the reference and are
bitwise the same under two different pad tokens. A prefill chunk is run only where all its ``T`` rows
fit the cache (the exported ``dynamic_update_slice`` would clamp its start otherwise); the tokens
past that point go through ``decode`` one by one.

Greedy generation is this adapter's loop over the artifact's ``decode`` signature (ai-edge-litert
has no generation API): argmax of each step's logits, lowest id on ties. The tokenizer is the pin's
own (copied into the artifact's snapshot at conversion), loaded with transformers' ``AutoTokenizer``.

ai-edge-litert and transformers are imported when the engine is built, never at module import.
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
from oracles.engines.litert.artifact import Layout, PlainLayout, check_model, read_layout, signature_details
from oracles.errors import PinError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


@dataclass
class LiteRtCache:
    """The external KV cache: ``buffers[name]`` float32 ``[1, R, H, Dh]`` per ``kv_cache_<k|v>_<i>``
    input, ``length`` the valid rows (rows past it are pad or stale rows no valid row reads)."""

    buffers: dict[str, np.ndarray]
    length: int = 0


def tflite_of(pin: "Pin") -> str | None:
    """The pin's ``.tflite`` file (relative to its snapshot folder), or None when it lists none."""
    return artifact_of(pin, ".tflite")


class LiteRtPort(ArtifactPort):
    """A pin's ``.tflite`` in ai-edge-litert's interpreter (``num_threads`` = ``threads`` or the
    runtime's default; the builtin op resolver with its default XNNPACK delegate).

    Args:
        root: the verified snapshot folder (the ``.tflite``, config.json, generation_config.json and
            the tokenizer files).
        pin: the loaded pin; threads: the interpreter's thread count (0: the runtime's default).

    Raises:
        PinError: a file that is not a loadable ``.tflite`` (truncated, say), signatures without what
            this engine serves, or sizes that differ from config.json or the tokenizer; one line naming
            the file and the field.
    """

    id = "litert"
    suffix, runtime_name, convert = ".tflite", "LiteRT", "convert one: a litert-convert:PIN pin"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        if importlib.util.find_spec("ai_edge_litert") is None:
            return "ai-edge-litert is not installed (pip install 'pytest-oracles[litert]')"
        return None

    def __init__(self, root: Path, pin: "Pin", threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        config = self.open_artifact()
        self.interpreter = load_interpreter(self.path, threads)
        self.layout = layout = read_layout(self.path, signature_details(self.interpreter))
        if layout.hidden is None:
            raise PinError(f"{self.path}: field 'signatures.{getattr(layout, 'prefill', '')}.outputs.hidden' is missing; the "
                           "engine contract returns the final norm's hidden state (convert with oracles.pins.litert)")
        check_model(self.path, layout, config, self.tokenizer_size)
        self.vocab_size, self.hidden_size = layout.vocab, int(layout.hidden)
        names: tuple[str | None, ...]
        if isinstance(layout, PlainLayout):
            self.num_layers, rows, names = int(config.get("num_hidden_layers", 0)), layout.seq_len, (layout.signature,)
        else:
            self.num_layers, rows, names = layout.num_layers, layout.kv_rows, (layout.prefill, layout.decode)
        positions = int(config.get("max_position_embeddings", 0) or 0)
        self.max_context = min(rows, positions) if positions else rows
        self._runners = {n: self.interpreter.get_signature_runner(n) for n in names if n is not None}

    def describe(self) -> dict[str, Any]:
        """Runtime, version, threads, delegate, file, signatures with their shapes, KV rows, and the
        converter's recipe from the pin (tool, version, arguments, the import shim)."""
        layout, recipe = self.layout, dict(self.pin_file.recipe or {})
        graph: dict[str, Any] = ({"graph": "plain", "seq_len": layout.seq_len, "kv_cache": None}
                                 if isinstance(layout, PlainLayout) else
                                 {"graph": "generative", "prefill_len": layout.prefill_len, "kv_rows": layout.kv_rows,
                                  "kv_cache_dtype": "float32"})
        return {**super().describe(), "runtime": "ai-edge-litert", "ai_edge_litert": dist_version("ai-edge-litert"),
                "dtype": "float32", "device": "cpu", "threads": self.threads or None,
                "op_resolver": "AUTO (builtin ops, default XNNPACK delegate)", "xnnpack": True,
                "file": self.path.name, "sha256": self.pin_file.files[self.path.name].sha256,
                "signatures": {n: self._shapes(n) for n in self._runners}, **graph, "context": self.max_context,
                "converter": {k: recipe.get(k) for k in ("tool", "version", "arguments", "shim") if k in recipe}}

    def _shapes(self, name: str) -> dict[str, dict[str, list[int]]]:
        runner = self._runners[name]
        return {side: {t: [int(n) for n in d["shape"]] for t, d in sorted(getter().items())}
                for side, getter in (("inputs", runner.get_input_details), ("outputs", runner.get_output_details))}

    # -- cache --------------------------------------------------------------------------------
    def make_cache(self) -> LiteRtCache:
        """An empty cache: zeroed buffers of the signatures' shape ``[1, R, H, Dh]``.

        Raises:
            Unsupported: a plain graph (it has no cache inputs to continue from).
        """
        layout = self._generative()
        return LiteRtCache({n: np.zeros(layout.kv_shape, np.float32) for n in layout.kv_names})

    def _generative(self) -> Layout:
        """The generative export's layout; a plain graph raises Unsupported (it has no cache)."""
        if isinstance(self.layout, PlainLayout):
            raise self._unsupported("keep a KV cache (make_cache)", f"{self.path.name} is a plain graph: signature "
                                    f"{self.layout.signature!r} takes {self.layout.seq_len} ids and no cache")
        return self.layout

    def snapshot(self, cache: Any) -> LiteRtCache:
        return LiteRtCache({k: v.copy() for k, v in cache.buffers.items()}, cache.length)

    def restore(self, snapshot: Any) -> LiteRtCache:
        return self.snapshot(snapshot)

    def snapshot_buffers(self, snapshot: Any) -> dict[str, np.ndarray]:
        """``layers.<i>.keys`` / ``values`` float32 ``[T, H, Dh]``, the valid rows of each layer."""
        out = {}
        for i in range(self.num_layers):
            for kv, field in (("k", "keys"), ("v", "values")):
                out[f"layers.{i}.{field}"] = snapshot.buffers[f"kv_cache_{kv}_{i}"][0, : snapshot.length].copy()
        return out

    def cache_capacity(self, cache: Any) -> int:
        """``R``, the KV rows the artifact was exported with (fixed: the buffers never grow)."""
        return self._generative().kv_rows

    def resident_bytes(self, obj: Any) -> int:
        return int(sum(a.nbytes for a in obj.buffers.values()))

    # -- forward ------------------------------------------------------------------------------
    def forward(self, prompt: Prompt | Sequence[int], cache: Any | None = None, keep: int = 0,
                layers: bool = False) -> Step:
        """Logits ``[T, V]`` and the final norm's hidden ``[T, D]``, float32, for every position of
        ``prompt`` after what ``cache`` holds (the cache gains them; ``cache=None``: a cold prefill).

        Raises:
            ValueError: an empty prompt, or more positions than the cache's rows (:func:`check_forward_length`).
            Unsupported: ``layers=True`` (the artifact outputs no per-layer stream); a continuation
                when the artifact has no decode signature and a chunk does not fit a prefill.
        """
        self.refuse_layers(layers)
        ids = self.text_ids(prompt)
        if isinstance(self.layout, PlainLayout):
            return self._forward_plain(ids, cache, keep)
        cache = self.make_cache() if cache is None else cache
        check_forward_length(self, cache.length, len(ids))
        logits, hidden = [], []
        done = 0
        while done < len(ids):
            n = self._chunk(cache.length, len(ids) - done)
            out = self._run(ids[done:done + n], cache)
            logits.append(out["logits"][0, :n])
            hidden.append(out["hidden"][0, :n])
            done += n
        lg, hd = np.concatenate(logits), np.concatenate(hidden)
        if keep:
            lg, hd = lg[-keep:], hd[-keep:]
        return Step(logits=np.ascontiguousarray(lg, np.float32), hidden=np.ascontiguousarray(hd, np.float32))

    def _forward_plain(self, ids: list[int], cache: Any | None, keep: int, pad: int = 0) -> Step:
        """A cold forward of the plain graph: ``ids`` padded with ``pad`` to its ``T`` positions, the valid rows kept."""
        if cache is not None:
            self.make_cache()  # raises Unsupported naming the plain graph
        check_forward_length(self, 0, len(ids))
        layout = self.layout
        assert isinstance(layout, PlainLayout)
        tokens = np.full((1, layout.seq_len), pad, np.int32)
        tokens[0, : len(ids)] = ids
        out = self._runners[layout.signature](**{layout.input: tokens})
        lg, hd = out["logits"][0, : len(ids)], out["hidden"][0, : len(ids)]
        if keep:
            lg, hd = lg[-keep:], hd[-keep:]
        return Step(logits=np.ascontiguousarray(lg, np.float32), hidden=np.ascontiguousarray(hd, np.float32))

    def _chunk(self, start: int, left: int) -> int:
        """Tokens the next signature call takes: a prefill chunk (up to ``T``) where all ``T`` of its
        rows fit the cache from ``start`` and more than one token is left (or there is no decode),
        else one decode token."""
        layout = self._generative()
        if start + layout.prefill_len <= layout.kv_rows and (left > 1 or layout.decode is None):
            return min(left, layout.prefill_len)
        if layout.decode is None:
            raise self._unsupported("run a single token or a chunk past the last full prefill",
                                    f"{self.path}: field 'signatures' has no 'decode' signature")
        return 1

    def _run(self, ids: list[int], cache: LiteRtCache, pad: int = 0) -> dict[str, np.ndarray]:
        """One signature call on ``ids`` at positions ``cache.length`` onwards (padded with ``pad`` ids to
        the prefill length); updates ``cache`` and returns the outputs (batch axis kept)."""
        layout = self._generative()
        t = 1 if len(ids) == 1 and layout.decode is not None else layout.prefill_len
        name = layout.decode if t == 1 else layout.prefill
        tokens = np.full((1, t), pad, np.int32)
        tokens[0, : len(ids)] = ids
        positions = np.arange(cache.length, cache.length + t, dtype=np.int32)
        out = self._runners[str(name)](tokens=tokens, input_pos=positions, **cache.buffers)
        cache.buffers = {k: np.array(out[k], np.float32) for k in layout.kv_names}
        cache.length += len(ids)
        return out

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt: Prompt | Sequence[int], sampler: Sampler, max_new_tokens: int,
                 max_kv_size: int | None = None) -> Generation:
        """Greedy generation through the artifact's signatures: the prompt's forward, then one
        ``decode`` call per token, argmax of each step's logits (lowest id on ties); stops after the
        first stop token (kept) or ``max_new_tokens``.

        Raises:
            Unsupported: a sampled ``sampler``, ``max_kv_size`` (the cache is the artifact's fixed rows),
                or no decode signature. ContextTooShort: prompt and new tokens pass the KV rows.
        """
        if self.layout.decode is None:
            raise self._unsupported("generate", f"{self.path}: field 'signatures' has no 'decode' signature")
        if not sampler.greedy:
            raise self._unsupported("sample (temperature > 0)", "this adapter's loop over the decode signature is greedy")
        if max_kv_size is not None:
            raise self._unsupported("bound its KV cache (max_kv_size)",
                                    f"{self.path.name} has a fixed {self._generative().kv_rows}-row cache")
        ids = self.text_ids(prompt)
        if len(ids) + max_new_tokens - 1 > self.max_context:
            raise ContextTooShort(self.id, f"generate {max_new_tokens} tokens after {len(ids)}",
                                  f"the .tflite's KV cache holds {self.max_context} rows")
        return self.greedy_over_forward(ids, max_new_tokens, "greedy over the decode signature")


def load_interpreter(path: Path, threads: int) -> Any:
    """ai-edge-litert's ``Interpreter`` on ``path`` with its tensors allocated.

    Raises:
        PinError: the file is not a loadable ``.tflite`` (missing, truncated, not a flatbuffer), with the
            runtime's own message.
    """
    from ai_edge_litert import interpreter

    if not path.is_file():
        raise PinError(f"{path}: field 'files' names a .tflite that does not exist")
    try:
        return interpreter.Interpreter(model_path=str(path), num_threads=threads or None)
    except (ValueError, RuntimeError) as exc:
        raise PinError(f"{path}: not a loadable .tflite ({path.stat().st_size} bytes): {str(exc).splitlines()[0]}") from None


