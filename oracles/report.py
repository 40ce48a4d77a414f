"""Plain-text tables of receipts for the terminal (no I/O beyond returning lines)."""

from __future__ import annotations

from typing import Any, Mapping


def format_checks(checks: Mapping[str, Mapping[str, Any]], all_ok: bool) -> list[str]:
    """The checks table as aligned lines: check, family, ok, passed, failed ids, skipped."""
    width = max([len("check")] + [len(k) for k in checks])
    lines = [f"{'check':<{width}}  {'family':<10}  {'ok':<5}  {'passed':>6}  {'skipped':>7}  failed"]
    for name, row in checks.items():
        ok = {True: "yes", False: "NO", None: "-"}[row["ok"]]
        failed = ", ".join(row["failed"][:6]) + (f" (+{len(row['failed']) - 6})" if len(row["failed"]) > 6 else "")
        lines.append(f"{name:<{width}}  {str(row.get('family') or ''):<10}  {ok:<5}  {row['passed']:>6}  {row['skipped']:>7}  {failed}")
    lines.append(f"all_ok: {all_ok}")
    return lines
