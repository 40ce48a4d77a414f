"""The ExecuTorch port without its runtime: the registry, the pins it refuses, a ``.pte``'s facts read from
its bytes (a flatbuffer written here with the ``flatbuffers`` builder), one line for each bad program, and
the executorch-convert pins' recipes. Nothing here imports executorch or torch
(tests/unit/test_light_imports_dry.py asserts it)."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from oracles.engines import BUILTIN, Registry
from oracles.engines.executorch.artifact import PteFacts, TensorFacts, check_pte, pte_pin_facts, read_pte
from oracles.engines.executorch.engine import ExecuTorchPort, pte_of
from oracles.errors import PinError
from oracles.pins.executorch import CONVERTER_PACKAGES, OPTIONS, RUNTIME, options_of
from oracles.pins.pin import load_pin

PINS = ("smollm2-draft-twin-executorch", "smollm2-draft-twin-executorch-8da4w", "smollm2-draft-twin-executorch-8w")
CONFIG = {"vocab_size": 49152, "hidden_size": 64, "num_hidden_layers": 2}


def program(methods: dict[str, Any], forward_out: int = 49216) -> bytes:
    """A ``.pte``'s bytes with ``methods`` (name -> int constant, or ``"forward"``), laid out as
    ``program.fbs`` says: Program.execution_plan, ExecutionPlan name/values/inputs/outputs, EValue union."""
    import flatbuffers  # type: ignore[import-untyped]  # ships no types

    b = flatbuffers.Builder(1024)

    def table(fields: list[tuple[int, str, Any]]) -> int:
        """A table of ``(slot, kind, value)``: kind ``off`` (an offset made before), ``i8``/``u8``/``i64``."""
        b.StartObject(max(s for s, _, _ in fields) + 1)
        for slot, kind, value in fields:
            if kind == "off":
                b.PrependUOffsetTRelativeSlot(slot, value, 0)
            elif kind == "u8":
                b.PrependUint8Slot(slot, value, 0)
            elif kind == "i8":
                b.PrependInt8Slot(slot, value, 0)
            else:
                b.PrependInt64Slot(slot, value, 0)
        return int(b.EndObject())

    def vector(items: list[int], kind: str) -> int:
        b.StartVector(4, len(items), 4)
        for item in reversed(items):
            b.PrependUOffsetTRelative(item) if kind == "off" else b.PrependInt32(item)
        return int(b.EndVector())

    def tensor(dtype: int, sizes: list[int]) -> int:
        s = vector(sizes, "i32")
        return table([(0, "i8", dtype), (2, "off", s)])

    plans = []
    for name, value in methods.items():
        if value == "forward":
            shapes = ((4, [1, 511]), (4, [511]), (6, [1, 511, forward_out]))
            values = [table([(0, "u8", 5), (1, "off", tensor(*t))]) for t in shapes]
            ins, outs = vector([0, 1], "i32"), vector([2], "i32")
        else:
            values = [table([(0, "u8", 2), (1, "off", table([(0, "i64", value)]))])]
            ins, outs = vector([], "i32"), vector([0], "i32")
        vals = vector(values, "off")
        label = b.CreateString(name)
        plans.append(table([(0, "off", label), (2, "off", vals), (3, "off", ins), (4, "off", outs)]))
    root = table([(1, "off", vector(plans, "off"))])
    b.Finish(root, file_identifier=b"ET12")
    body = bytearray(b.Output())
    # the extended header goes at byte 8, where the flatbuffer's root offset leaves room only if made so:
    # write it into a copy whose root offset skips it (ExecuTorch's serializer pads the same way)
    header = b"eh00" + struct.pack("<IQQQ", 32, len(body) + 32, 0, 0)
    root_at = struct.unpack_from("<I", body, 0)[0] + 32
    return struct.pack("<I", root_at) + b"ET12" + header + bytes(body[8:])


def facts(**changes: Any) -> PteFacts:
    base = dict(path=Path("/snap/model.pte"), file_bytes=100, program_bytes=100, segments_end=100,
                methods=("forward", "get_max_seq_len", "get_n_layers", "get_vocab_size"),
                constants={"get_vocab_size": 49152, "get_max_seq_len": 512, "get_n_layers": 2},
                inputs=(TensorFacts("int64", (1, 511)), TensorFacts("int64", (511,))),
                outputs=(TensorFacts("float32", (1, 511, 49216)),), backends=("XnnpackBackend",))
    return PteFacts(**{**base, **changes})


@pytest.mark.dry
def test_registered_and_refuses_pins_without_a_pte() -> None:
    assert BUILTIN["executorch"] == "oracles.engines.executorch.engine:ExecuTorchPort"
    assert Registry().engine_class("executorch") is ExecuTorchPort
    assert "lists none" in str(ExecuTorchPort.unsupported_pin(load_pin("smollm2-draft-twin")))
    for name in PINS:
        assert pte_of(load_pin(name)) == "model.pte" and ExecuTorchPort.unsupported_pin(load_pin(name)) is None


@pytest.mark.dry
def test_reads_a_program_written_here(tmp_path: Path) -> None:
    """Methods, constants and the forward's shapes come back as written (a positive control of the reader)."""
    path = tmp_path / "model.pte"
    path.write_bytes(program({"forward": "forward", "get_vocab_size": 49152, "get_max_seq_len": 512}))
    got = read_pte(path)
    assert got.methods == ("forward", "get_max_seq_len", "get_vocab_size")
    assert got.constants == {"get_vocab_size": 49152, "get_max_seq_len": 512}
    assert [(t.dtype, t.sizes) for t in got.inputs] == [("int64", (1, 511)), ("int64", (511,))]
    assert [(t.dtype, t.sizes) for t in got.outputs] == [("float32", (1, 511, 49216))]
    assert check_pte(got, CONFIG, 49152) == (49152, 64)
    assert pte_pin_facts(path)["hidden_output"] == 64 and pte_pin_facts(path)["max_seq_len"] == 512


@pytest.mark.dry
def test_bad_programs_are_one_line_each(tmp_path: Path) -> None:
    whole = program({"forward": "forward", "get_vocab_size": 49152, "get_max_seq_len": 512})
    cut = tmp_path / "cut.pte"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(PinError, match=rf"^{cut}: truncated: its flatbuffer end at byte {len(whole)} but the file has "
                                        rf"{len(whole) // 2} bytes$"):
        read_pte(cut)
    other = tmp_path / "other.pte"
    other.write_bytes(b"\x00" * 64)
    with pytest.raises(PinError, match=rf"^{other}: not an ExecuTorch program: bytes 4-8 are .+, not the file identifier"):
        read_pte(other)
    no_forward = tmp_path / "noforward.pte"
    no_forward.write_bytes(program({"get_vocab_size": 49152, "get_max_seq_len": 512}))
    with pytest.raises(PinError, match=r"field 'execution_plan' has no method 'forward' \(methods: get_max_seq_len, "
                                       r"get_vocab_size\)$"):
        check_pte(read_pte(no_forward), CONFIG, 49152)
    with pytest.raises(PinError, match=r"field 'get_vocab_size' is 49152 but config.json's vocab_size is 32000"):
        check_pte(facts(), {**CONFIG, "vocab_size": 32000}, 32000)
    with pytest.raises(PinError, match=r"field 'get_vocab_size' is 49152 .+ the tokenizer has 50000 tokens"):
        check_pte(facts(), CONFIG, 50000)
    with pytest.raises(PinError, match=r"width 49200 is neither get_vocab_size 49152 nor it plus config.json's hidden_size 64"):
        check_pte(facts(outputs=(TensorFacts("float32", (1, 511, 49200)),)), CONFIG, 49152)
    with pytest.raises(PinError, match=r"field 'forward.inputs' is .+ not input_ids int64 \[1, S\] and cache_position"):
        check_pte(facts(inputs=(TensorFacts("int32", (1, 511)),)), CONFIG, 49152)
    with pytest.raises(PinError, match=r"field 'get_n_layers' is 3 but config.json's num_hidden_layers is 2"):
        check_pte(facts(constants={"get_vocab_size": 49152, "get_max_seq_len": 512, "get_n_layers": 3}), CONFIG, 49152)
    assert check_pte(facts(outputs=(TensorFacts("float32", (1, 511, 49152)),)), CONFIG, 49152) == (49152, 0)


@pytest.mark.dry
def test_pins_and_recipes() -> None:
    for name in PINS:
        pin = load_pin(name)
        assert pin.source == "executorch-convert:smollm2-draft-twin" and pin.converted_from == "smollm2-draft-twin"
        assert pin.recipe is not None and pin.recipe["packages"] == [RUNTIME, *CONVERTER_PACKAGES]
        options = options_of(pin)
        assert set(options) == set(OPTIONS)
        # what each program holds, read from its delegates: 8w asked for int8 weights and holds float32 ones
        want = {None: ("float32", "float32"), "8da4w": ("int4", "dynamic_int8"), "8w": ("float32", "float32")}
        assert (pin.precision.weights, pin.precision.compute) == want[options["qlinear"]], name
    assert load_pin(PINS[0]).reference == "smollm2-draft-twin"
    assert load_pin(PINS[1]).reference is None  # no dequantized reference exists: graded against float32


@pytest.mark.dry
def test_bad_recipe_is_one_line(tmp_path: Path) -> None:
    obj = json.loads(load_pin(PINS[0]).path.read_text())
    obj["recipe"]["arguments"]["qlinear"] = "3w"
    path = tmp_path / f"{PINS[0]}.json"
    path.write_text(json.dumps(obj))
    with pytest.raises(PinError, match=rf"^{path}: field 'recipe.arguments.qlinear' is '3w', not one of"):
        options_of(load_pin(path))


def test_one_converter_process_answers_each_job_in_order(tmp_path: Path) -> None:
    """The converter serves its jobs in one process: a failed job is that job's one line and the same process
    answers the next; closed, it exits 0; a converter that died is one line too. (This environment's python
    runs the script: a job with an option the export does not take fails before the exporter is imported.) Not
    dry: it starts the converter."""
    from oracles.pins.executorch import Converter

    job = {"source": str(tmp_path), "out": str(tmp_path), "file": "model.pte", "options": {"recipe": "xnnpack", "nope": 1}}
    converter = Converter(Path(sys.executable))
    pid = converter.process.pid
    for n in (1, 2):
        with pytest.raises(PinError, match=rf"^job {n}: ValueError: option 'nope' is not a main_export option this "
                                           r"conversion passes \(dtype, max_seq_len, "):
            converter.convert(job, f"job {n}")
        assert converter.process.poll() is None and converter.process.pid == pid
    converter.close()
    assert converter.process.returncode == 0
    dead = Converter(Path(sys.executable))
    dead.process.kill()
    dead.process.wait()
    with pytest.raises(PinError, match=r"^job 3: the converter exited \(-9\): \(no output\)$"):
        dead.convert(job, "job 3")
    dead.close()
