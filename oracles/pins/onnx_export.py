"""``onnx-export:PIN``: an ``.onnx`` made from a pinned snapshot, pinned by digest.

Two tools, named by the pin's ``recipe.tool``:

* ``torch.onnx.export`` (torch's own exporter, ``dynamo=True``: ``torch.export`` then onnxscript's
  translation and optimiser) of a transformers causal LM from a float32 safetensors snapshot. The
  exported module (:func:`decoder_with_past`) takes ``input_ids`` and one ``past_key_values.<i>.key /
  .value`` per layer, fills a transformers ``DynamicCache`` from them, runs the model's decoder at
  positions ``past .. past + seq - 1`` and returns ``logits``, ``hidden`` (the final norm's output) and
  ``present.<i>.key / .value``, the layout :mod:`oracles.engines.onnx.artifact` reads. The sequence and
  the past are dynamic axes (a named-argument forward with ``dynamic_shapes``; torch 2.13 fails to
  convert a ``*past`` signature with ``dynamic_axes``). Written as ``model.onnx`` and its external-data
  file ``model.onnx.data`` (:data:`EXPORT_OPTIONS`).
* ``onnxruntime.quantization.quantize_dynamic`` of a pin that is itself such an export
  (``onnx-export:FLOAT-ONNX-PIN`` whose recipe says this tool): int8 weights, activations quantized to
  uint8 per tensor at run time (:data:`QUANTIZE_OPTIONS`), one ``model.onnx`` (no external data).

The export's node metadata (Python stack traces with this checkout's paths) is cleared
(:func:`strip_node_metadata`), so the bytes do not depend on where the checkout lives.
Both copy the source's ``config.json``, ``generation_config.json`` and tokenizer files beside the
``.onnx`` (ONNX Runtime has no tokenizer; the engine reads the model facts and the tokenizer from them).
The recipe records the tool, the packages and versions it ran with (:data:`PACKAGES`) and the options,
and a build checks the installed versions against it: two builds with the same versions gave the same
bytes (the float32 export and the int8 quantization of the draft twin, each built twice in separate
processes: every file's sha256 equal), so the result is checked by the pinned sha256 like every file.

The exporter runs in this environment (torch is the reference's; onnx, onnxscript and onnx-ir, 40 MB
installed, are the ``onnx`` extra beside onnxruntime): it needs nothing torch does not already bring.
torch, transformers, onnx and onnxruntime are imported inside the functions, never at module import.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from oracles.errors import PinError
from oracles.pins.convert import model_class_of, versions
from oracles.pins.converter_env import copy_beside
from oracles.pins.pin import TOKENIZER_FILES, Pin

EXPORT_TOOL = "torch.onnx.export"
QUANTIZE_TOOL = "onnxruntime.quantization.quantize_dynamic"
#: The distributions whose versions make each tool's bytes (recorded in ``recipe.packages``, checked at a build).
PACKAGES = {EXPORT_TOOL: ("torch", "transformers", "onnx", "onnxscript", "onnx-ir"),
            QUANTIZE_TOOL: ("onnxruntime", "onnx")}
#: ``torch.onnx.export`` options a recipe may give, with the values the built-in pins use.
EXPORT_OPTIONS: dict[str, Any] = {"dynamo": True, "opset_version": 18, "external_data": True, "optimize": True}
#: ``quantize_dynamic`` options a recipe may give, with the defaults the built-in pins use (the function's own:
#: int8 weights, per tensor, full range).
QUANTIZE_OPTIONS: dict[str, Any] = {"weight_type": "QInt8", "per_channel": False, "reduce_range": False}
#: Files copied from the source snapshot beside the .onnx (model facts, tokenizer, chat template).
COPIED = ("config.json", "generation_config.json", *TOKENIZER_FILES)
#: The artifact's file name in its snapshot folder (its external data: ``model.onnx.data``).
ONNX = "model.onnx"


def options_of(pin: Pin) -> tuple[str, dict[str, Any]]:
    """(tool, options) of ``pin``: ``recipe.arguments`` over the tool's defaults.

    Raises:
        PinError: a tool this source does not make, or an option the tool does not take (pin file and field).
    """
    recipe = pin.recipe or {}
    tool = str(recipe.get("tool"))
    defaults = {EXPORT_TOOL: EXPORT_OPTIONS, QUANTIZE_TOOL: QUANTIZE_OPTIONS}.get(tool)
    if defaults is None:
        raise PinError(f"{pin.path}: field 'recipe.tool' is {tool!r}; an onnx-export: source is made by {EXPORT_TOOL} "
                       f"or {QUANTIZE_TOOL}")
    given = dict(recipe.get("arguments", {}))
    if bad := sorted(set(given) - set(defaults)):
        raise PinError(f"{pin.path}: field 'recipe.arguments.{bad[0]}' is not a {tool} option this source passes "
                       f"({', '.join(defaults)})")
    return tool, {**defaults, **given}


def installed(tool: str) -> dict[str, str]:
    """The installed version of each of the tool's :data:`PACKAGES` (those missing left out)."""
    return versions(PACKAGES[tool])


def onnx_builder(pin: Pin, source: tuple[Path, str, str],
                 write_pin: bool) -> tuple[Callable[[Path], str], str, dict[str, str]]:
    """(build function ``out -> model class``, source digest, the precision the artifact has) of an
    ``onnx-export:`` pin whose ``source`` (folder, digest, name: :func:`oracles.pins.materialize.source_of`) is
    materialised; unless ``write_pin``, the source's digest and the installed packages' versions
    must be the pin's (the versions that gave the pinned bytes).

    Raises:
        PinError: the source digest or a package version differs from the pin's, the tool does not fit the
            source (an export of an .onnx, a quantization of a safetensors snapshot), or an unknown option.
    """
    tool, options = options_of(pin)
    root, digest, called = source
    if not write_pin and pin.source_sha256 != digest:
        raise PinError(f"{pin.path}: field 'source_sha256' is {pin.source_sha256} but the source {pin.source!r} has "
                       f"digest {digest}")
    recorded = dict((pin.recipe or {}).get("packages", {}))
    if not write_pin and recorded != installed(tool):
        raise PinError(f"{pin.path}: field 'recipe.packages' is {recorded} but {tool} here runs with {installed(tool)}; "
                       "install the pinned versions (constraints.txt) to rebuild the pinned bytes")
    source_onnx = root / ONNX
    if (tool == QUANTIZE_TOOL) != source_onnx.is_file():
        need = f"an .onnx ({ONNX}) to quantize" if tool == QUANTIZE_TOOL else "a safetensors snapshot to export"
        raise PinError(f"{pin.path}: field 'recipe.tool' is {tool!r}, which needs {need}; source {called} is not one")
    if tool == QUANTIZE_TOOL:
        return (lambda out: quantize_onnx(root, out, options)), digest, {"weights": "int8", "compute": "dynamic_uint8"}
    return (lambda out: export_onnx(root, out, options)), digest, {}


def decoder_with_past(model: Any) -> Any:
    """``model`` (a transformers causal LM) as the module the export traces: ``forward(input_ids [1, T] int64,
    past_key_values: list of 2L float32 [1, H_kv, P, Dh], keys and values of layer 0, 1, ...)`` ->
    ``(logits [1, T, V], hidden [1, T, D], present key 0, present value 0, ...)``, each present
    ``[1, H_kv, P + T, Dh]``; positions ``P .. P + T - 1``."""
    import torch
    from transformers.cache_utils import DynamicCache

    class DecoderWithPast(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any, past_key_values: list[Any]) -> tuple[Any, ...]:
            cache = DynamicCache(config=self.inner.config)
            for i in range(len(past_key_values) // 2):
                cache.update(past_key_values[2 * i], past_key_values[2 * i + 1], i)
            start = past_key_values[0].shape[2]
            positions = torch.arange(start, start + input_ids.shape[1], dtype=torch.int64).unsqueeze(0)
            hidden = self.inner.get_decoder()(input_ids=input_ids, cache=cache, position_ids=positions,
                                              use_cache=True).last_hidden_state
            layers: Any = cache.layers  # full-attention layers: each holds keys and values [1, H_kv, P + T, Dh]
            present = [t for layer in layers for t in (layer.keys, layer.values)]
            return (self.inner.get_output_embeddings()(hidden), hidden, *present)

    return DecoderWithPast(model).eval()


def export_onnx(source: Path, out: Path, options: dict[str, Any]) -> str:
    """Export the transformers model of ``source`` to ``out/model.onnx`` (+ ``model.onnx.data``) with
    ``torch.onnx.export(**options)`` and copy the source's config and tokenizer files beside it; returns
    the model class.

    Raises:
        PinError: the wrapper's logits differ from the model's own forward on a seeded batch (a head that is
            more than the output embedding, a soft cap say), naming the max difference. Whatever torch raises
            on a model it cannot export.
    """
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval()
    config = model.config
    layers, heads = int(config.num_hidden_layers), int(config.num_key_value_heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    module = decoder_with_past(model)
    ids = torch.randint(0, int(config.vocab_size), (1, 8), generator=torch.Generator().manual_seed(0))
    empty = [torch.zeros(1, heads, 0, head_dim) for _ in range(2 * layers)]
    with torch.inference_mode():
        wrapped, own = module(ids, empty)[0], model(input_ids=ids, use_cache=False).logits
    if not torch.equal(wrapped, own):
        raise PinError(f"{source}: the decoder-with-past wrapper's logits differ from the model's own forward by up to "
                       f"{float((wrapped - own).abs().max())}; its head is more than get_output_embeddings()")
    kv = [f"{i}.{kind}" for i in range(layers) for kind in ("key", "value")]
    seq, past = torch.export.Dim("seq", min=1, max=int(config.max_position_embeddings)), torch.export.Dim("past", min=0)
    sample = (ids[:, :3], [torch.zeros(1, heads, 2, head_dim) for _ in range(2 * layers)])
    torch.onnx.export(module, sample, str(out / ONNX), input_names=["input_ids", *(f"past_key_values.{n}" for n in kv)],
                      output_names=["logits", "hidden", *(f"present.{n}" for n in kv)], verbose=False,
                      dynamic_shapes={"input_ids": {1: seq}, "past_key_values": [{2: past}] * (2 * layers)}, **options)
    strip_node_metadata(out / ONNX)
    copy_beside(source, out, COPIED)
    return model_class_of(out)


def strip_node_metadata(path: Path) -> int:
    """Clear every node's ``metadata_props`` in the ``.onnx`` at ``path`` (its external data untouched); returns how
    many entries went.

    torch.onnx.export writes each node's Python stack trace there (``pkg.torch.onnx.stack_trace``: absolute
    paths of this checkout and the venv, and this file's line numbers), so the same export in another folder
    gave other bytes (320,895 vs 319,821 bytes for the draft twin's graph). ONNX Runtime never reads them.
    """
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    nodes = list(model.graph.node) + [node for function in model.functions for node in function.node]
    dropped = sum(len(node.metadata_props) for node in nodes)
    for node in nodes:
        del node.metadata_props[:]
    onnx.save(model, str(path))
    return dropped


def quantize_onnx(source: Path, out: Path, options: dict[str, Any]) -> str:
    """``quantize_dynamic(source/model.onnx, out/model.onnx, **options)`` (``weight_type`` by its
    ``QuantType`` name) and the source's config and tokenizer files copied beside it; returns the model class."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    given = {**options, "weight_type": getattr(QuantType, str(options["weight_type"]))}
    quantize_dynamic(str(source / ONNX), str(out / ONNX), **given)
    copy_beside(source, out, COPIED)
    return model_class_of(out)


def recipe_fields(recipe: dict[str, Any], root: Path) -> dict[str, Any]:
    """``recipe`` as a build at ``root`` makes it (``--write-pin``): the tool, its package versions, the
    options, and the graph's inputs and outputs (:func:`oracles.engines.onnx.artifact.onnx_facts`)."""
    from oracles.engines.onnx.artifact import onnx_facts

    tool = str(recipe.get("tool"))
    defaults = EXPORT_OPTIONS if tool == EXPORT_TOOL else QUANTIZE_OPTIONS
    facts = onnx_facts(root / ONNX)
    packages = installed(tool)
    return {**recipe, "version": packages[PACKAGES[tool][0]], "packages": packages,
            "arguments": {**defaults, **dict(recipe.get("arguments", {}))},
            "graph": {"inputs": sorted(facts["inputs"]), "outputs": sorted(facts["outputs"]), "opset": facts["opset"],
                      "producer": facts["producer"]}}

