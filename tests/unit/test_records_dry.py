"""Record files on bad input: each error names the file, the record and the field."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from oracles.errors import FixtureError
from oracles.families.execution.prompts import PROMPTS, load_prompts
from oracles.families.records import RecordStore, TokensMissing, canonical_json, canonical_sha256, load_record_list, require
from oracles.pins.pin import PinStore, load_pin

pytestmark = pytest.mark.dry

MESSAGES = [{"role": "user", "content": "héllo"}]


def _write(tmp_path: Path, obj: Any) -> Path:
    path = tmp_path / "records.json"
    path.write_text(json.dumps(obj, indent=1, ensure_ascii=False))
    return path


def test_canonical_sha256_is_sorted_compact_utf8() -> None:
    text = '[{"content":"héllo","role":"user"}]'
    assert canonical_json(MESSAGES) == text
    assert canonical_sha256(MESSAGES) == hashlib.sha256(text.encode("utf-8")).hexdigest()
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def test_not_json_names_path_line_column(tmp_path: Path) -> None:
    path = tmp_path / "records.json"
    path.write_text('{"records": [\n  {"id": "a"},\n  {"id": "b",}\n]}\n')
    with pytest.raises(FixtureError, match=rf"^{path}:3:14: not valid JSON"):
        load_record_list(path)


@pytest.mark.parametrize(("obj", "message"), [
    ({"rows": []}, "field 'records' is missing or not a list"),
    ({"records": [{"id": "a"}, {"name": "b"}]}, "records[1]: field 'id' is missing or not a plain non-empty string"),
    ({"records": [{"id": "a[1]"}]}, "records[0]: field 'id' is missing or not a plain non-empty string"),
    ({"records": [{"id": "a"}, {"id": "a"}]}, "records[1]: duplicate record id 'a'"),
    ({"records": ["a"]}, "records[0]: field 'id' is missing"),
])
def test_record_list_errors(tmp_path: Path, obj: Any, message: str) -> None:
    path = _write(tmp_path, obj)
    with pytest.raises(FixtureError) as info:
        load_record_list(path)
    assert str(info.value) == f"{path}: {message}" or str(info.value).startswith(f"{path}: {message}"), str(info.value)


@pytest.mark.parametrize(("value", "kind", "ok"), [
    (3, int, True), (True, int, False), ("3", int, False), (None, str, False), ([1], (list, tuple), True),
    (True, bool, True),
])
def test_require(value: Any, kind: Any, ok: bool) -> None:
    rec = {"f": value} if value is not None else {}
    if ok:
        assert require(rec, "f", kind, "file.json: record 'r'") == value
    else:
        with pytest.raises(FixtureError, match=r"^file\.json: record 'r': field 'f' is missing or not a "):
            require(rec, "f", kind, "file.json: record 'r'")


def _prompt(**over: Any) -> dict[str, Any]:
    return {"id": "ping", "messages": MESSAGES, "sha256": canonical_sha256(MESSAGES), **over}


def test_prompts_good(tmp_path: Path) -> None:
    (rec,) = load_prompts(_write(tmp_path, {"records": [_prompt()]}))
    assert (rec.id, rec.ids, rec.pin, rec.message_list) == ("ping", (), None, MESSAGES)


@pytest.mark.parametrize(("over", "message"), [
    ({"messages": "hi"}, "record 'ping': field 'messages' is missing or not a list"),
    ({"messages": [{"role": "user"}]}, "record 'ping': field 'messages[0]' must be {'role': str, 'content': str}"),
    ({"sha256": "0" * 64}, f"record 'ping': field 'sha256' is {'0' * 64} but the messages hash to "
                           f"{canonical_sha256(MESSAGES)}"),
    ({"ids": [1, 2]}, "record 'ping': unknown field 'ids' (known: id, messages, sha256)"),
])
def test_prompt_record_errors_name_path_record_field(tmp_path: Path, over: dict[str, Any], message: str) -> None:
    path = _write(tmp_path, {"records": [_prompt(**over)]})
    with pytest.raises(FixtureError) as info:
        load_prompts(path)
    assert str(info.value) == f"{path}: {message}"


def test_dry_tokenizer_of_a_pin_without_a_copy_names_the_file(tmp_path: Path) -> None:
    from oracles.pins.tokenizer import LightTokenizer

    with pytest.raises(FixtureError, match=r"nopin/tokenizer.json: missing; the dry tokenizer of pin 'nopin'"):
        LightTokenizer(tmp_path / "nopin")


def test_loaded_tokenizer_is_shared_until_a_file_changes(tmp_path: Path) -> None:
    """One parse per folder while its files are unchanged; a template rewritten in place is read again
    (the cache must not serve a stale template to ``oracles records``)."""
    import shutil

    from oracles.families.records import TOKENIZER_COPIES
    from oracles.pins.tokenizer import load_tokenizer

    source = sorted(p for p in TOKENIZER_COPIES.iterdir() if p.is_dir())[0]
    root = tmp_path / "tok"
    shutil.copytree(source, root)
    first = load_tokenizer(root)
    assert load_tokenizer(root) is first
    (root / "chat_template.jinja").write_text("{% for m in messages %}<{{ m['content'] }}>{% endfor %}!")
    again = load_tokenizer(root)
    assert again is not first
    assert again.render(MESSAGES) == "<héllo>!"
    assert first.render(MESSAGES) != "<héllo>!"


def test_record_files_refuse_unknown_fields_and_another_family(tmp_path: Path) -> None:
    good = json.loads(PROMPTS.read_text())
    misspelt = json.loads(json.dumps(good))
    misspelt["records"][0]["idz"] = [1, 2]
    (tmp_path / "a.json").write_text(json.dumps(misspelt))
    with pytest.raises(FixtureError, match=r"a.json: record 'ping': unknown field 'idz' \(known: id, messages, sha256\)"):
        load_prompts(tmp_path / "a.json")
    (tmp_path / "b.json").write_text(json.dumps({**good, "family": "d1"}))
    with pytest.raises(FixtureError, match=r"b.json: field 'family' is 'd1', expected 'mtplx'"):
        load_prompts(tmp_path / "b.json")


def test_a_misspelt_role_is_named(tmp_path: Path) -> None:
    doc = json.loads(PROMPTS.read_text())
    doc["records"][0]["messages"][0]["role"] = "usr"
    (tmp_path / "p.json").write_text(json.dumps(doc))
    with pytest.raises(FixtureError, match=r"record 'ping': field 'messages\[0\].role' is 'usr', not one of system, user"):
        load_prompts(tmp_path / "p.json")


def test_tokens_are_found_by_tokenizer_digest(tmp_path: Path) -> None:
    """Token ids are kept per tokenizer: a pin whose tokenizer files equal another's reads its ids; a
    pin with another tokenizer is refused naming the command that writes its ids."""
    default = load_pin("smollm2-135m-instruct")
    same = json.loads(default.path.read_text()) | {"name": "same-tokenizer"}
    other = json.loads(json.dumps(same)) | {"name": "other-tokenizer"}
    other["files"]["tokenizer.json"] = {"bytes": 1, "sha256": "f" * 64}
    pins = tmp_path / "pins"
    pins.mkdir()
    for doc in (same, other):
        (pins / f"{doc['name']}.json").write_text(json.dumps(doc))
    store = RecordStore.with_project(tmp_path / "records")
    where = PinStore((pins,))
    path, doc = store.tokens("mtplx", load_pin("same-tokenizer", where))
    assert path.name == "smollm2-135m-instruct.json" and doc["tokenizer_sha256"] == default.tokenizer_sha256
    with pytest.raises(TokensMissing, match=r"^pin other-tokenizer: family mtplx has no token ids for its tokenizer "
                                            r"\(sha256 [0-9a-f]{12}\) in .*; run `oracles records mtplx --pin other-tokenizer`$"):
        store.tokens("mtplx", load_pin("other-tokenizer", where))


def test_tokens_file_without_digest_is_named(tmp_path: Path) -> None:
    folder = tmp_path / "mtplx" / "tokens"
    folder.mkdir(parents=True)
    (folder / "x.json").write_text(json.dumps({"family": "mtplx", "ids": {}}))
    with pytest.raises(FixtureError, match=r"x.json: field 'tokenizer_sha256' is missing or not a string"):
        RecordStore((tmp_path,)).tokens("mtplx", load_pin("smollm2-135m-instruct"))
