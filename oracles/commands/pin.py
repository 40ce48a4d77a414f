"""``oracles pin NAME --from PATH|hf:REPO@REVISION``: pin a snapshot you have, in the project's pins folder.

Every file's size and sha256 (progress on stderr while a large snapshot is read), the safetensors
header digests, the model class from ``config.json`` and the versions it was made with go to
``<oracles_pins>/NAME.json`` (the project's ini option; default ``fixtures/pins`` beside the ini file).
An existing pin of that name is never overwritten. Nothing is copied: a ``local:`` pin's snapshot is
the folder itself and an ``hf:`` pin's is the commit's folder in the local Hugging Face cache, both
verified in place by every session and by ``oracles materialize NAME``. The pin records the precision read
from the snapshot (config.json's quantization, the safetensors dtypes). ``--from FILE.gguf|FILE.tflite`` (or a
folder holding one such file and no snapshot weights) with ``--reference PIN`` pins a user's artifact file
against the float32 pin it is held against (:mod:`oracles.pins.artifact_pin`). ``--dequantize-from PIN|DIR|FILE``
instead builds a quantized artifact's float32 snapshot under ``$ORACLES_HOME`` and pins that
(:mod:`oracles.pins.dequantize`). Next:
``oracles records mtplx --pin NAME`` writes its tokenizer's token ids.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from oracles.pins.pin import Pin


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the new pin's name (the file NAME.json in the project's pins folder)")
    # Exactly one of --from and --dequantize-from (checked in run: one line naming both).
    parser.add_argument("--from", dest="source", metavar="PATH|FILE|hf:REPO@REVISION",
                        help="a snapshot folder (config.json and weights), a branch, tag or commit of a model in "
                             "the local Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub), or "
                             "an artifact file (.gguf, .tflite; or a folder holding one) with --reference")
    parser.add_argument("--dequantize-from", dest="dequantize", metavar="PIN|DIR|FILE.gguf",
                        help="instead of --from: build the float32 snapshot of a quantized MLX folder (mx.dequantize) "
                             "or a GGUF file (transformers' GGUF reader) into $ORACLES_HOME/snapshots/NAME and pin "
                             "it: the dequantized reference a port on the quantized artifact is held against")
    parser.add_argument("--reference", metavar="PIN",
                        help="with --from: the pin a port on this snapshot is held against (e.g. its dequantized "
                             "reference); the pin file's 'reference'. Needed for an artifact file: its tokenizer and "
                             "config are that pin's")
    parser.add_argument("--untrained", action="store_true",
                        help="the weights are seeded random, not trained: the pin says \"trained\": false, and checks "
                             "of a trained model's behaviour (ending with a stop token) skip on it, naming that (an "
                             "artifact file takes its reference's by default)")


def run(args: argparse.Namespace) -> int:
    from oracles.errors import PinError
    from oracles.pins.artifacts import find_artifact
    from oracles.pins.writer import write_pin

    if (args.source is None) == (args.dequantize is None):
        raise PinError("oracles pin: give exactly one of --from PATH|hf:REPO@REVISION and --dequantize-from PIN|DIR|FILE")
    if args.dequantize is not None:
        if args.reference is not None:
            raise PinError("--dequantize-from takes no --reference: the dequantized pin is its own reference")
        from oracles.pins.dequantize_pin import pin_dequantized

        pin = pin_dequantized(args.name, args.dequantize, trained=not args.untrained)
    elif (artifact := find_artifact(args.source)) is not None:
        from oracles.pins.artifact_kinds import kind_of
        from oracles.pins.artifact_pin import pin_artifact

        pin = pin_artifact(args.name, artifact, args.reference, trained=False if args.untrained else None)
        engine = getattr(kind_of(artifact), "ENGINE", "")
        _wrote(pin, f"pytest --pyargs oracles.suite -m port --runslow --port {engine} --port-pin {pin.name}")
        return 0
    else:
        pin = write_pin(args.name, args.source, trained=not args.untrained, reference=args.reference)
    _wrote(pin, f"oracles records mtplx --pin {pin.name}")
    return 0


def _wrote(pin: "Pin", next_step: str) -> None:
    """The command's one line: the pin file written and what it holds, then what to run next."""
    total = sum(f.bytes for f in pin.files.values())
    print(f"wrote {pin.path}: pin {pin.name}, {pin.model_class}, {pin.precision.describe()}, {len(pin.files)} files, "
          f"{total:,} bytes, source {pin.source}{', untrained' if not pin.trained else ''}; next: {next_step}")
