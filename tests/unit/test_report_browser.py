"""``oracles report`` of a real receipt, rendered by headless Chromium.

A project outside this repository (its ini turns pytest-oracles on) adds one failing check to a small
session of the shipped suite on the built-in twins: the MLX port held against the reference on the
draft twin's "ping" (port family), both engines' prefill units (mtplx), the faithful port's bisect
(faults), the MTP twin's rounds (mtplx). Its receipt's page is loaded in Chromium and the DOM it
renders is read back: the verdict at the top and FAIL, the added check the first failure listed (the
positive control: a page that led with anything else, or lost the failure, fails here), its record id
and message, which hold markup, as text, a section for every family of the receipt, every figure drawn
with a height. The screenshot is kept beside the receipt. Chromium is Debian's package, which ``make
setup`` installs; without it this test fails naming the install.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from report_dom import find, outline

from oracles.report.curves import slug

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

INSTALL = "apt-get install -y --no-install-recommends chromium (what `make setup` runs)"
#: The flags a root, offline, display-less machine needs: no sandbox (root), no GPU, no first-run pages, no
#: network services (the machine has no network), and a fresh profile per run (``--user-data-dir``).
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--window-size=1280,2400")
NASTY = "<b>x</b>&'y\""
INJECTED = f'''import pytest

pytestmark = pytest.mark.port


@pytest.mark.parametrize("record", ["<b>x</b> & 'y'"], ids=[{NASTY!r}])
def test_injected_failure(record: str) -> None:
    """The check this test adds: it fails, with markup in its record id and message."""
    assert not record, f"<script>alert(1)</script> injected: {{record}}"
'''
SELECT = "injected or (ping and (prefill_vs_reference or prefill_comparable)) or bisect_faithful or rounds_equal"
#: Appended to a copy of the page (the page itself runs no script: its policy allows none): where each part
#: is drawn, written into the DOM that --dump-dom serialises.
PROBE_POLICY = """<meta http-equiv="Content-Security-Policy" content="default-src 'none'; img-src data:; \
style-src 'unsafe-inline'; script-src 'unsafe-inline'">"""
PROBE = """<script>
const kind = e => e.matches('figure svg') ? 'svg' : e.matches('li.failure') ? 'failure'
  : e.matches('section.family') ? 'family' : e.id;
const parts = [...document.querySelectorAll('#verdict, #failures, li.failure, section.family, figure svg')];
document.body.setAttribute('data-layout', JSON.stringify(parts.map(e => { const r = e.getBoundingClientRect();
  return [kind(e), e.getAttribute('data-check') || e.getAttribute('data-family') || '', Math.round(r.top + scrollY),
          Math.round(r.height)]; })));
</script>"""


def chromium() -> str:
    found = shutil.which("chromium")
    if found is None:
        pytest.fail(f"chromium is not installed: {INSTALL}", pytrace=False)
    return found


def browse(page: Path, work: Path, *what: str) -> subprocess.CompletedProcess[str]:
    """Chromium on ``page`` with a fresh profile under ``work``, doing ``what`` (--dump-dom, --screenshot=...)."""
    profile = work / f"profile-{len(list(work.glob('profile-*')))}"
    return subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *what, page.as_uri()], capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def receipt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The inner session's receipt (its run exits 1: the added check fails)."""
    chromium()  # before minutes of models: no browser, no test
    project = tmp_path_factory.mktemp("report-browser")
    (project / "pytest.ini").write_text("[pytest]\noracles = true\n")
    (project / "test_injected.py").write_text(INJECTED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), HF_HUB_OFFLINE="1")
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--runslow", "--oracle-threads", "1",
                          "--pin", "smollm2-draft-twin,mtp-twin", "--port", "mlx", "--receipts-dir=receipts", "-k", SELECT,
                          "test_injected.py", "--pyargs", "oracles.suite.test_port", "oracles.suite.test_decode",
                          "oracles.suite.test_layer_taps", "oracles.suite.test_mtp"],
                         cwd=project, env=env, capture_output=True, text=True, timeout=500)
    assert run.returncode == 1 and "1 failed, 5 passed" in run.stdout, run.stdout[-4000:] + run.stderr[-2000:]
    (found,) = (project / "receipts" / "default").glob("*.json")
    return found


def _layout(dom: str) -> list[tuple[str, str, int, int]]:
    """(kind, check or family, top, height) of each part the probe measured, in document order."""
    (body,) = find(outline(dom), "body")
    return [(str(k), str(name), int(top), int(height)) for k, name, top, height in json.loads(body.attrs["data-layout"])]


def test_chromium_renders_the_verdict_then_the_failing_check(receipt: Path, tmp_path: Path) -> None:
    from oracles.cli import main

    page = receipt.with_name("report.html")
    t = time.perf_counter()
    assert main(["report", str(receipt), "--html", str(page), "--markdown", str(receipt.with_name("summary.md"))]) == 1
    seconds = time.perf_counter() - t
    doc = json.loads(receipt.read_text())
    families = sorted({row["family"] for row in doc["checks"].values()})
    assert families == ["faults", "mtplx", "port"], families

    text = page.read_text()
    assert not re.search(r"""(?:src|href)=["'](?!#|data:)""", text), "the page names an outside resource"
    (policy,) = find(outline(text), "meta", http_equiv="Content-Security-Policy")
    assert policy.attrs["content"].startswith("default-src 'none';"), policy.attrs  # the page itself runs and loads nothing
    probe = tmp_path / "probe.html"  # the page as written, with the probe's script allowed and appended
    probe.write_text(re.sub(r'<meta http-equiv="Content-Security-Policy"[^>]*>', PROBE_POLICY, text, count=1)
                     .replace("</body>", PROBE + "</body>"))
    dumped = browse(probe, tmp_path, "--dump-dom")
    assert dumped.returncode == 0 and "data-layout" in dumped.stdout, dumped.stderr[-2000:]
    shot = receipt.with_name("report.png")
    shown = browse(page, tmp_path, f"--screenshot={shot}")
    assert shown.returncode == 0 and shot.stat().st_size > 20_000, shown.stderr[-2000:]

    els = outline(dumped.stdout)
    layout = _layout(dumped.stdout)
    (verdict,) = find(els, "header", id="verdict")
    assert layout[0][0] == "verdict" and layout[0][2] == 0, layout[:3]  # drawn first, at the top of the page
    assert verdict.attrs["data-ok"] == "false" and verdict.content.startswith("FAIL"), verdict.content
    assert [row[:2] for row in layout[1:3]] == [("failures", ""), ("failure", "test_injected_failure")], layout[:4]
    assert [row for row in layout if row[0] == "failure"] == [layout[2]], layout  # the one failure, listed first
    (record,) = find(els, "span", cls="record")
    assert record.content == f"[{NASTY}]" and not find(els, "b")  # the id rendered as text, no element of it
    assert len(find(els, "script")) == 1  # the probe's: the message's <script> is text
    sections = [row for row in layout if row[0] == "family"]
    assert [row[1] for row in sections] == ["port", "mtplx", "faults"] and sorted(r[1] for r in sections) == families
    assert all(layout[2][2] < row[2] for row in sections), layout  # every section below the failure
    assert [s.attrs["id"] for s in find(els, "section", cls="family")] == [f"family-{slug(r[1])}" for r in sections]
    figures = [row for row in layout if row[0] == "svg"]
    assert len(figures) >= 2 and len(figures) == len(find(els, "svg")) and all(row[3] > 100 for row in figures), figures

    summary = receipt.with_name("summary.md").read_text()
    assert summary.startswith("## oracles report: FAIL") and f"| failed | `test_injected_failure` | `{NASTY}` |" in summary
    print(f"oracles report: {seconds:.2f} s, page {page.stat().st_size} bytes, screenshot {shot}")
