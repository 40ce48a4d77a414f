"""The LiteRT conversion, run by the converter environment's python (``python litert_script.py JOB``).

This file is executed in the separate converter environment (litert-torch, torch, ai-edge-litert;
no ``oracles``), so it imports only the standard library at module level and litert-torch inside
:func:`convert`. ``JOB`` is a JSON file written by :mod:`oracles.pins.litert`::

    {"source": SNAPSHOT, "out": FOLDER, "file": "model.tflite",
     "options": {"prefill_len": 64, "kv_cache_max_len": 512, "quantize": "none",
                 "output_logits_on_prefill": true}}

The generative export (the default) builds litert-torch's Edge Generative decoder
(``model_builder.DecoderOnlyModel``) from the snapshot's Llama ``config.json`` at its own sizes, loads
the snapshot's safetensors with the builder's own loader, and writes ``FOLDER/FILE`` with the
signatures ``prefill_<prefill_len>`` and ``decode`` over an external KV cache of ``kv_cache_max_len``
rows. With ``"options": {"export": "plain", "seq_len": T}`` it converts the transformers model itself
with ``litert_torch.convert`` on one ``[1, T]`` batch of ids instead (:func:`convert_plain`). On success
it prints one JSON line with the signatures it wrote; any error exits non-zero with the converter's
traceback on stderr.

The shim: litert-torch 0.10.0's ``generative/layers/lora.py`` imports
``tensorflow.lite.python.schema_py_generated``, but TensorFlow is not among its dependencies; the same
generated flatbuffer schema ships as ``ai_edge_litert.schema_py_generated``. :func:`install_shim` puts
that module in ``sys.modules`` under ``tensorflow.lite.python`` only (``import tensorflow`` itself still
fails, so nothing else mistakes this for a TensorFlow install).
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

#: The one module the converter imports from TensorFlow, and where the same module really is.
SHIM = {"tensorflow.lite.python.schema_py_generated": "ai_edge_litert.schema_py_generated"}


def install_shim() -> None:
    """Alias the schema module TensorFlow would hold to ai-edge-litert's copy (see the module docstring)."""
    import importlib

    for alias, real in SHIM.items():
        module = importlib.import_module(real)
        parent_name, _, leaf = alias.rpartition(".")
        parent = types.ModuleType(parent_name)
        setattr(parent, leaf, module)
        sys.modules.setdefault(parent_name, parent)
        sys.modules.setdefault(alias, module)


def llama_config(config: dict[str, Any], kv_rows: int) -> Any:
    """litert-torch's ``ModelConfig`` of a transformers ``LlamaForCausalLM`` ``config.json`` (dict).

    Raises:
        ValueError: the config is not a Llama the decoder builder reproduces (class, biases, rope type,
            untied head, activation), naming the field.
    """
    import litert_torch.generative.layers.model_config as cfg

    if config.get("architectures") != ["LlamaForCausalLM"]:
        raise ValueError(f"config.json: field 'architectures' is {config.get('architectures')!r}, not ['LlamaForCausalLM']")
    for field, want in (("attention_bias", False), ("mlp_bias", False), ("hidden_act", "silu"),
                        ("tie_word_embeddings", True)):
        if config.get(field, want) != want:
            raise ValueError(f"config.json: field {field!r} is {config.get(field)!r}; the builder needs {want!r}")
    rope = config.get("rope_parameters") or {"rope_theta": config.get("rope_theta", 10000.0), "rope_type": "default"}
    if rope.get("rope_type", "default") != "default":
        raise ValueError(f"config.json: field 'rope_parameters.rope_type' is {rope.get('rope_type')!r}, not 'default'")
    heads = int(config["num_attention_heads"])
    head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)
    norm = cfg.NormalizationConfig(type=cfg.NormalizationType.RMS_NORM, epsilon=float(config["rms_norm_eps"]))
    block = cfg.TransformerBlockConfig(
        attn_config=cfg.AttentionConfig(num_heads=heads, head_dim=head_dim,
                                        num_query_groups=int(config["num_key_value_heads"]),
                                        rotary_base=float(rope["rope_theta"]), rotary_percentage=1.0),
        ff_config=cfg.FeedForwardConfig(type=cfg.FeedForwardType.GATED,
                                        activation=cfg.ActivationConfig(cfg.ActivationType.SILU),
                                        intermediate_size=int(config["intermediate_size"])),
        pre_attention_norm_config=norm, post_attention_norm_config=norm)
    return cfg.ModelConfig(vocab_size=int(config["vocab_size"]), num_layers=int(config["num_hidden_layers"]),
                           max_seq_len=min(int(config["max_position_embeddings"]), kv_rows),
                           embedding_dim=int(config["hidden_size"]), block_configs=block, final_norm_config=norm)


def hidden_out(model: Any) -> Any:
    """``model`` (a ``DecoderOnlyModel``) wrapped so each signature also outputs ``hidden``, the final
    norm's output ``[1, T, D]`` float32 that its LM head reads; ``logits`` stays that head's output.

    The decoder's own head is replaced by the identity (so its ``logits`` output is the hidden state)
    and the wrapper applies the original head (weights tied to the embedding, as loaded) after it.
    """
    import torch

    class HiddenOut(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner, self.head, self.config = inner, inner.lm_head, inner.config
            inner.lm_head = torch.nn.Identity()

        @torch.inference_mode()
        def forward(self, tokens: Any, input_pos: Any, kv_cache: Any, mask: Any = None, lora: Any = None,
                    export_config: Any = None) -> dict[str, Any]:
            out = self.inner(tokens, input_pos, kv_cache, mask=mask, lora=lora, export_config=export_config)
            return {"logits": self.head(out["logits"]), "hidden": out["logits"], "kv_cache": out["kv_cache"]}

    return HiddenOut(model)


def convert(job: dict[str, Any]) -> dict[str, Any]:
    """Build and convert the decoder of ``job["source"]`` into ``job["out"] / job["file"]``.

    Returns what it wrote: ``{"file", "signatures": {name: {"inputs", "outputs"}}, "model_config"}``.

    Raises:
        ValueError: as :func:`llama_config`; whatever litert-torch raises.
    """
    install_shim()
    if job["options"].get("export") == "plain":
        return convert_plain(job)
    import torch
    from litert_torch.generative.utilities import converter, export_config, model_builder

    torch.manual_seed(0)
    source, out, options = Path(job["source"]), Path(job["out"]), dict(job["options"])
    kv_rows, prefill = int(options["kv_cache_max_len"]), int(options["prefill_len"])
    config = llama_config(json.loads((source / "config.json").read_text(encoding="utf-8")), kv_rows)
    model = model_builder.build_decoder_only_model(checkpoint_path=str(source), config=config,
                                                   tensor_names=model_builder.TENSOR_NAMES,
                                                   model_class=model_builder.DecoderOnlyModel, mask_cache_size=kv_rows)
    model = hidden_out(model)
    exported = export_config.ExportConfig(output_logits_on_prefill=bool(options["output_logits_on_prefill"]))
    with _tempdir(out) as tmp:
        written = Path(converter.convert_to_tflite(model, output_path=str(tmp), output_name_prefix="model",
                                                   prefill_seq_len=prefill, kv_cache_max_len=kv_rows,
                                                   quantize=str(options["quantize"]), export_config=exported))
        written.replace(out / job["file"])
    from ai_edge_litert import interpreter

    runner = interpreter.Interpreter(model_path=str(out / job["file"]))
    signatures = {name: {"inputs": sorted(spec["inputs"]), "outputs": sorted(spec["outputs"])}
                  for name, spec in runner.get_signature_list().items()}
    return {"file": job["file"], "signatures": signatures,
            "model_config": {k: config_field(config, k) for k in ("vocab_size", "num_layers", "embedding_dim",
                                                                  "max_seq_len")}}


def plain_module(model: Any) -> Any:
    """``model`` (a transformers causal LM) as the module a plain graph is converted from: ids
    ``input_ids`` int64 ``[1, T]`` in; ``{"logits": [1, T, V], "hidden": [1, T, D]}`` float32 out, where
    ``hidden`` is the decoder's ``last_hidden_state`` (the final norm's output) and ``logits`` the output
    embedding applied to it, as the model's own forward computes them (:func:`convert_plain` checks that
    bit for bit before converting)."""
    import torch

    class Plain(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any) -> dict[str, Any]:
            hidden = self.inner.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
            return {"logits": self.inner.get_output_embeddings()(hidden), "hidden": hidden}

    return Plain(model).eval()


def convert_plain(job: dict[str, Any]) -> dict[str, Any]:
    """Convert the transformers model of ``job["source"]`` with ``litert_torch.convert`` on a ``[1, T]``
    batch of ids (``T = job["options"]["seq_len"]``) into ``job["out"] / job["file"]``: one signature,
    input ``input_ids`` int32 ``[1, T]``, outputs ``logits`` and ``hidden`` (:func:`plain_module`).

    Raises:
        ValueError: the wrapper's logits differ from the model's own forward on a seeded batch (a model
            whose head is more than its output embedding, a soft cap say), naming the max difference.
    """
    import torch
    from litert_torch import convert as litert_convert
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    source, out, t = Path(job["source"]), Path(job["out"]), int(job["options"]["seq_len"])
    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    module = plain_module(model)
    ids = torch.randint(0, int(model.config.vocab_size), (1, t), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        wrapped, own = module(ids)["logits"], model(input_ids=ids, use_cache=False).logits
    if not torch.equal(wrapped, own):
        raise ValueError(f"{source}: the plain wrapper's logits differ from the model's own forward by up to "
                         f"{float((wrapped - own).abs().max())}; its head is more than get_output_embeddings()")
    with _tempdir(out) as tmp:
        litert_convert(module, sample_kwargs={"input_ids": torch.zeros((1, t), dtype=torch.int64)}).export(
            str(tmp / job["file"]))
        (tmp / job["file"]).replace(out / job["file"])
    from ai_edge_litert import interpreter

    runner = interpreter.Interpreter(model_path=str(out / job["file"]))
    signatures = {name: {"inputs": sorted(spec["inputs"]), "outputs": sorted(spec["outputs"])}
                  for name, spec in runner.get_signature_list().items()}
    return {"file": job["file"], "signatures": signatures,
            "model_config": {"seq_len": t, "vocab_size": int(model.config.vocab_size),
                             "hidden_size": int(model.config.hidden_size)}}


def config_field(config: Any, name: str) -> Any:
    return getattr(config, name)


class _tempdir:
    """A temporary folder inside ``parent`` (the converter names its output itself), removed after."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    def __enter__(self) -> Path:
        import tempfile

        self.path = Path(tempfile.mkdtemp(prefix=".convert.", dir=self.parent))
        return self.path

    def __exit__(self, *exc: object) -> None:
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)


def main(argv: list[str]) -> int:
    """``python litert_script.py JOB.json``: convert, print the result as one JSON line; 0 on success."""
    if len(argv) != 2:
        print("usage: litert_script.py JOB.json", file=sys.stderr)
        return 2
    print(json.dumps(convert(json.loads(Path(argv[1]).read_text(encoding="utf-8"))), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
