"""What every port of one converted file shares (LiteRT's ``.tflite``, ExecuTorch's ``.pte``, ONNX Runtime's
``.onnx``): the pin's file of the runtime's kind, the refusal of a pin that lists none, and what sits beside
the file in the snapshot (``config.json``, the tokenizer the conversion copied, the stop ids).

A subclass names its file kind, its runtime and how to make one, then opens the file its own way::

    class MyPort(ArtifactPort):
        id, suffix, runtime_name, convert = "myrt", ".myrt", "MyRT", "convert one: a myrt-convert:PIN pin"

        def __init__(self, root, pin, threads=0):
            super().__init__(root, pin, threads)
            config = self.open_artifact()   # self.path, self.tokenizer, self.eos_token_ids set
            ...
"""

from __future__ import annotations

import importlib.metadata
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Sequence

import numpy as np

from oracles.engines.base import Engine, Generation
from oracles.engines.types import hub_offline
from oracles.errors import PinError

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


def artifact_of(pin: "Pin", suffix: str) -> str | None:
    """The first (by name) of the pin's files ending in ``suffix`` (``".tflite"``), relative to its snapshot
    folder, or None when it lists none."""
    return next((name for name in sorted(pin.files) if name.endswith(suffix)), None)


def eos_ids(root: Path, config: dict[str, Any]) -> list[int]:
    """The stop ids: ``generation_config.json``'s ``eos_token_id`` (an int or a list) in ``root``, else
    ``config``'s (transformers' ``GenerationConfig`` reads them in that order)."""
    gen = root / "generation_config.json"
    value = json.loads(gen.read_text(encoding="utf-8")).get("eos_token_id") if gen.is_file() else None
    value = config.get("eos_token_id") if value is None else value
    return [int(v) for v in (value if isinstance(value, list) else [value] if value is not None else [])]


def dist_version(dist: str) -> str | None:
    """The installed version of distribution ``dist``, None when it is not installed."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class ArtifactPort(Engine):
    """A port of one converted file of its pin. Subclasses set :attr:`suffix` (the file's ending),
    :attr:`runtime_name` (the runtime's name in refusals) and :attr:`convert` (how to make such a pin)."""

    suffix: ClassVar[str]
    runtime_name: ClassVar[str]
    convert: ClassVar[str]

    path: Path
    #: ids the tokenizer knows (added tokens included): what the file's vocabulary is checked against
    tokenizer_size: int

    @classmethod
    def unsupported_pin(cls, pin: "Pin") -> str | None:
        """A pin without a file of :attr:`suffix` (a safetensors snapshot, a GGUF), judged from the pin file."""
        if artifact_of(pin, cls.suffix) is None:
            return f"{cls.runtime_name} runs a {cls.suffix} artifact; pin {pin.name} lists none ({cls.convert})"
        return None

    def open_artifact(self) -> dict[str, Any]:
        """Set :attr:`path` (the pin's file), ``tokenizer`` (transformers' ``AutoTokenizer`` on the snapshot:
        the reference's tokenizer, which the conversion copied beside the file), ``tokenizer_size`` and
        ``eos_token_ids``;
        return ``config.json`` as a dict. Hub downloads are forbidden first (:func:`hub_offline`).

        Raises:
            PinError: the pin file lists no file of :attr:`suffix`.
        """
        hub_offline()
        from transformers import AutoTokenizer

        name = artifact_of(self.pin_file, self.suffix)
        if name is None:
            raise PinError(f"{self.pin_file.path}: field 'files' lists no {self.suffix} file")
        self.path = self.root / name
        config: dict[str, Any] = json.loads((self.root / "config.json").read_text(encoding="utf-8"))
        tokenizer = AutoTokenizer.from_pretrained(self.root)
        self.tokenizer, self.tokenizer_size = tokenizer, len(tokenizer)
        self.eos_token_ids = frozenset(eos_ids(self.root, config))
        return config

    # -- what every converted file's cache shares ------------------------------------------------
    def cache_length(self, cache: Any) -> int:
        """The rows ``cache.length`` counts as valid (0 for no cache): each artifact port's cache counts its own."""
        return 0 if cache is None else int(cache.length)

    def is_trimmable(self, cache: Any) -> bool:
        """True: rows past a cache's valid length are never read before a forward writes them."""
        return True

    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` valid rows by lowering the count (a port whose cache is the rows themselves
        overrides this).

        Raises:
            ValueError: more rows asked than the cache holds.
        """
        self.check_trim(cache, n)
        cache.length -= n
        return True

    @staticmethod
    def check_trim(cache: Any, n: int) -> None:
        """Raise ValueError when ``n`` passes the rows ``cache`` holds."""
        if n > cache.length:
            raise ValueError(f"trim: {n} positions asked, the cache holds {cache.length}")

    def refuse_layers(self, layers: bool) -> None:
        """Raise Unsupported for ``layers=True``: a converted file outputs the logits and the final norm's
        hidden state, no per-layer stream."""
        if layers:
            raise self._unsupported("return the residual stream of each layer (layers=True)",
                                    f"{self.path.name} outputs the logits and the final norm's hidden state only")

    def greedy_over_forward(self, ids: Sequence[int], max_new_tokens: int, loop: str) -> Generation:
        """Greedy generation as this adapter's loop over :meth:`forward` on one fresh cache: the prompt's
        forward, then one ``forward`` per token, argmax of each step's ``[V]`` float32 logits (numpy's: the
        lowest id on ties); stops after the first stop token (kept) or ``max_new_tokens``. ``loop`` names the
        loop in ``Generation.extra``. The caller has refused what the runtime cannot do (sampling, a bounded
        cache, a context too short). Raises what :meth:`forward` raises."""
        start = time.perf_counter()
        cache = self.make_cache()
        rows = [self.forward(list(ids), cache, keep=1).logits[0]]
        first = time.perf_counter()
        tokens = [int(np.argmax(rows[0]))]
        while len(tokens) < max_new_tokens and tokens[-1] not in self.eos_token_ids:
            rows.append(self.forward([tokens[-1]], cache, keep=1).logits[0])
            tokens.append(int(np.argmax(rows[-1])))
        end = time.perf_counter()
        finish = "stop" if tokens[-1] in self.eos_token_ids else "length"
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish,
                          step_logits=np.stack(rows).astype(np.float32), prefill_seconds=first - start,
                          decode_seconds=end - first, extra={"loop": loop})
