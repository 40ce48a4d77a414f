"""``oracles records FAMILY --pin NAME``: a family's token ids for one pin's tokenizer, from the tokenizer alone.

No weights, no torch: the pin's chat template is rendered with jinja2 and its tokenizer encodes with the
``tokenizers`` library (:class:`oracles.pins.tokenizer.LightTokenizer`; the slow suite holds the engines'
own ids against what this writes). The tokenizer files are read from ``--tokenizer-dir``, else from
the pin's verified snapshot. The document goes to the project's records folder
(``<oracles_records>/FAMILY/tokens/NAME.json``) and names the tokenizer by its digest, so every pin
with the same tokenizer files reads it. Review the diff: changed ids mean the tokenizer, the template
or the records changed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oracles.families import TOKENIZED


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("family", choices=TOKENIZED,
                        help="the family whose token ids to write")
    parser.add_argument("--pin", required=True, help="the pin whose tokenizer and chat template to use")
    parser.add_argument("--tokenizer-dir", type=Path, default=None,
                        help="a folder holding the pin's tokenizer files (default: the pin's verified snapshot)")


def _tokenizer_root(pin: Any, given: Path | None) -> Path:
    """The folder to read the tokenizer from; its pinned tokenizer files are verified either way.

    Raises:
        PinError: a tokenizer file differs from the pin (file and digests named), or the snapshot is missing.
    """
    from oracles.errors import PinError
    from oracles.pins.pin import TOKENIZER_FILES, sha256_file, snapshot_dir

    root = given or snapshot_dir(pin)
    for name, want in pin.files.items():
        if Path(name).name in TOKENIZER_FILES:
            path = root / name
            if not path.is_file():
                raise PinError(f"{path}: tokenizer file of pin {pin.name!r} is missing (run `oracles materialize "
                               f"{pin.name}`, or pass --tokenizer-dir)")
            if (got := sha256_file(path)) != want.sha256:
                raise PinError(f"{path}: sha256 mismatch: expected {want.sha256}, actual {got}")
    return root


def build(family: str, pin: Any, root: Path) -> dict[str, Any]:
    """The tokens document of ``family`` for ``pin``'s tokenizer read from ``root``; for a tokenizer
    without a chat template, a document that says so (``unsupported``), so the family's tests on that
    pin skip with the reason instead of failing or vanishing."""
    from oracles.pins.tokenizer import NoChatTemplate

    try:
        return _build(family, pin, root)
    except NoChatTemplate as exc:
        return {"family": family, "pin": pin.name, "tokenizer_sha256": pin.tokenizer_sha256,
                "generated_by": f"oracles records {family} --pin {pin.name}",
                "unsupported": f"pin {pin.name} has no chat template ({exc})"}


def _build(family: str, pin: Any, root: Path) -> dict[str, Any]:
    """The token-id document of the records set ``family`` (a :attr:`Family.tokens` name) for ``pin``.

    Raises:
        PinError: a records set with no builder here (named, with the ones there are).
    """
    if family == "d1":
        from oracles.families.d1.rows import current_rows

        return current_rows(root, pin.name, pin.tokenizer_sha256)
    if family == "mtplx":
        from oracles.families.execution.prompts import build_tokens
        from oracles.pins.tokenizer import load_tokenizer

        return build_tokens(pin.name, pin.tokenizer_sha256, load_tokenizer(root).chat_ids)
    from oracles.errors import PinError

    raise PinError(f"oracles records {family}: no token builder for records set {family!r}; built here: d1, mtplx")


def run(args: argparse.Namespace) -> int:
    from oracles.families.records import records_store
    from oracles.pins.pin import load_pin

    pin = load_pin(args.pin)
    doc = build(args.family, pin, _tokenizer_root(pin, args.tokenizer_dir))
    out = records_store().write_dir / args.family / "tokens" / f"{pin.name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    before = out.read_text() if out.is_file() else None
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n"
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(text)
    tmp.replace(out)  # a reader sees the old document or the new one, never half of one
    what = "unchanged" if before == text else ("rewrote" if before else "wrote")
    print(f"{what} {out}: family {args.family}, pin {pin.name}, tokenizer sha256 {pin.tokenizer_sha256[:12]}")
    return 0
