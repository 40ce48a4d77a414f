"""The reference engine: the provider's transformers code, float32, CPU, ``torch.inference_mode``.

The final-norm hidden states are captured with a forward hook on the model's final norm module
(``model.model.norm`` for Llama-family classes), so the head re-run reads exactly what lm_head read.
"""

from __future__ import annotations

import copy
import hashlib
import json
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch

from oracles.engines.base import Generation, Sampler, Step, check_cohort, check_forward_length


class TorchReference:
    """transformers ``AutoModelForCausalLM`` from a verified snapshot, float32 on the CPU.

    Args:
        root: the snapshot folder (config, weights, tokenizer, chat template).
        pin: the pin name, recorded with every figure.
        threads: ``torch.set_num_threads`` value; 0 leaves torch's default.
    """

    id = "torch"

    def __init__(self, root: Path, pin: str, threads: int = 0) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if threads > 0:
            torch.set_num_threads(threads)
        self.pin, self.root = pin, Path(root)
        self.tokenizer = AutoTokenizer.from_pretrained(self.root)
        self.model = AutoModelForCausalLM.from_pretrained(self.root, dtype=torch.float32, device_map="cpu").eval()
        cfg = self.model.config
        self.vocab_size = int(cfg.vocab_size)
        self.hidden_size = int(cfg.hidden_size)
        self.max_context = int(getattr(cfg, "max_position_embeddings", 0) or 0)
        self.eos_token_ids = frozenset(_as_list(self.model.generation_config.eos_token_id or cfg.eos_token_id))
        self.tied = bool(getattr(cfg, "tie_word_embeddings", False))
        norm = self.model.get_decoder().norm
        self._captured: list[torch.Tensor] = []
        norm.register_forward_hook(lambda _m, _i, out: self._captured.append(out))

    def describe(self) -> dict[str, Any]:
        return {"engine": self.id, "class": type(self.model).__name__, "threads": torch.get_num_threads(),
                "dtype": "float32", "device": "cpu", "torch": str(torch.__version__)}

    # -- tokenizer ----------------------------------------------------------------------------
    def chat_ids(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        ids = self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                 tokenize=True, return_dict=False)
        return [int(i) for i in ids]

    def chat_text(self, messages: Sequence[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return str(self.tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt,
                                                      tokenize=False))

    def encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))

    # -- forward and cache --------------------------------------------------------------------
    def make_cache(self) -> Any:
        from transformers import DynamicCache

        return DynamicCache(config=self.model.config)

    def cache_length(self, cache: Any) -> int:
        return int(cache.get_seq_length()) if cache is not None else 0

    @torch.inference_mode()
    def forward(self, ids: Sequence[int], cache: Any | None = None, keep: int = 0) -> Step:
        check_forward_length(self, self.cache_length(cache), len(ids))
        self._captured.clear()
        x = torch.tensor([list(ids)], dtype=torch.long)
        out = self.model(input_ids=x, cache=cache, use_cache=cache is not None, logits_to_keep=keep)
        hidden = self._captured[-1][0]
        if keep:
            hidden = hidden[-keep:]
        self._captured.clear()
        return Step(logits=out.logits[0].float().numpy().copy(), hidden=hidden.float().numpy().copy())

    @torch.inference_mode()
    def decode_cohort(self, tokens: Sequence[int], caches: Sequence[Any]) -> Step:
        """One token for each of ``B`` lanes in one batched transformers forward (contract:
        :meth:`oracles.engines.base.Engine.decode_cohort`).

        transformers' own batching: each lane's ``DynamicCache`` keys/values ``[1, H, L_b, d]`` are
        left-padded with zeros to ``L = max L_b`` and stacked into one batch ``DynamicCache``
        ``[B, H, L, d]``; the 2-D attention mask ``[B, L + 1]`` is 0 on the padding, and the position
        id of lane ``b``'s token is ``L_b`` (its own next position: the cached keys already carry their
        rotary phases). After the forward, the new key/value row of each layer (the batch cache's last
        column) is appended to lane ``b``'s own cache with ``DynamicCache.update``, so each lane cache
        is what a serial one-token forward leaves, and the batch cache is dropped.
        """
        from transformers import DynamicCache

        check_cohort(self, tokens, caches)
        lengths = [self.cache_length(c) for c in caches]
        width = max(lengths)
        batch = DynamicCache(config=self.model.config)
        for layer in range(len(caches[0].layers)):
            if width == 0:
                break  # every lane empty: the batch cache starts empty too
            held = [(c.layers[layer].keys, c.layers[layer].values) for c in caches]
            like_k, like_v = next((k, v) for (k, v), n in zip(held, lengths) if n)
            keys, values = [], []
            for (k, v), n in zip(held, lengths):
                if not n:  # an empty lane (make_cache): its layer has no tensors yet
                    k, v = like_k[:, :, :0], like_v[:, :, :0]
                pad = (0, 0, width - n, 0)  # left-pad the sequence axis (dim -2)
                keys.append(torch.nn.functional.pad(k, pad))
                values.append(torch.nn.functional.pad(v, pad))
            batch.update(torch.cat(keys), torch.cat(values), layer)
        mask = torch.zeros((len(caches), width + 1), dtype=torch.long)
        for b, n in enumerate(lengths):
            mask[b, width - n:] = 1
        positions = torch.tensor([[n] for n in lengths], dtype=torch.long)
        x = torch.tensor([[int(t)] for t in tokens], dtype=torch.long)
        self._captured.clear()
        out = self.model(input_ids=x, attention_mask=mask, position_ids=positions, cache=batch, use_cache=True)
        hidden = self._captured[-1][:, -1]
        self._captured.clear()
        for layer, entry in enumerate(batch.layers):
            for b, c in enumerate(caches):
                c.update(entry.keys[b:b + 1, :, -1:].clone(), entry.values[b:b + 1, :, -1:].clone(), layer)
        return Step(logits=out.logits[:, -1].float().numpy().copy(), hidden=hidden.float().numpy().copy())

    @torch.inference_mode()
    def lm_head(self, hidden: np.ndarray) -> np.ndarray:
        h = torch.from_numpy(np.ascontiguousarray(hidden, dtype=np.float32))
        return self.model.get_output_embeddings()(h).float().numpy().copy()

    def snapshot(self, cache: Any) -> Any:
        return copy.deepcopy(cache)

    def restore(self, snapshot: Any) -> Any:
        return copy.deepcopy(snapshot)

    def snapshot_digest(self, snapshot: Any) -> str:
        h = hashlib.sha256()
        for layer in snapshot.layers:
            for name in ("keys", "values"):
                t = getattr(layer, name, None)
                if t is None:
                    h.update(b"N")
                    continue
                a = t.detach().float().contiguous().numpy().astype("<f4")
                h.update(json.dumps(list(a.shape)).encode())
                h.update(a.tobytes())
        return h.hexdigest()

    # -- generation ---------------------------------------------------------------------------
    @torch.inference_mode()
    def generate(self, ids: Sequence[int], sampler: Sampler, max_new_tokens: int) -> Generation:
        """transformers' own ``generate`` (greedy, or sampled with ``torch.manual_seed(seed)``)."""
        from transformers import GenerationConfig

        x = torch.tensor([list(ids)], dtype=torch.long)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=not sampler.greedy,
                               eos_token_id=sorted(self.eos_token_ids), pad_token_id=min(self.eos_token_ids),
                               output_logits=True, return_dict_in_generate=True,
                               **({} if sampler.greedy else {"temperature": sampler.temperature,
                                                             "top_p": sampler.top_p, "top_k": sampler.top_k}))
        torch.manual_seed(sampler.seed)
        timer = _FirstTokenTimer()
        start = time.perf_counter()
        out = self.model.generate(x, generation_config=cfg, streamer=timer)
        end = time.perf_counter()
        tokens = [int(t) for t in out.sequences[0, len(ids):]]
        finish = "stop" if tokens and tokens[-1] in self.eos_token_ids else "length"
        logits = torch.stack([s[0] for s in out.logits]).float().numpy() if out.logits else np.zeros((0, self.vocab_size), "<f4")
        first = timer.first_token_at or end
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish, step_logits=logits,
                          prefill_seconds=first - start, decode_seconds=end - first)


    # -- speculative (added for the mtplx speculative oracles) --------------------------------
    def trim(self, cache: Any, n: int) -> bool:
        """Drop the last ``n`` cached positions in place (``DynamicCache.crop(-n)``: transformers 5 takes
        the count to remove as a negative int); always possible here."""
        if n:
            cache.crop(-n)
        return True

    @torch.inference_mode()
    def speculative(self, ids: Sequence[int], draft: "TorchReference", num_draft: int, max_new_tokens: int) -> Generation:
        """transformers' own assisted generation, greedy: ``generate(assistant_model=draft.model)``
        with a constant ``num_draft`` draft tokens a cycle (no confidence cut-off)."""
        from transformers import GenerationConfig

        x = torch.tensor([list(ids)], dtype=torch.long)
        cfg = GenerationConfig(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=sorted(self.eos_token_ids),
                               pad_token_id=min(self.eos_token_ids), num_assistant_tokens=num_draft,
                               num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
        start = time.perf_counter()
        out = self.model.generate(x, generation_config=cfg, assistant_model=draft.model)
        end = time.perf_counter()
        tokens = [int(t) for t in out[0, len(ids):]]
        if self.eos_token_ids & set(tokens):  # assisted generation may run past a stop inside an accepted window
            tokens = tokens[: next(i for i, t in enumerate(tokens) if t in self.eos_token_ids) + 1]
        finish = "stop" if tokens and tokens[-1] in self.eos_token_ids else "length"
        return Generation(tokens=tokens, text=self.decode(tokens), finish_reason=finish,
                          step_logits=np.zeros((0, self.vocab_size), "<f4"), prefill_seconds=0.0,
                          decode_seconds=end - start, extra={"num_draft": num_draft, "assisted": True})

class _FirstTokenTimer:
    """A minimal streamer: notes when the first generated token arrives (prefill end)."""

    def __init__(self) -> None:
        self.calls = 0
        self.first_token_at: float | None = None

    def put(self, value: Any) -> None:
        self.calls += 1
        if self.calls == 2:  # the first put is the prompt itself
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


def _as_list(value: Any) -> list[int]:
    if value is None:
        return []
    return [int(v) for v in value] if isinstance(value, (list, tuple)) else [int(value)]
