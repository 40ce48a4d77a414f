"""What the dry path imports loads no heavy library: each statement below runs in one fresh interpreter (one
for all of them: a process each cost 0.1 s of the dry smoke apiece), and after each one the modules it must not
load are looked up in ``sys.modules``. A module loaded by an earlier statement is seen by every later one, so a
statement is never passed for a module another loaded first; a positive control shows a loaded one is named."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from typing import Any

import pytest

pytestmark = pytest.mark.dry

#: (name, statements, the top-level packages they must not load). ``result`` set by the statements is reported.
STATEMENTS: list[tuple[str, str, tuple[str, ...]]] = [
    ("mtp modules",
     "import oracles.twins.mtp, oracles.engines.torch.mtp, oracles.engines.mlx.mtp, oracles.engines.torch.reference, "
     "oracles.engines.systems, oracles.families.execution.mtp, oracles.suite.test_mtp",
     ("torch", "transformers", "mlx", "mlx_vlm", "scipy")),
    ("executorch engine and pins",
     "import oracles.engines.executorch.engine, oracles.pins.executorch, oracles.engines.executorch.artifact",
     ("torch", "executorch", "transformers")),
    ("onnx engine's unavailable_reason and the exporter's module",
     "from oracles.engines.onnx.engine import OnnxRuntimePort; OnnxRuntimePort.unavailable_reason(); "
     "import oracles.pins.onnx_export",
     ("onnx", "onnxruntime", "onnxscript", "onnx_ir", "torch", "transformers")),
    ("llama.cpp engine named by the registry",
     "from oracles.engines import Registry; cls = Registry().engine_class('llamacpp'); result = [cls.__name__, cls.id]",
     ("llama_cpp_py_sync", "cffi")),
    ("litert engine's unavailable_reason",
     "from oracles.engines.litert.engine import LiteRtPort; LiteRtPort.unavailable_reason()",
     ("ai_edge_litert", "litert_torch", "transformers")),
]

_CHILD = """
import json, sys
for name, code, banned in json.loads(sys.argv[1]):
    scope = {}
    exec(code, scope)
    loaded = sorted(m for m in sys.modules if m.split('.')[0] in banned)
    print(json.dumps({"name": name, "loaded": loaded, "result": scope.get("result")}), flush=True)
"""


@cache
def _run(table: str) -> dict[str, dict[str, Any]]:
    done = subprocess.run([sys.executable, "-c", _CHILD, table], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return {row["name"]: row for row in map(json.loads, done.stdout.splitlines())}


@pytest.mark.parametrize("name", [s[0] for s in STATEMENTS])
def test_the_statement_loads_no_heavy_library(name: str) -> None:
    row = _run(json.dumps(STATEMENTS))[name]
    assert row["loaded"] == [], f"{name}: loaded {row['loaded']}"
    if name.startswith("llama.cpp"):
        assert row["result"] == ["LlamaCppPort", "llamacpp"]


def test_a_loaded_library_is_named() -> None:
    """Positive control: a statement that loads a banned package (here the standard library's ``wave``) is named,
    and so is every later statement's (a module loaded once stays loaded)."""
    table = [("loads wave", "import wave", ("wave",)), ("after it", "result = 1", ("wave",))]
    rows = _run(json.dumps(table))
    assert rows["loads wave"]["loaded"] == ["wave"] and rows["after it"]["loaded"] == ["wave"]
