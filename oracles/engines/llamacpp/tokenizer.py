"""llama.cpp's own tokenizer (from the GGUF's vocabulary and merges) as an
:class:`oracles.engines.types.Tokenizer`.

``encode`` is ``llama_tokenize(text, add_special, parse_special=True)`` (special-token text such as
``<|im_start|>`` becomes its id, as transformers' ``encode`` does); ``decode`` is ``llama_detokenize``
with the special tokens' text kept (``unparse_special``) unless skipped.

A chat is rendered from the GGUF's ``tokenizer.chat_template`` (``llama_model_chat_template``) in one of
llama.cpp's two ways, :attr:`LlamaTokenizer.chat_mode`:

- ``"jinja"`` (the default): the template run as a Jinja template, as llama.cpp's ``--jinja`` mode
  (llama-server, llama-cli) runs it with its own Jinja engine; here in a sandboxed jinja2 environment
  with ``trim_blocks`` and ``lstrip_blocks`` (transformers' settings), ``bos_token`` / ``eos_token``
  the vocabulary's;
- ``"builtin"``: ``llama_chat_apply_template``, the only renderer in libllama's C API. It does not run
  the template: it recognises it among llama.cpp's built-in formats by substrings (``<|im_start|>``:
  ChatML) and renders that format, so the template's own logic is lost (SmolLM2's default system
  message, added when the first message is not a system one, is missing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from oracles.errors import OracleError

if TYPE_CHECKING:
    from oracles.engines.llamacpp.runtime import Runtime

#: How a chat is rendered (module docstring).
CHAT_MODES = ("jinja", "builtin")


class LlamaTokenizer:
    """The GGUF vocabulary's tokenizer, through the loaded model's ``llama_vocab``.

    ``chat_template``: the GGUF's ``tokenizer.chat_template`` (None when the file has none).
    """

    def __init__(self, rt: "Runtime", chat_mode: str = "jinja") -> None:
        if chat_mode not in CHAT_MODES:
            raise ValueError(f"llama.cpp tokenizer: chat_mode {chat_mode!r} is not one of {', '.join(CHAT_MODES)}")
        self.rt, self.chat_mode = rt, chat_mode
        self.chat_template: str | None = rt.chat_template()

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` (``add_special_tokens``: the BOS/EOS the vocabulary adds)."""
        lib, ffi, raw = self.rt.lib, self.rt.ffi, text.encode("utf-8")
        room = len(raw) + 8
        buf = ffi.new("llama_token[]", room)
        n = int(lib.llama_tokenize(self.rt.vocab, raw, len(raw), buf, room, add_special_tokens, True))
        if n < 0:  # -n ids needed
            room = -n
            buf = ffi.new("llama_token[]", room)
            n = int(lib.llama_tokenize(self.rt.vocab, raw, len(raw), buf, room, add_special_tokens, True))
        return [int(buf[i]) for i in range(n)]

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """The text of ``token_ids`` (special tokens' text kept unless ``skip_special_tokens``)."""
        lib, ffi = self.rt.lib, self.rt.ffi
        ids = ffi.new("llama_token[]", [int(i) for i in token_ids] or [0])
        room = 16 * len(token_ids) + 16
        for _ in range(2):
            buf = ffi.new("char[]", room)
            n = int(lib.llama_detokenize(self.rt.vocab, ids, len(token_ids), buf, room, skip_special_tokens,
                                         not skip_special_tokens))
            if n >= 0:
                return str(ffi.buffer(buf, n)[:].decode("utf-8", "replace"))
            room = -n + 1
        raise OracleError(f"{self.rt.gguf}: llama_detokenize asked for {room} bytes twice")

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        """The vocabulary strings of ``ids`` (``llama_vocab_get_text``)."""
        ffi, lib = self.rt.ffi, self.rt.lib
        return [str(ffi.string(lib.llama_vocab_get_text(self.rt.vocab, int(i))).decode("utf-8", "replace"))
                for i in ids]

    def render(self, conversation: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        """``conversation`` rendered from :attr:`chat_template` the :attr:`chat_mode` way (module docstring).

        Raises:
            OracleError: no chat template, one Jinja cannot run, or (builtin) one llama.cpp does not recognise.
        """
        if not self.chat_template:
            raise OracleError(f"{self.rt.gguf}: field 'tokenizer.chat_template' is missing")
        if self.chat_mode == "jinja":
            return self.render_jinja(conversation, add_generation_prompt)
        return self.render_builtin(conversation, add_generation_prompt)

    def _token_text(self, token: int) -> str | None:
        if token < 0:
            return None
        return str(self.rt.ffi.string(self.rt.lib.llama_vocab_get_text(self.rt.vocab, token)).decode("utf-8", "replace"))

    def render_jinja(self, conversation: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        """:attr:`chat_template` run as a Jinja template (module docstring).

        Raises:
            OracleError: jinja2 cannot compile or run it (its message quoted).
        """
        from jinja2.exceptions import TemplateError
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message: str) -> None:
            raise TemplateError(message)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = raise_exception
        lib, vocab = self.rt.lib, self.rt.vocab
        try:
            return str(env.from_string(str(self.chat_template)).render(
                messages=list(conversation), add_generation_prompt=add_generation_prompt,
                bos_token=self._token_text(int(lib.llama_vocab_bos(vocab))),
                eos_token=self._token_text(int(lib.llama_vocab_eos(vocab)))))
        except TemplateError as exc:
            raise OracleError(f"{self.rt.gguf}: field 'tokenizer.chat_template': jinja2: {exc}") from None

    def render_builtin(self, conversation: Sequence[dict[str, str]], add_generation_prompt: bool) -> str:
        """``conversation`` rendered by ``llama_chat_apply_template`` on :attr:`chat_template`.

        Raises:
            OracleError: llama.cpp does not recognise the template (returns < 0).
        """
        lib, ffi = self.rt.lib, self.rt.ffi
        keep = [(ffi.new("char[]", m["role"].encode()), ffi.new("char[]", m["content"].encode())) for m in conversation]
        msgs = ffi.new("llama_chat_message[]", len(keep))
        for i, (role, content) in enumerate(keep):
            msgs[i].role, msgs[i].content = role, content
        tmpl = str(self.chat_template or "").encode()
        room = 2 * sum(len(m["content"]) + len(m["role"]) + 32 for m in conversation) + 256
        for _ in range(2):
            buf = ffi.new("char[]", room)
            n = int(lib.llama_chat_apply_template(tmpl, msgs, len(keep), add_generation_prompt, buf, room))
            if n < 0:
                raise OracleError(f"{self.rt.gguf}: field 'tokenizer.chat_template': llama_chat_apply_template "
                                  "does not recognise it as one of llama.cpp's built-in formats")
            if n <= room:
                return str(ffi.buffer(buf, n)[:].decode("utf-8"))
            room = n + 1
        raise OracleError(f"{self.rt.gguf}: llama_chat_apply_template asked for {room} bytes twice")

    def apply_chat_template(self, conversation: list[dict[str, str]], *, add_generation_prompt: bool = True,
                            tokenize: bool = True, return_dict: bool = False, **_: Any) -> Any:
        """Token ids (``tokenize``) or text of ``conversation`` rendered by llama.cpp (module docstring).

        Raises:
            OracleError: as :meth:`render`; ``return_dict=True`` (not served).
        """
        if return_dict:
            raise OracleError("the llama.cpp tokenizer renders ids or text, not a dict (return_dict=False)")
        text = self.render(conversation, add_generation_prompt)
        return self.encode(text, add_special_tokens=False) if tokenize else text
