"""Plain-text tables of receipts for the terminal (no I/O beyond returning lines)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def format_checks(checks: Mapping[str, Mapping[str, Any]], all_ok: bool,
                  ran_nothing: Sequence[Mapping[str, Any]] = ()) -> list[str]:
    """The checks table as aligned lines: check, family, ok, passed, xfailed, skipped, not run, failed ids;
    then each engine that ran no check (a receipt's ``ran_nothing``: :func:`format_ran_nothing`), then
    ``all_ok``.

    A receipt written before the table had ``xfailed`` and ``not_run`` shows ``?`` there (its ``passed``
    then counts strict xfails too, and its ``skipped`` the tests not run)."""
    width = max([len("check")] + [len(k) for k in checks])
    lines = [f"{'check':<{width}}  {'family':<10}  {'ok':<5}  {'passed':>6}  {'xfailed':>7}  {'skipped':>7}  "
             f"{'not run':>7}  failed"]
    for name, row in checks.items():
        ok = {True: "yes", False: "NO", None: "-"}[row["ok"]]
        failed = ", ".join(row["failed"][:6]) + (f" (+{len(row['failed']) - 6})" if len(row["failed"]) > 6 else "")
        family = str(row.get("family") or "")
        xfailed, not_run = row.get("xfailed", "?"), row.get("not_run", "?")
        lines.append(f"{name:<{width}}  {family:<10}  {ok:<5}  {row['passed']:>6}  {xfailed:>7}  {row['skipped']:>7}  "
                     f"{not_run:>7}  {failed}")
    lines += format_ran_nothing(ran_nothing)
    lines.append(f"all_ok: {all_ok}")
    return lines


def format_ran_nothing(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per engine that ran no check, its pins and tests, then a line per skip reason with its
    count (most frequent first)::

        engine fake ran no check: 8 tests on pin smollm2-hybrid-twin skipped or not run (not all_ok)
          6x unsupported: engine fake has no forward
    """
    lines = []
    for row in rows:
        pins = ", ".join(row["pins"])
        lines.append(f"engine {row['engine']} ran no check: {row['tests']} tests on pin{'s' if len(row['pins']) > 1 else ''} "
                     f"{pins} skipped or not run (not all_ok)")
        reasons = sorted(row["reasons"].items(), key=lambda kv: (-kv[1], kv[0]))
        lines += [f"  {count}x {reason}" for reason, count in reasons]
    return lines


def format_benchmarks(tests: Sequence[Mapping[str, Any]]) -> list[str]:
    """The cohort benchmark sections of a receipt's tests (data key ``cohort_benchmark``) as a table:
    pin, engine, threads, medians of the paired protocol, its speedup with the interquartile range of
    the paired ratios, the conditioned speedup and its even/odd strata, and whether ``/proc`` saw swap
    or major faults in the window. Empty when no test attached one."""
    # dict, not Mapping: a receipt's records are JSON objects, and an ABC check per test is the cost of
    # this table in a session of thousands of tests with no benchmark
    rows = [bench for t in tests if isinstance(data := t.get("data"), dict)
            and isinstance(bench := data.get("cohort_benchmark"), dict)]
    if not rows:
        return []
    head = ("pin", "engine", "thr", "serial ms", "cohort ms", "speedup", "ratio IQR", "cond.", "even/odd", "disturbed")
    table = [head]
    for b in rows:
        p, c = b["paired"], b["conditioned"]
        disturbed = b.get("vm_window", {}).get("disturbed")
        table.append((str(b["pin"]), str(b["engine"]), str(b.get("threads") or "-"), f"{p['serial_median_ms']:.2f}",
                      f"{p['cohort_median_ms']:.2f}", f"{p['speedup']:.3f}x",
                      f"{p['paired_ratio_iqr'][0]:.3f}-{p['paired_ratio_iqr'][1]:.3f}", f"{c['speedup']:.3f}x",
                      f"{c['even_speedup']:.3f}/{c['odd_speedup']:.3f}", {None: "n/a", True: "YES", False: "no"}[disturbed]))
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    lines = [f"cohort benchmark: serial (B one-token forwards) vs cohort (one B-lane decode) at the anchor, "
             f"{rows[0]['pairs']} alternating pairs a protocol, medians"]
    lines += ["  ".join(cell.ljust(w) if i < 3 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths)))
              for r in table]
    return lines
