"""``oracles kld export | compare``: llama-perplexity's ``--kl-divergence-base`` files.

``oracles kld export --pin P --out FILE`` runs the reference on the shipped corpus
(:mod:`oracles.families.graded.corpus`) and writes its log-probs as a base file, which
``llama-perplexity -m PORT.gguf --kl-divergence-base FILE --kl-divergence`` reads (the file holds the
tokens it evaluates). ``oracles kld compare BASE PORT`` prints llama-perplexity's statistics of the
port file's rows against the base file's (:func:`oracles.families.graded.run.compare_bases`); numpy only.

Exit status: 0 done; 2 bad input (a file of another n_ctx or vocabulary, truncated, of another magic,
an existing ``--out``: the file and field named).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from oracles.families import DEFAULT_PIN


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=("export", "compare"),
                        help="export: the reference's corpus log-probs as a base file (--out); compare BASE PORT: "
                             "llama-perplexity's statistics of PORT's rows against BASE's")
    parser.add_argument("files", nargs="*", type=Path, metavar="FILE",
                        help="compare: the reference's base file, then the port's (same n_ctx, vocabulary, tokens)")
    parser.add_argument("--out", type=Path, default=None, help="export: the base file to create (refused when it exists)")
    parser.add_argument("--pin", default=DEFAULT_PIN, help="export: the pin the reference runs on; default: %(default)s")
    parser.add_argument("--reference", default="torch", help="export: engine id of the reference; default: %(default)s")
    parser.add_argument("--snapshot", type=Path, default=None,
                        help="export: snapshot folder for the pin (verified); default: the materialised one")
    parser.add_argument("--n-ctx", type=int, default=512,
                        help="export: tokens a chunk, as llama-perplexity -c; default: %(default)s")
    parser.add_argument("--chunks", type=int, default=None,
                        help="export: the first N chunks only, as llama-perplexity --chunks; default: all")
    parser.add_argument("--threads", type=int, default=1, help="export: torch intra-op threads; default: %(default)s")
    parser.add_argument("--json", action="store_true", help="compare: print the figures as JSON instead of the table")


def run(args: argparse.Namespace) -> int:
    """Run the action. Returns 0.

    Raises:
        OracleError: bad input (file and field named; export without ``--out`` or with files; compare
            without exactly two files), before any weights load where it can be known then.
    """
    from oracles.errors import OracleError

    if args.action == "export":
        if args.out is None or args.files:
            raise OracleError("kld export: takes --out FILE and no positional file")
        return _export(args)
    if len(args.files) != 2:
        raise OracleError(f"kld compare: takes two base files (BASE PORT), got {len(args.files)}")
    return _compare(args)


def _export(args: argparse.Namespace) -> int:
    from oracles.errors import OracleError
    from oracles.families.graded.corpus import corpus_for
    from oracles.families.graded.run import export_base
    from oracles.pins.pin import load_pin, snapshot_dir, verify_snapshot
    from oracles.plugin.fixtures import EngineLoader

    if args.out.exists():
        raise OracleError(f"{args.out}: exists; a base file is never overwritten")
    from oracles.engines import engine_class, unavailable_reason

    reason = unavailable_reason(args.reference)
    if reason:
        raise OracleError(f"--reference {args.reference}: {reason}")
    pin = load_pin(args.pin)
    root = args.snapshot or snapshot_dir(pin)
    verify_snapshot(pin, root, origin="--snapshot" if args.snapshot else None)
    loader = EngineLoader(lambda _p: root, args.threads, lambda _e: {}, lambda *_a, **_k: None, lambda _n: pin)
    engine = loader.build(engine_class(args.reference), root, pin)
    if isinstance(engine, str):
        raise OracleError(engine)
    corpus = corpus_for(engine.tokenizer, args.n_ctx)
    facts = export_base(engine, corpus, args.out, args.chunks)
    print(f"{args.out}: {facts['n_chunk']} chunks of {facts['n_ctx']} tokens, n_vocab {facts['n_vocab']}, "
          f"{facts['bytes']} bytes, tokens sha256 {facts['tokens_sha256']}, {facts['seconds']:.1f} s")
    return 0


def _compare(args: argparse.Namespace) -> int:
    from oracles.families.graded.kld_file import read_base
    from oracles.families.graded.run import compare_bases, figures

    base = read_base(args.files[0])
    port = read_base(args.files[1], n_vocab=base.n_vocab, n_ctx=base.n_ctx)
    result = figures(compare_bases(base, port))
    if args.json:
        print(json.dumps(result, indent=1, sort_keys=True))
    else:
        print("\n".join(lines(result, base.path, port.path)))
    return 0


def lines(result: dict[str, Any], base: Path, port: Path) -> list[str]:
    """The table: one line a chunk, then llama-perplexity's pooled blocks (delta-p and same top p in percent)."""
    out = [f"base {base} vs {port}", "chunk   KLD mean ± unc            Δp RMS ± unc       same top p ± unc"]
    for c in result["chunks"]:
        k, d, t = c["kld"], c["delta_p"], c["same_top_p"]
        out.append(f"{c['chunk'] + 1:5d}   {k['mean']:10.6f} ± {k['unc']:9.6f}   {100 * d['rms']:6.3f} ± "
                   f"{100 * d['rms_unc']:5.3f} %   {100 * t['value']:6.3f} ± {100 * t['unc']:5.3f} %")
    p = result["pooled"]
    r, lr, k, d = p["ppl_ratio"], p["ln_ppl_ratio"], p["kld"], p["delta_p"]
    cor = "n/a" if p["ln_ppl_correlation"] is None else f"{100 * p['ln_ppl_correlation']:6.2f}%"
    out += [f"Mean PPL(Q)                   : {p['ppl']['value']:10.6f} ± {p['ppl']['unc']:10.6f}",
            f"Mean PPL(base)                : {p['ppl_base']['value']:10.6f} ± {p['ppl_base']['unc']:10.6f}",
            f"Cor(ln(PPL(Q)), ln(PPL(base))): {cor}",
            f"Mean ln(PPL(Q)/PPL(base))     : {lr['value']:10.6f} ± {lr['unc']:10.6f}",
            f"Mean PPL(Q)/PPL(base)         : {r['value']:10.6f} ± {r['unc']:10.6f}",
            f"Mean    KLD: {k['mean']:10.6f} ± {k['unc']:10.6f}"]
    out += [f"{label:<11}: {k[key]:10.6f}" for label, key in (
        ("Maximum KLD", "max"), ("99.9%   KLD", "p99_9"), ("99.0%   KLD", "p99"), ("95.0%   KLD", "p95"),
        ("90.0%   KLD", "p90"), ("Median  KLD", "median"), ("Minimum KLD", "min"))]
    out += [f"Mean    Δp: {100 * d['mean']:6.3f} ± {100 * d['unc']:5.3f} %",
            f"Maximum Δp: {100 * d['max']:6.3f}%", f"99.0%   Δp: {100 * d['p99']:6.3f}%",
            f"Median  Δp: {100 * d['median']:6.3f}%", f" 1.0%   Δp: {100 * d['p1']:6.3f}%",
            f"Minimum Δp: {100 * d['min']:6.3f}%",
            f"RMS Δp    : {100 * d['rms']:6.3f} ± {100 * d['rms_unc']:5.3f} %",
            f"Same top p: {100 * p['same_top_p']['value']:6.3f} ± {100 * p['same_top_p']['unc']:5.3f} %",
            f"positions: {p['count']} in {len(result['chunks'])} chunks"]
    return out
