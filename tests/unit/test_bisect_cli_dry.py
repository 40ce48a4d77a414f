"""``oracles bisect`` end to end on engines of this module (registered as plugged engines are), a tiny
local pin and its snapshot: no torch, no weights.

What a new user hit: without matplotlib the verdict was followed by a traceback and exit 1 whatever the
verdict; a port that cannot run here (unknown, not installed) was found only after the reference had
loaded, and one whose build raised gave a raw traceback; a bad ``--snapshot`` was blamed on the pin.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pytest
from cohort_fake import NoForward
from test_bisect_dry import D, L, V, forward_arrays, perturbed

from oracles.engines.base import Engine
from oracles.engines.taps import Taps
from oracles.pins.pin import Pin

pytestmark = pytest.mark.dry

Cli = Callable[..., tuple[int, str, str]]
REF = forward_arrays()
PNG_LINE = "PNG not written: matplotlib is not installed (pip install 'pytest-oracles[plots]')"


class _StubTokenizer:
    """The members the engine contract requires of a tokenizer (:class:`oracles.engines.types.Tokenizer`);
    bisect's prompt comes from ``chat_ids``, so only the chat template is ever read."""

    def __init__(self, chat_template: str | None) -> None:
        self.chat_template = chat_template

    def apply_chat_template(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool = False,
                            tokenize: bool = True, return_dict: bool = False) -> list[int]:
        return [1, 2, 3]

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return [1]

    def decode(self, token_ids: list[int], *, skip_special_tokens: bool = False) -> str:
        return ""

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return ["" for _ in ids]


class _Tapped(NoForward, Engine):
    """An engine whose prefill is ``arrays`` whatever the prompt (the layer taps bisect reads)."""

    arrays: dict[str, np.ndarray] = REF
    chat_template: str | None = "{{ messages }}"

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        super().__init__(root, pin, threads)
        self.vocab_size, self.hidden_size, self.num_layers = V, D, L
        self.eos_token_ids, self.max_context = frozenset({0}), 0
        self.tokenizer = _StubTokenizer(self.chat_template)

    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        return [1, 2, 3]

    def taps(self, prompt: Any) -> Taps:
        a = self.arrays
        return Taps(a["stream"], a["attn"], a["mlp"], a["hidden"], a["logits"], mixers=["self_attn"] * L)


class FakeRef(_Tapped):
    id = "fake-ref"


class FakeTwin(_Tapped):
    """A faithful port: the reference's arrays exactly."""

    id = "fake-twin"


class FakeOff(_Tapped):
    """A port that leaves the reference in layer 2's MLP."""

    id = "fake-off"
    arrays = perturbed(REF, 2, 0.5, "mlp")


class FakeMissing(_Tapped):
    """A port whose framework is not installed here."""

    id = "fake-missing"

    @classmethod
    def unavailable_reason(cls) -> str | None:
        return "fakelib is not installed (pip install 'pytest-oracles[fake]')"


class FakeBroken(_Tapped):
    """A port whose build raises, as mlx-lm does on a weight it does not expect."""

    id = "fake-broken"

    def __init__(self, root: Path, pin: Pin, threads: int = 0) -> None:
        raise KeyError("model.layers.0.mlp.gate_proj.weight")


class FakeRefusing(_Tapped):
    """A port that can tell from the pin file alone that it cannot load it."""

    id = "fake-refusing"

    @classmethod
    def unsupported_pin(cls, pin: Any) -> str | None:
        return f"fakelib cannot load pin {pin.name} ({pin.model_class}): no such architecture"


class FakeNoChat(_Tapped):
    """A reference whose tokenizer has no chat template (Engine.chat_ids then raises Unsupported)."""

    id = "fake-nochat"
    chat_template = None
    chat_ids = Engine.chat_ids


FAKES = (FakeRef, FakeTwin, FakeOff, FakeMissing, FakeBroken, FakeRefusing, FakeNoChat)


@pytest.fixture
def fakes(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """This module's engines plugged in by entry point: a ``fakes-0.1.dist-info`` folder on ``sys.path``
    (an installed distribution to importlib.metadata), read by the registry each command opens."""
    info = tmp_path / "plugged" / "fakes-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fakes\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[oracles.engines]\n" + "".join(
        f"{cls.id} = {__name__}:{cls.__name__}\n" for cls in FAKES))
    monkeypatch.syspath_prepend(str(info.parent))


@pytest.fixture
def tiny(pin_project: Path, tmp_path: Path) -> Path:
    """A local pin ``tiny`` in the project's pins folder; returns its snapshot folder."""
    snap = tmp_path / "snap"
    snap.mkdir()
    data = b'{"architectures": ["LlamaForCausalLM"]}\n'
    (snap / "config.json").write_bytes(data)
    pins = pin_project / "fixtures" / "pins"
    pins.mkdir(parents=True)
    (pins / "tiny.json").write_text(json.dumps({
        "name": "tiny", "source": f"local:{snap}", "model_class": "LlamaForCausalLM",
        "files": {"config.json": {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}},
        "safetensors_headers": {}}))
    return snap


def _bisect(cli: Cli, tmp_path: Path, port: str, *extra: str) -> tuple[int, str, str]:
    return cli("bisect", "--pin", "tiny", "--reference", "fake-ref", "--port", port, "--out", str(tmp_path / "out"),
               *extra)


def _never_loaded(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if bisect gets as far as verifying a snapshot (what precedes any weights loading)."""
    import oracles.pins.pin

    def verify(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("the snapshot was verified: the refusal came after loading had begun")

    monkeypatch.setattr(oracles.pins.pin, "verify_snapshot", verify)


@pytest.mark.parametrize("port, status, verdict", [("fake-twin", 0, "verdict: every stage within its budget"),
                                                   ("fake-off", 1, "verdict: the port first diverges at layer 2")])
def test_without_matplotlib_the_verdict_decides_the_exit(fakes: None, tiny: Path, tmp_path: Path, oracles_cli: Cli,
                                                         monkeypatch: pytest.MonkeyPatch, port: str, status: int,
                                                         verdict: str) -> None:
    """No matplotlib: the table, the JSON, one line saying the PNG was not written and why, and the exit
    the verdict decides (before: ModuleNotFoundError after the verdict, exit 1 for both ports)."""
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    code, out, err = _bisect(oracles_cli, tmp_path, port)
    assert (code, err) == (status, PNG_LINE + "\n"), err
    assert verdict in out
    written = sorted((tmp_path / "out").iterdir())
    assert [p.suffix for p in written] == [".json"], written
    assert json.loads(written[0].read_text())["divergent"] == (None if status == 0 else "layer 2")
    assert f"wrote {written[0]}\n" in out


@pytest.mark.parametrize("port, message", [
    ("nope", "oracles bisect: error: --port nope: engine cannot run here: unknown engine 'nope'; known: "),
    ("fake-missing", "oracles bisect: error: --port fake-missing: engine cannot run here: fakelib is not installed "
                     "(pip install 'pytest-oracles[fake]')\n"),
    ("fake-refusing", "oracles bisect: error: --port fake-refusing: fakelib cannot load pin tiny (LlamaForCausalLM): "
                      "no such architecture\n"),
])
def test_a_port_that_cannot_run_is_refused_before_anything_loads(fakes: None, tiny: Path, tmp_path: Path,
                                                                  oracles_cli: Cli, monkeypatch: pytest.MonkeyPatch,
                                                                  port: str, message: str) -> None:
    _never_loaded(monkeypatch)
    code, out, err = _bisect(oracles_cli, tmp_path, port)
    assert (code, out) == (2, "") and err.startswith(message) and err.count("\n") == 1, err
    if port == "nope":
        assert "fake-twin" in err and "(or fault:NAME, a fault port)" in err


def test_a_reference_that_cannot_run_is_refused_before_anything_loads(fakes: None, tiny: Path, oracles_cli: Cli,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    _never_loaded(monkeypatch)
    code, _, err = oracles_cli("bisect", "--pin", "tiny", "--reference", "fake-missing", "--port", "fake-twin")
    assert code == 2 and err == ("oracles bisect: error: --reference fake-missing: engine cannot run here: fakelib is "
                                 "not installed (pip install 'pytest-oracles[fake]')\n")


def test_a_port_whose_build_raises_is_one_line(fakes: None, tiny: Path, tmp_path: Path, oracles_cli: Cli) -> None:
    """The plugin's line for a failed build (oracles.plugin.fixtures.EngineLoader), not a KeyError traceback."""
    code, out, err = _bisect(oracles_cli, tmp_path, "fake-broken")
    assert (code, out) == (2, "") and err.count("\n") == 1, err
    assert err.startswith("oracles bisect: error: engine fake-broken cannot load pin tiny: KeyError: "
                          "'model.layers.0.mlp.gate_proj.weight' (raised at unit/test_bisect_cli_dry.py:"), err
    assert not (tmp_path / "out").exists()


def test_a_missing_snapshot_option_is_blamed_on_the_option(fakes: None, tiny: Path, tmp_path: Path,
                                                           oracles_cli: Cli) -> None:
    """The folder came from --snapshot, not from the (local) pin's source, and the message says so."""
    nope = tmp_path / "nope"
    code, _, err = _bisect(oracles_cli, tmp_path, "fake-twin", "--snapshot", str(nope))
    assert code == 2 and err == (f"oracles bisect: error: snapshot of pin 'tiny' missing: {nope} (given by --snapshot) "
                                 "does not exist; expected the snapshot folder holding the pinned files\n"), err
    (tiny / "config.json").write_bytes(b"{}\n")  # the pin's own folder, changed: blamed on the pin's source
    code, _, err = _bisect(oracles_cli, tmp_path, "fake-twin")
    assert code == 2 and "the snapshot changed since pin 'tiny' was written" in err, err


def test_a_mismatching_snapshot_option_is_blamed_on_the_option(fakes: None, tiny: Path, tmp_path: Path,
                                                               oracles_cli: Cli) -> None:
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_bytes(b"{}\n")
    code, _, err = _bisect(oracles_cli, tmp_path, "fake-twin", "--snapshot", str(other))
    assert code == 2 and err == (f"oracles bisect: error: {other}/config.json: size mismatch: expected 40 bytes, "
                                 "actual 3; the folder was given by --snapshot, not by pin 'tiny''s source\n"), err


def test_a_tokenizer_without_a_chat_template_is_one_line(fakes: None, tiny: Path, oracles_cli: Cli) -> None:
    code, out, err = oracles_cli("bisect", "--pin", "tiny", "--reference", "fake-nochat", "--port", "fake-twin")
    assert (code, out) == (2, "") and err == ("oracles bisect: error: engine 'fake-nochat' cannot render a chat: "
                                              "pin tiny has no chat template\n"), err
