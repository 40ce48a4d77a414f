"""The ExecuTorch conversion, run by the converter environment's python (``python executorch_script.py``).

This file is executed in the separate converter environment (optimum-executorch, torchao, executorch's
exporter; no ``oracles``), so it imports only the standard library at module level and the exporter
inside :func:`convert`. A job is a JSON file written by :mod:`oracles.pins.executorch`::

    {"source": SNAPSHOT, "out": FOLDER, "file": "model.pte",
     "options": {"recipe": "xnnpack", "dtype": "float32", "max_seq_len": 512, "qlinear": null}}

The export is optimum-executorch's own: ``optimum.exporters.executorch.main_export(SNAPSHOT,
task="text-generation", recipe=..., output_dir=..., **options)``, what ``optimum-cli export executorch
--task text-generation --recipe xnnpack --dtype float32 --max_seq_len 512 [--qlinear Q]`` calls, with
two additions, each an attribute replaced for the length of the export (:data:`ADDITIONS`):

* ``hidden``: the model's ``lm_head`` is wrapped so the program's one output is ``[1, S, V + D]``: the
  head's logits in the first ``V`` columns, the final norm's output it read in the last ``D``. The
  engine contract returns that hidden state (``Step.hidden``); the head's own arithmetic is unchanged
  (the same Linear, quantized as the recipe quantizes it; the concatenation copies).
* ``buffer_names``: ``ExecutorchBackendConfig(emit_mutable_buffer_names=True)``, so the program names
  its mutable buffers (the static KV cache) and the runtime reads and writes them by name
  (``get_attribute``): what a snapshot and a restore of the cache need. Names only; no value changes.

One process converts any number of jobs (:func:`serve`): it reads a job file's path per line on stdin
and answers each with one JSON line, so the exporter's imports (torch, optimum, torchao, executorch's
exporter: most of a twin's conversion) are paid once for a run of builds. The answers go to the
process's original stdout; everything else it prints, the exporter's own output included, goes to
stderr. Each job starts from the same seed (``torch.manual_seed(0)``), and a job's bytes are the same
in a fresh process or after others (the three twin exports, built in one process, have their pinned
digests). ``python executorch_script.py JOB`` converts one job and prints its answer.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any, Iterator

#: What the export adds to ``optimum-cli export executorch`` (the module docstring says why each).
ADDITIONS = {
    "hidden": "lm_head wrapped: forward returns [1, S, V + D], the logits then the final norm's output",
    "buffer_names": "ExecutorchBackendConfig(emit_mutable_buffer_names=True): the KV cache's buffers named",
}
#: ``main_export`` keyword arguments a job may give (``optimum-cli export executorch``'s options, by its
#: argument names), besides the task and the recipe.
EXPORT_OPTIONS = ("dtype", "max_seq_len", "qlinear", "qlinear_group_size", "qembedding", "qembedding_group_size",
                  "use_custom_sdpa", "use_custom_kv_cache", "disable_dynamic_shapes")


def head_and_hidden(head: Any) -> Any:
    """``head`` (the model's ``lm_head`` Linear) wrapped: ``h [B, S, D] -> cat(head(h), h) [B, S, V + D]``."""
    import torch

    class HeadAndHidden(torch.nn.Module):
        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, hidden: Any) -> Any:
            return torch.cat([self.inner(hidden), hidden], dim=-1)

    return HeadAndHidden(head)


@contextlib.contextmanager
def additions() -> Iterator[None]:
    """The two :data:`ADDITIONS` in force for the block: optimum-executorch's causal-LM wrapper wraps the
    model's head when it is built (after the recipe's quantization), and the xnnpack recipe's backend
    config names the mutable buffers."""
    import functools

    from executorch.exir import ExecutorchBackendConfig
    from optimum.exporters.executorch.recipes import xnnpack
    from optimum.exporters.executorch.tasks import causal_lm

    base = causal_lm.CausalLMExportableModule

    class WithHidden(base):  # type: ignore[misc, valid-type]
        def __init__(self, model: Any, *args: Any, **kwargs: Any) -> None:
            model.lm_head = head_and_hidden(model.lm_head)
            super().__init__(model, *args, **kwargs)

    saved = (causal_lm.CausalLMExportableModule, xnnpack.ExecutorchBackendConfig)
    causal_lm.CausalLMExportableModule = WithHidden
    xnnpack.ExecutorchBackendConfig = functools.partial(ExecutorchBackendConfig, emit_mutable_buffer_names=True)
    try:
        yield
    finally:
        causal_lm.CausalLMExportableModule, xnnpack.ExecutorchBackendConfig = saved


def convert(job: dict[str, Any]) -> dict[str, Any]:
    """Export ``job["source"]`` into ``job["out"] / job["file"]`` with optimum-executorch's ``main_export``
    under :func:`additions`.

    Returns what it wrote: ``{"file", "methods", "constants", "forward_output"}`` (the constant methods'
    values and the forward output's shape, read back with the runtime).

    Raises:
        ValueError: an option ``main_export`` is not given here (named). Whatever the exporter raises.
    """
    source, out, options = Path(job["source"]), Path(job["out"]), dict(job["options"])
    recipe = options.pop("recipe")
    if bad := sorted(set(options) - set(EXPORT_OPTIONS)):
        raise ValueError(f"option {bad[0]!r} is not a main_export option this conversion passes ({', '.join(EXPORT_OPTIONS)})")
    given = {k: v for k, v in options.items() if v is not None and v is not False}
    import torch
    from optimum.exporters.executorch import main_export

    torch.manual_seed(0)
    with _tempdir(out) as tmp, additions():
        main_export(model_name_or_path=str(source), task="text-generation", recipe=recipe, output_dir=str(tmp), **given)
        (tmp / "model.pte").replace(out / job["file"])
    from executorch.runtime import Runtime, Verification

    program = Runtime.get().load_program(str(out / job["file"]), verification=Verification.Minimal)
    names = sorted(program.method_names)
    constants = {n: _scalar(program.load_method(n).execute([])[0]) for n in names
                 if n != "forward" and program.metadata(n).num_inputs() == 0}
    meta = program.metadata("forward")
    return {"file": job["file"], "methods": names, "constants": constants,
            "forward_output": list(meta.output_tensor_meta(0).sizes())}


def _scalar(value: Any) -> Any:
    """A constant method's output as JSON: bool, int or float."""
    return value if isinstance(value, (bool, int, float)) else float(value)


class _tempdir:
    """A temporary folder inside ``parent`` (the exporter names its output itself), removed after."""

    def __init__(self, parent: Path) -> None:
        self.parent = parent

    def __enter__(self) -> Path:
        import tempfile

        self.path = Path(tempfile.mkdtemp(prefix=".export.", dir=self.parent))
        return self.path

    def __exit__(self, *exc: object) -> None:
        import shutil

        shutil.rmtree(self.path, ignore_errors=True)


def answer(job_path: str) -> dict[str, Any]:
    """The answer to one job file: ``{"result": ...}`` (:func:`convert`'s), or ``{"error": LINE}``, the last
    line of the exception's traceback (also written whole to stderr)."""
    import traceback

    try:
        return {"result": convert(json.loads(Path(job_path).read_text(encoding="utf-8")))}
    except Exception as exc:  # noqa: BLE001 - every failure of one job is that job's answer
        traceback.print_exc(file=sys.stderr)
        return {"error": traceback.format_exception_only(type(exc), exc)[-1].strip()}


def serve(lines: Any, reply: Any) -> int:
    """Answer each job path read from ``lines`` with one JSON line on ``reply`` (flushed), until end of input."""
    for line in lines:
        if line.strip():
            reply.write(json.dumps(answer(line.strip()), sort_keys=True) + "\n")
            reply.flush()
    return 0


def main(argv: list[str]) -> int:
    """``python executorch_script.py``: serve the job paths on stdin (module docstring); with one argument
    ``JOB.json``, answer that job. The answers go to the original stdout, all other output to stderr.
    0 unless a single job failed or the usage is wrong."""
    import os

    if len(argv) > 2:
        print("usage: executorch_script.py [JOB.json]", file=sys.stderr)
        return 2
    reply = os.fdopen(os.dup(sys.stdout.fileno()), "w")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # the exporter's prints, Python's and C's, go to stderr
    if len(argv) == 2:
        done = answer(argv[1])
        reply.write(json.dumps(done, sort_keys=True) + "\n")
        reply.flush()
        return 0 if "result" in done else 1
    return serve(sys.stdin, reply)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
