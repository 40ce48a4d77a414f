"""``oracles compare``'s output file: every input refusal comes before the output is chosen, the default
name never clashes within a second (``-2``, ``-3`` ...), and nothing is ever overwritten."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from units_fake import decode, logits, write

from oracles.cli import main

pytestmark = [pytest.mark.dry]

STAMP = "20261201T112934Z"


@pytest.fixture
def frozen(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Run in ``tmp_path`` with the clock stopped at :data:`STAMP` (every compare in the same second)."""
    monkeypatch.chdir(tmp_path)
    fixed = time.strptime(STAMP, "%Y%m%dT%H%M%SZ")
    monkeypatch.setattr(time, "gmtime", lambda *_: fixed)
    return tmp_path / "receipts" / "compare"


def _pair(tmp_path: Path) -> tuple[Path, Path]:
    base = logits()
    return (write(tmp_path / "a", "ref", [decode("torch", base, [5, 2])]),
            write(tmp_path / "b", "port", [decode("mlx", base, [5, 2])]))


def test_default_names_in_one_second_never_clash(tmp_path: Path, frozen: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ref, port = _pair(tmp_path)
    for _ in range(3):
        assert main(["compare", str(ref), str(port)]) == 0
    names = sorted(p.name for p in frozen.iterdir())
    stem = f"{STAMP}-ref-vs-port"
    assert names == sorted([f"{stem}.json", f"{stem}-2.json", f"{stem}-3.json"])
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("comparison: ")]
    assert said == [f"comparison: {Path('receipts/compare') / n}" for n in (f"{stem}.json", f"{stem}-2.json",
                                                                            f"{stem}-3.json")]
    assert all(json.loads((frozen / n).read_text())["all_ok"] for n in names)


def test_default_name_taken_is_never_overwritten(tmp_path: Path, frozen: Path) -> None:
    ref, port = _pair(tmp_path)
    frozen.mkdir(parents=True)
    taken = frozen / f"{STAMP}-ref-vs-port.json"
    taken.write_text("keep")
    (frozen / f"{STAMP}-ref-vs-port-2.json").symlink_to("nowhere")  # a dangling link is taken too
    assert main(["compare", str(ref), str(port)]) == 0
    assert taken.read_text() == "keep" and (frozen / f"{STAMP}-ref-vs-port-3.json").exists()


def test_refusal_of_itself_comes_before_the_output(tmp_path: Path, frozen: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The trial's case: F F --port-engine torch with the default name taken says what is wrong with the
    input (a comparison with itself), not that the name is taken; nothing is created."""
    only = write(tmp_path / "a", "only", [decode("torch", logits(), [5, 2])])
    frozen.mkdir(parents=True)
    (frozen / f"{STAMP}-only-vs-only.json").write_text("keep")
    assert main(["compare", str(only), str(only), "--port-engine", "torch"]) == 2
    err = capsys.readouterr().err
    assert "a comparison with itself cannot fail" in err and "already exists" not in err
    assert [p.name for p in frozen.iterdir()] == [f"{STAMP}-only-vs-only.json"]


def test_bad_input_comes_before_a_taken_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    only = write(tmp_path / "a", "only", [decode("torch", logits(), [5, 2])])
    out = tmp_path / "cmp.json"
    out.write_text("keep")
    assert main(["compare", str(only), str(only), "--out", str(out), "--port-engine", "torch"]) == 2
    assert "cannot fail" in capsys.readouterr().err and out.read_text() == "keep"


def test_out_taken_meanwhile_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    """An explicit --out created by another run after the check is refused at the exclusive write."""
    import oracles.commands.compare as command

    ref, port = _pair(tmp_path)
    out = tmp_path / "cmp.json"
    monkeypatch.setattr(command, "_refuse_taken", lambda path: out.write_text("theirs"))
    assert main(["compare", str(ref), str(port), "--out", str(out)]) == 2
    assert out.read_text() == "theirs"
    assert capsys.readouterr().err.endswith(f"{out}: already exists; a comparison is never overwritten "
                                            f"(choose another --out)\n")
