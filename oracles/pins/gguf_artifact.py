"""A user's GGUF as an artifact kind (:mod:`oracles.pins.artifact_kinds`): its facts, read before it is pinned.

From the header (:mod:`oracles.pins.gguf_file`, no llama.cpp): truncation, the architecture, the
vocabulary (``tokenizer.ggml.tokens``), ``<arch>.embedding_length`` and ``<arch>.block_count``, and the
precision from its tensor types (:mod:`oracles.pins.gguf_precision`).

Whether llama.cpp knows the architecture is asked of the library the ``llamacpp`` engine runs: the file
is loaded with ``vocab_only`` (``llama_model_load_from_file`` reads the architecture, its hyperparameters
and the vocabulary, no tensor data: milliseconds), and an ``unknown model architecture`` refusal is one
line naming ``general.architecture``. The ``gguf`` package's ``MODEL_ARCH_NAMES`` is not that list: at
gguf 0.19.0 it names 126 architectures, each of which llama-cpp-py-sync 0.11739's libllama loads, while
that libllama knows 35 more (``deepseek4``, ``eagle3``, ``qwen3tts``, ...), measured by loading a
header-only GGUF of each name; a pin checked against the package would refuse files the engine runs.

The tokenizer the engine uses is the GGUF's own (llama.cpp's); the pin carries the reference's tokenizer
files, so :func:`check_reference` holds the GGUF's vocabulary strings to the reference's tokenizer.json
here and the engine's canary check holds llama.cpp's encoding to the reference's recorded ids at load.
"""

from __future__ import annotations

from pathlib import Path

from oracles.errors import OracleError, PinError
from oracles.pins.artifact_kinds import ArtifactFacts
from oracles.pins.gguf_file import GgufHeader, read_header, vocabulary_disagreement
from oracles.pins.gguf_pins import TOKENIZER_COPIES
from oracles.pins.gguf_precision import gguf_precision
from oracles.pins.precision import Precision

#: The engine that loads a GGUF.
ENGINE = "llamacpp"
#: The reference's files a GGUF pin's snapshot carries: its tokenizer and chat template.
COMPANIONS = TOKENIZER_COPIES
#: What llama.cpp logs when a file's ``general.architecture`` is not one of its own.
UNKNOWN_ARCH = "unknown model architecture"


def llama_cpp_refusal(path: Path) -> str | None:
    """llama.cpp's own reason for refusing to load ``path``'s architecture, hyperparameters and vocabulary
    (a ``vocab_only`` load: no tensor data): its error lines of that load, joined; None when it loads them.

    Raises:
        PinError: llama-cpp-py-sync is not installed, or its library cannot be opened.
    """
    try:
        from oracles.engines.llamacpp.native import load_library
        from oracles.engines.llamacpp.runtime import LOG, _install_log
    except ImportError as exc:
        raise PinError(f"{path}: pinning a GGUF asks llama.cpp whether it loads it, and llama-cpp-py-sync cannot be "
                       f"imported ({exc}; pip install 'pytest-oracles[llamacpp]')") from None
    try:
        loaded = load_library()
    except OracleError as exc:
        raise PinError(f"{path}: pinning a GGUF asks llama.cpp whether it loads it: {exc}") from None
    lib, ffi = loaded.lib, loaded.ffi
    _install_log(ffi, lib)
    params = lib.llama_model_default_params()
    params.vocab_only = True
    LOG.clear()
    model = lib.llama_model_load_from_file(str(path).encode(), params)
    if model != ffi.NULL:
        lib.llama_model_free(model)
        return None
    errors = [text.strip() for level, text in LOG if level == 4 and text.strip()]  # 4: GGML_LOG_LEVEL_ERROR
    return "; ".join(errors) or "llama_model_load_from_file failed"


def _tag() -> str:
    """The llama.cpp build the binding ships (``b11739 (commit)``)."""
    from llama_cpp_py_sync import _version

    return f"{_version.__llama_cpp_tag__} ({_version.__llama_cpp_commit__})"


def _int(header: GgufHeader, key: str) -> int | None:
    value = header.metadata.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def read_facts(path: Path) -> ArtifactFacts:
    """The facts of the GGUF at ``path`` (module docstring).

    Raises:
        PinError: not a GGUF, a truncated file (the tensor it cuts named), no ``general.architecture``, an
            architecture llama.cpp does not know or a file it cannot load (its reason quoted), or a
            precision not known here; one line naming the file and the field.
    """
    header = read_header(path)
    header.check_complete()
    arch = header.architecture
    if arch is None:
        raise PinError(f"{path}: field 'general.architecture' is missing: llama.cpp cannot tell which model it is")
    if (why := llama_cpp_refusal(path)) is not None:
        if UNKNOWN_ARCH in why:
            raise PinError(f"{path}: field 'general.architecture' is {arch!r}, which llama.cpp {_tag()} does not know "
                           f"({why})")
        raise PinError(f"{path}: llama.cpp {_tag()} cannot load it: {why}")
    precision = gguf_precision(header)
    tokens = header.tokens
    vocab = len(tokens) if tokens is not None else _int(header, f"{arch}.vocab_size")
    return ArtifactFacts(
        path=path, kind="gguf", architecture=arch, vocab_size=vocab,
        hidden_size=_int(header, f"{arch}.embedding_length"), num_layers=_int(header, f"{arch}.block_count"),
        precision=precision, extra=header,
        fields={"vocab_size": "tokenizer.ggml.tokens" if tokens is not None else f"{arch}.vocab_size",
                "hidden_size": f"{arch}.embedding_length", "num_layers": f"{arch}.block_count"})


def read_precision(path: Path) -> Precision:
    """The precision of the GGUF at ``path``, from its header alone (:mod:`oracles.pins.gguf_precision`).

    Raises:
        PinError: not a GGUF, or a type whose precision is not known here.
    """
    return gguf_precision(read_header(path))


def check_reference(facts: ArtifactFacts, reference_root: Path) -> None:
    """The GGUF's vocabulary strings against the reference's tokenizer.json, id by id.

    Raises:
        PinError: the GGUF has no vocabulary, or it differs (count, or the first differing id with both
            strings and how many differ): one line naming the file and ``tokenizer.ggml.tokens``.
    """
    header: GgufHeader = facts.extra
    if (why := vocabulary_disagreement(header, reference_root / "tokenizer.json")) is not None:
        raise PinError(why)
