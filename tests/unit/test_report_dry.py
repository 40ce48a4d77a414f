"""``oracles report`` on a receipt built as a run builds one (tests/unit/report_fake.py): the page leads with
the verdict and the failed test, a record id and message holding markup stay text, every family has its
section with the figures its records hold; the Markdown summary; bad input is one line, exit 2, nothing
written; no matplotlib, no figures and a line saying so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from report_dom import find, outline
from report_fake import NASTY_ID, NASTY_MESSAGE, write

from oracles.cli import main
from oracles.receipts.table import load_records
from oracles.report.curves import Curve
from oracles.report.load import read
from oracles.report.markdown import code
from oracles.report.series import curves

pytestmark = pytest.mark.dry


@pytest.fixture
def receipt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake receipt, its figures drawn as a stub (the tests that read the figures share :func:`drawn`)."""
    monkeypatch.setattr("oracles.report.figures.svg", lambda curve: "<svg></svg>")
    return write(tmp_path / "r")


@pytest.fixture(scope="module")
def drawn(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The fake receipt's page and summary, made once for the module: (page, summary). Each figure is the
    stub ``<svg>`` (matplotlib's drawing took 1.2 s of the dry smoke); tests/unit/test_report_browser.py
    renders real figures and holds their size."""
    receipt = write(tmp_path_factory.mktemp("drawn"))
    md = receipt.with_name("summary.md")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("oracles.report.figures.svg", lambda curve: "<svg></svg>")
        code_, page = _report(receipt, "--markdown", str(md))
    assert code_ == 1  # written; the receipt is not all ok
    return page, md


def _report(receipt: Path, *extra: str) -> tuple[int, Path]:
    page = receipt.with_name("page.html")
    return main(["report", str(receipt), "--html", str(page), *extra]), page


def test_the_page_leads_with_the_verdict_and_the_failure(drawn: tuple[Path, Path]) -> None:
    els = outline(drawn[0].read_text())
    body = [e for e in els if e.parent is not None and e.parent.tag == "body"]
    assert body[0].attrs.get("id") == "verdict" and body[0].attrs["data-ok"] == "false", body[0]
    assert body[0].content.startswith("FAIL") and "1 check failed: test_prefill_vs_reference" in body[0].content
    (failure,) = find(els, "li", cls="failure")
    assert failure.attrs["data-check"] == "test_prefill_vs_reference" and failure.attrs["data-family"] == "port"
    (record,) = [e for e in find(els, "span", cls="record") if e.within(failure)]
    assert record.content == f"[{NASTY_ID}]"  # the id as text: no element made of it
    (line,) = [e for e in find(els, "p", cls="message") if e.within(failure)]
    assert line.content == f"AssertionError: {' '.join(NASTY_MESSAGE.split())}"
    assert not find(els, "b") and not find(els, "script") and not find(els, "row")
    sections = find(els, "section", cls="family")
    assert [s.attrs["data-family"] for s in sections] == ["port", "mtplx", "d1", "clef", "cohort", "faults", "graded"]
    assert els.index(failure) < els.index(sections[0])


def test_every_figure_the_receipt_holds_is_drawn(drawn: tuple[Path, Path]) -> None:
    els = outline(drawn[0].read_text())
    found: dict[str, list[tuple[str, int]]] = {}
    for fig in find(els, "figure"):
        family = next(p for p in find(els, "section", cls="family") if fig.within(p)).attrs["data-family"]
        svgs = [e for e in find(els, "svg") if e.within(fig)]
        found.setdefault(family, []).append((fig.attrs["id"], len(svgs)))
    assert all(n == 1 for figs in found.values() for _, n in figs), found
    titles = {family: len(figs) for family, figs in found.items()}
    # mtplx: MTP rounds, decode steps, the prefill pair's max |Δ| and KL; port: its failed test's bisect; cohort:
    # lanes; clef: stream, absmax; graded: chunks; faults: the faithful bisect
    assert titles == {"mtplx": 4, "port": 1, "cohort": 1, "clef": 2, "graded": 1, "faults": 1}, found
    ids = [i for figs in found.values() for i, _ in figs]
    assert len(set(ids)) == len(ids)


def test_the_curves_read_what_each_record_attached(receipt: Path) -> None:
    loaded = read(receipt)
    by_family: dict[str, list[Curve]] = {}
    for rec in loaded.records:
        by_family.setdefault(rec.family, [])
    for family in by_family:
        by_family[family] = curves(family, [r for r in loaded.records if r.family == family])
    (bisect,) = by_family["port"]
    assert bisect.ticks == ("embedding", "0", "1", "final norm", "head") and bisect.lines[0].mark == 2
    assert bisect.lines[-1].dashed and bisect.lines[-1].y == (1e-10,) * 5
    rounds = next(c for c in by_family["mtplx"] if "MTP" in c.title)
    assert rounds.lines[0].y == (1, 2, 0, 2, 1) and "50% accepted" in rounds.lines[0].label
    (lanes,) = by_family["cohort"]
    assert lanes.lines[0].x == (0, 1, 2, 3) and lanes.limits == ((1e-3, "atol 0.001"),)
    (graded,) = by_family["graded"]
    assert [ln.label for ln in graded.lines] == ["llamacpp KL mean", "llamacpp KL p99", "band KL mean", "band KL p99"]


def test_the_markdown_summary(drawn: tuple[Path, Path]) -> None:
    text = drawn[1].read_text()
    assert text.startswith("## oracles report: FAIL\n") and len(text.splitlines()) < 40, text
    row = next(ln for ln in text.splitlines() if ln.startswith("| failed |"))
    message = NASTY_MESSAGE.replace("|", "\\|")
    assert row == f"| failed | `test_prefill_vs_reference` | `{NASTY_ID}` | `AssertionError: {message}` |"
    assert code("a`b|c") == "``a`b\\|c``" and code("`x") == "`` `x ``"


def test_the_summary_alone_on_stdout(receipt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _report(receipt, "--markdown", "-")[0] == 1
    out, err = capsys.readouterr()
    assert out.startswith("## oracles report: FAIL\n") and "page: " in err, (out, err)


def test_an_all_ok_receipt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Exit 0 for a receipt that is all ok, the page saying PASS and that nothing failed; 1 above for one
    that is not (the page written either way)."""
    monkeypatch.setattr("oracles.report.figures.svg", lambda curve: "<svg></svg>")
    code_, page = _report(write(tmp_path / "ok", ok=True))
    els = outline(page.read_text())
    (verdict,) = find(els, "header", id="verdict")
    assert code_ == 0 and verdict.attrs["data-ok"] == "true" and verdict.content.startswith("PASS"), verdict.content
    assert not find(els, "li", cls="failure") and "No test failed." in find(els, "section", id="failures")[0].content


@pytest.mark.parametrize("damage", ["schema", "truncated", "field"])
def test_bad_receipts_are_one_line_and_write_nothing(receipt: Path, capsys: pytest.CaptureFixture[str], damage: str) -> None:
    text = receipt.read_text()
    if damage == "schema":
        doc = json.loads(text)
        doc["schema_version"] = 3
        receipt.write_text(json.dumps(doc))
        want = f"{receipt}: field 'schema_version' is 3, not 4"
    elif damage == "truncated":
        receipt.write_text(text[: len(text) // 2])
        want = f"{receipt}: truncated: its JSON ends at line"
    else:
        doc = json.loads(text)
        doc["pins"][0] = "smollm2"
        receipt.write_text(json.dumps(doc))
        want = f"{receipt}: field 'pins[0]' is not an object"
    code_, page = _report(receipt, "--markdown", str(receipt.with_name("s.md")))
    err = capsys.readouterr().err
    assert code_ == 2 and err.startswith(f"oracles report: error: {want}") and len(err.splitlines()) == 1, err
    assert sorted(p.name for p in receipt.parent.iterdir()) == sorted([receipt.name, receipt.with_suffix(".npz").name])


def test_an_output_that_exists_is_kept(receipt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = receipt.with_name("page.html")
    page.write_text("mine")
    assert _report(receipt)[0] == 2
    assert "page.html: already exists" in capsys.readouterr().err and page.read_text() == "mine"


def test_default_page_beside_the_receipt(receipt: Path) -> None:
    assert main(["report", str(receipt), "--no-arrays"]) == 1
    page = receipt.with_name(receipt.name.removesuffix(".json") + ".report.html")
    els = outline(page.read_text())
    assert find(els, "section", cls="family", data_family="mtplx")  # no unit pair drawn, the section stands
    assert not [f for f in find(els, "figure") if "positions" in f.attrs["id"]]


def test_without_matplotlib_the_page_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    receipt = write(tmp_path / "r")
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code_, page = _report(receipt)
    err = capsys.readouterr().err
    assert code_ == 1 and "figures not drawn: matplotlib is not installed" in err, err
    els = outline(page.read_text())
    assert not find(els, "svg") and find(els, "figure") and "figures not drawn" in find(els, "section", id="notes")[0].content


def test_a_partial_log_is_not_a_receipt(receipt: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The records read back from the receipt are the page's (and a partial log is refused in one line)."""
    assert len(load_records(receipt)) == len(read(receipt).records)
    partial = receipt.with_name("x.partial.jsonl")
    partial.write_text('{"event": "start", "schema_version": 4}\n')
    assert main(["report", str(partial)]) == 2
    assert f"{partial}: a partial log, not a receipt" in capsys.readouterr().err


def test_a_converted_artifact_is_paired_with_its_own_reference() -> None:
    """Three reference units of one prefill on three pins (the float32 pin, two dequantized ones): the
    4-bit port's is held against the one its test attached beside it, the bfloat16 port's against the
    pin its band ran on (the band drawn beside it alone), a port on the float32 pin against that pin's;
    none is a guess."""
    from oracles.receipts.units import Unit
    from oracles.report.positions import pairs

    def unit(pin: str, engine: str, test: str) -> Unit:
        return Unit(kind="prefill", request_sha256="a" * 64, unit="", pin=pin, engine=engine, record="ping", ids=(1, 2),
                    argmax=(0, 0), arrays={"logits": f"{pin}-{engine}"}, test=test)

    units = [unit("fp32", "torch", "comparable"), unit("q8-dequant", "torch", "other"),
             unit("q4-dequant", "torch", "q4"), unit("q4", "mlx", "q4"),
             unit("bf16", "mlx", "bf16"), unit("fp32", "torch@bfloat16", "bf16"), unit("fp32", "mlx", "same-pin")]
    groups, unpaired = pairs(units, "torch")
    held = {key: [(p.ref.pin, p.other.engine, p.band) for p in found] for key, found in groups.items()}
    assert held == {("prefill", "q4-dequant", "q4", "mlx"): [("q4-dequant", "mlx", False)],
                    ("prefill", "fp32", "bf16", "mlx"): [("fp32", "mlx", False), ("fp32", "torch@bfloat16", True)],
                    ("prefill", "fp32", "fp32", "mlx"): [("fp32", "mlx", False)]}, held
    assert unpaired == 0
    alone = [unit("fp32", "torch", "a"), unit("q8-dequant", "torch", "b"), unit("q4", "mlx", "c")]
    assert pairs(alone, "torch")[1] == 1  # two candidates and nothing to choose by: not drawn
    (named,) = pairs(alone, "torch", {"q4": "q8-dequant"}.get)[0].values()  # the pin file's reference chooses
    assert [(p.ref.pin, p.other.pin) for p in named] == [("q8-dequant", "q4")]
