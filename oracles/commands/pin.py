"""``oracles pin NAME --from PATH|hf:REPO@REVISION``: pin a snapshot you have, in the project's pins folder.

Every file's size and sha256 (progress on stderr while a large snapshot is read), the safetensors
header digests, the model class from ``config.json`` and the versions it was made with go to
``<oracles_pins>/NAME.json`` (the project's ini option; default ``fixtures/pins`` beside the ini file).
An existing pin of that name is never overwritten. Nothing is copied: a ``local:`` pin's snapshot is
the folder itself and an ``hf:`` pin's is the commit's folder in the local Hugging Face cache, both
verified in place by every session and by ``oracles materialize NAME``. Next:
``oracles records mtplx --pin NAME`` writes its tokenizer's token ids.
"""

from __future__ import annotations

import argparse


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", help="the new pin's name (the file NAME.json in the project's pins folder)")
    parser.add_argument("--from", dest="source", required=True, metavar="PATH|hf:REPO@REVISION",
                        help="a snapshot folder (config.json and weights), or a branch, tag or commit of a model in "
                             "the local Hugging Face cache ($HF_HUB_CACHE, $HF_HOME/hub or ~/.cache/huggingface/hub)")
    parser.add_argument("--untrained", action="store_true",
                        help="the weights are seeded random, not trained: the pin says \"trained\": false, and checks "
                             "of a trained model's behaviour (ending with a stop token) skip on it, naming that")


def run(args: argparse.Namespace) -> int:
    from oracles.pins.writer import write_pin

    pin = write_pin(args.name, args.source, trained=not args.untrained)
    total = sum(f.bytes for f in pin.files.values())
    print(f"wrote {pin.path}: pin {pin.name}, {pin.model_class}, {len(pin.files)} files, {total:,} bytes, source "
          f"{pin.source}{', untrained' if not pin.trained else ''}; next: oracles records mtplx --pin {pin.name}")
    return 0
