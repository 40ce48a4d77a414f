"""What ``oracles compare`` prints: the table of matched units, the worst figures, the unmatched
listing (:mod:`oracles.receipts.compare` makes the rows). Pure."""

from __future__ import annotations

import textwrap
from typing import Any

from oracles.receipts.units import Unit


def fmt(v: Any, spec: str, width: int) -> str:
    """``v`` formatted right-aligned to ``width``, ``-`` when None."""
    return f"{'-':>{width}}" if v is None else format(v, f">{width}{spec}")


#: Under the table: what the two token columns compare and what "recorded only" means.
LEGEND = ("prompt ids: the input token ids are equal; gen tokens: the generated tokens (div@N: the first position "
          "they differ); logits held: every prompt position of a prefill or a clef row, a d1 read-out's slot, a "
          "greedy run's steps through the first divergent token, a sampled generation's first step (its tokens "
          "recorded only); recorded only: nothing held to a threshold (a generation without a step)")
HEAD = (f"{'kind':<16} {'unit':<28} {'prompt ids':<10} {'argmax':>7} {'max|Δlogit|':>11} {'KL max':>9} "
        f"{'max|Δp|':>9} {'answer':<20} {'bound':<9} {'gen tokens':>10}  status")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """One line per matched unit (``-`` where a figure does not apply), under :data:`HEAD`; ``bound`` is
    the name of the tolerance it was held to (``float32``, ``band x3``; ``none`` for a graded unit)."""
    lines = [HEAD, "-" * len(HEAD)]
    for r in rows:
        if "ref_key" in r:
            answer = ("= " if r["key_equal"] else "≠ ") + (r["ref_key"] if r["key_equal"] else f"{r['ref_key']}->{r['port_key']}")
        else:
            answer = "-"
        gen = "-" if "first_divergent_token" not in r else (
            "same" if r["first_divergent_token"] is None else f"div@{r['first_divergent_token']}")
        status = "FAIL: " + "; ".join(r["failures"]) if r["status"] == "FAIL" else r["status"]
        lines.append(f"{r['kind']:<16} {r['label'][:28]:<28} {'same' if r['ids_equal'] else 'DIFFER':<10} "
                     f"{fmt(r.get('argmax_agreement'), '.0%', 7)} {fmt(r.get('max_abs'), '.3e', 11)} "
                     f"{fmt(r.get('kl_max'), '.2e', 9)} {fmt(r.get('max_abs_dp'), '.2e', 9)} {answer[:20]:<20} "
                     f"{r['tolerance'] or 'none':<9} {gen:>10}  {status}")
    return lines


def summary_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Worst figures over matched rows (None where no row has the figure), the count per kind, the
    failed, recorded-only and graded (held to nothing: ``status`` ``graded``) counts."""
    def worst(name: str) -> float | None:
        vals = [r[name] for r in rows if r.get(name) is not None]
        return max(vals) if vals else None

    agree = [r["argmax_agreement"] for r in rows if r.get("argmax_agreement") is not None]
    keys = [r["key_equal"] for r in rows if "key_equal" in r]
    kinds = sorted({r["kind"] for r in rows})
    return {"matched": len(rows), "by_kind": {k: sum(r["kind"] == k for r in rows) for k in kinds},
            "failed": sum(r["ok"] is False for r in rows),
            "recorded_only": sum(r["ok"] is None and r["status"] != "graded" for r in rows),
            "graded": sum(r["status"] == "graded" for r in rows),
            "max_abs_logit": worst("max_abs"), "nmse_max": worst("nmse"), "kl_max": worst("kl_max"),
            "max_abs_dp": worst("max_abs_dp"), "argmax_agreement_min": min(agree) if agree else None,
            "answers_equal": f"{sum(keys)}/{len(keys)}" if keys else None}


def worst_line(figures: dict[str, Any]) -> str:
    """``worst: max_abs_logit 1.234e-04, ...`` from :func:`summary_figures` (counts per kind left out, and
    the graded count when 0)."""
    parts = [f"{k} {fmt(v, '.0%' if k.startswith('argmax') else '.3e', 0)}" if isinstance(v, float) else f"{k} {v}"
             for k, v in figures.items() if v is not None and k != "by_kind" and (k, v) != ("graded", 0)]
    return "worst: " + ", ".join(parts)


def listing(title: str, units: list[Unit]) -> list[str]:
    """One line per kind: ``<title>, <kind> (<n>): label, label, ...`` (wrapped)."""
    lines = []
    for kind in sorted({u.kind for u in units}):
        labels = ", ".join(u.label for u in units if u.kind == kind)
        n = sum(u.kind == kind for u in units)
        lines += textwrap.wrap(f"{title}, {kind} ({n}): {labels}", width=120, subsequent_indent="    ")
    return lines
