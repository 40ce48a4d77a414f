"""``--port-pin`` at collection: the port tests gain one parameter set per artifact pair (ids
``REF-PORT@ARTIFACT``), only the port tests do, and a bad value stops the session in one line.

Not dry: each check collects the suite in a pytest process of its own, about a second each (the pairs
themselves are test_pairing_dry.py's, an artifact pair's xdist group test_groups_dry.py's)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _collect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--no-receipt", "-p", "no:cacheprovider",
                           "--port", "mlx", "oracles/suite/test_port.py", "oracles/suite/test_decode.py", *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


def _ids(out: str) -> list[str]:
    return [line for line in out.splitlines() if "::" in line]


def test_the_built_in_conversions_are_the_default_pairs() -> None:
    got = _collect("-k", "prefill_vs_reference or decode_to_stop")
    ids = _ids(got.stdout)
    assert got.returncode == 0, got.stdout + got.stderr
    # mlx-lm's conversions run when --port-pin names them (the chat test below); the default pairs are llama.cpp's
    # and LiteRT's, which --port mlx cannot load (left out, naming why)
    assert not [i for i in ids if "@" in i], ids
    assert "engine mlx left out pin smollm2-gguf-q4_1" in got.stdout, got.stdout[-2000:]
    assert "oracles/suite/test_port.py::test_prefill_vs_reference[smollm2-135m-instruct-mlx-ping]" in ids
    # an engine family test runs on its family's pins only: the artifacts are not among them
    assert not [i for i in ids if "test_decode.py" in i and ("mlx-q" in i or "bf16" in i)], ids


def test_a_named_artifact_runs_the_engine_families_on_the_ports_that_load_it() -> None:
    ids = _ids(_collect("-k", "decode_to_stop", "--port-pin", "smollm2-mlx-q4").stdout)
    # the port's own checks on the artifact: its pin, its engine; the reference never loads it
    assert "oracles/suite/test_decode.py::test_decode_to_stop[arith-smollm2-mlx-q4-mlx]" in ids, ids
    assert not [i for i in ids if "smollm2-mlx-q4-torch" in i], ids
    assert "oracles/suite/test_decode.py::test_decode_to_stop[arith-smollm2-135m-instruct-torch]" in ids, ids


def test_with_pin_or_none_there_are_no_pairs() -> None:
    for extra in (("--pin", "smollm2-135m-instruct"), ("--port-pin", "none")):
        ids = _ids(_collect("-k", "prefill_vs_reference", *extra).stdout)
        assert ids and not [i for i in ids if "@" in i], (extra, ids)


def test_a_pair_of_other_tokenizers_is_refused_in_one_line() -> None:
    got = _collect("--port-pin", "qwen35-vl-twin=smollm2-mlx-bf16")
    assert got.returncode == 4, got.stdout + got.stderr
    assert ("--port-pin qwen35-vl-twin=smollm2-mlx-bf16: pin smollm2-mlx-bf16's tokenizer files differ from pin "
            "qwen35-vl-twin's") in got.stderr


def test_the_chat_runs_on_the_built_in_conversions_only_when_asked() -> None:
    def chat_ids(*extra: str) -> list[str]:
        got = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "--no-receipt", "-p",
                              "no:cacheprovider", "--port", "mlx", "oracles/suite/test_chat.py", "-k", "chat_vs_reference",
                              *extra], cwd=ROOT, capture_output=True, text=True, timeout=300)
        return [i for i in _ids(got.stdout) if "@" in i]

    assert chat_ids() == []
    assert "oracles/suite/test_chat.py::test_chat_vs_reference[brief-story-prime-smollm2-mlx-q4-dequant-mlx@smollm2-mlx-q4]" \
        in chat_ids("--port-pin", "smollm2-mlx-q4")
