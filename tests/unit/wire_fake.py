"""A far side for the wire's unit tests: the cohort family's numpy fake engine served on stdio, with faults
injected, each at one call. Run as ``python tests/unit/wire_fake.py [KIND:CALL ...]``:

``crash``      exit with status 3 before answering (stderr: a last line)
``hang``       never answer
``half``       write half of the answer's frame, then exit
``shape``      the answer's first array one column short
``dtype``      the answer's first array as int32
``garbage``    bytes that are not a frame
``missing``    the answer without its ``result``
``refuse``     answer an ``error`` of kind ``error`` (the engine raised)

No torch or mlx: numpy, the ``tokenizers`` library, and this package.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[1]))

from cohort_fake import DryTokenizer, FakeEngine  # noqa: E402

from oracles.engines.wire.frame import encode  # noqa: E402
from oracles.engines.wire.server import Server, _write_all, serve_stdio  # noqa: E402

TOKENIZER = HERE.parents[1] / "oracles" / "builtin" / "tokenizers" / "smollm2-135m-instruct"
#: The fake's pin (FakeEngine's own), as a client names it in the handshake.
PIN = "fake-pin"


class NoTokenizer:
    """A tokenizer with no member but the template (a fault run never tokenizes: its start stays fast)."""

    chat_template = None


def engine(tokenizer: bool = True) -> FakeEngine:
    """The served engine: :class:`FakeEngine` with the default pin's tokenizer (dry), or none."""
    e = FakeEngine()
    e.tokenizer = DryTokenizer(TOKENIZER) if tokenizer else NoTokenizer()  # type: ignore[assignment]
    e.eos_token_ids = frozenset({2})
    return e


class FaultyServer(Server):
    """A :class:`Server` whose answer to each call of ``faults`` carries its fault (module docstring)."""

    def __init__(self, e: FakeEngine, faults: dict[str, str], out_fd: int) -> None:
        super().__init__(e)
        self.faults, self.out_fd = faults, out_fd

    def answer(self, frame: Any) -> tuple[dict[str, Any], list[np.ndarray]]:
        header, arrays = super().answer(frame)
        kind = self.faults.get(str(frame.header.get("call")))
        if kind is None:
            return header, arrays
        print(f"wire_fake: injecting {kind} at {frame.header.get('call')}", file=sys.stderr, flush=True)
        if kind == "crash":
            os._exit(3)
        if kind == "hang":
            time.sleep(3600)
        if kind == "half":
            data = b"".join(bytes(c) for c in encode(header, arrays))
            _write_all(self.out_fd, data[: len(data) // 2])
            os._exit(0)
        if kind == "garbage":
            _write_all(self.out_fd, b"loading model... done\n" * 4)
            time.sleep(3600)
        if kind == "shape":
            arrays[0] = np.ascontiguousarray(arrays[0][..., :-1])
        if kind == "dtype":
            arrays[0] = arrays[0].astype("<i4")
        if kind == "missing":
            header.pop("result", None)
        if kind == "refuse":
            header = {"id": header["id"], "error": {"kind": "error", "message": "RuntimeError: the fake refuses"}}
        return header, arrays


def main(argv: list[str]) -> None:
    e = engine(tokenizer=not argv)
    print("wire_fake: ready", file=sys.stderr, flush=True)
    if argv:  # the faults write the frames themselves, on the real stdout
        faults = {call: kind for kind, _, call in (a.partition(":") for a in argv)}
        FaultyServer(e, faults, 1).converse(0, 1)
    else:
        forward = e.forward

        def noisy(*args: Any, **kwargs: Any) -> Any:
            os.write(1, b"wire_fake: a library writing to fd 1 (serve_stdio keeps it off the frames)\n")
            return forward(*args, **kwargs)

        e.forward = noisy  # type: ignore[method-assign]
        serve_stdio(e)


if __name__ == "__main__":
    main(sys.argv[1:])
