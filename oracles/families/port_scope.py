"""Which records a port engine runs: the one ``--port-records`` option, for every family.

The reference runs every record. A port on a slow device cannot: the mlx-cpu wheel on Linux links the
netlib reference BLAS (measured 3.1 GFLOPS on a 1024x1024 float32 matmul, against numpy's ~139), so
mlx-lm prefills SmolLM2-135M at ~5 tokens/s here. ``--port-records`` says which records a port runs:

``sample`` (the default, what ``make test`` runs)
    the records within each family's sample size: execution prompts of at most
    :data:`EXECUTION_SAMPLE_TOKENS` tokens, d1 requests whose longest row is at most
    :data:`D1_SAMPLE_TOKENS` tokens;
``all``
    every record;
``N`` (a positive int)
    every record whose prompt is at most ``N`` tokens (d1: its longest row).

The scope is applied at collection: a test parameter that is a record says its size on a pin
(:class:`ScopedRecord`), and a port's test of a record the scope leaves out is deselected, not
parametrized and skipped (:mod:`oracles.plugin.collect`); :class:`LeftOut` counts them per port for the
terminal summary and the receipt.

Pure; no pytest import.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

#: The execution families' sample: prompts up to 256 tokens, i.e. every record but the README prompt
#: (1,294 ids) and the README chat; a 256-token MLX prefill takes ~50 s here.
EXECUTION_SAMPLE_TOKENS = 256
#: d1's port sample: the requests whose longest row is at most 80 tokens: 13 of them (arithmetic,
#: entailment, facts, a score, sentiment, a two-question tree, the three rejected-question records and
#: the bases of the three adopted red arms), ~1,700 tokens with their tree, arms and full row. The MLX
#: port prefills ~5 tokens/s here (80 tokens: 16 s; 400 tokens: 82 s), so this costs ~5 min of one
#: worker's time in ``make test``; the 512 set (~17k tokens) would take about an hour.
D1_SAMPLE_TOKENS = 80


class ScopedRecord(Protocol):
    """A test parameter that is one record of a port-scoped family (an execution prompt, a d1 request or
    one of its questions): ``id`` names the record, ``sample_tokens`` is its family's sample size, and
    ``port_tokens(pin)`` its size in tokens on ``pin``'s tokenizer (what ``--port-records`` compares;
    raises :class:`oracles.errors.TokensMissing` where the pin has no ids for the family)."""

    @property
    def id(self) -> str: ...

    @property
    def sample_tokens(self) -> int: ...

    def port_tokens(self, pin: str) -> int: ...


@dataclass(frozen=True)
class PortScope:
    """A parsed ``--port-records`` value: ``kind`` is ``"sample"``, ``"all"`` or ``"max"``
    (then ``max_tokens`` holds N)."""

    kind: str
    max_tokens: int = 0

    @classmethod
    def parse(cls, raw: str) -> "PortScope":
        """Parse an option value.

        Raises:
            ValueError: neither ``sample``, ``all`` nor a positive int (the value named).
        """
        value = str(raw).strip().lower()
        if value in ("sample", "all"):
            return cls(value)
        if value.isdigit() and int(value) > 0:
            return cls("max", int(value))
        raise ValueError(f"--port-records {raw!r}: expected 'sample', 'all' or a positive number of tokens")

    def selects(self, tokens: int, sample_tokens: int) -> bool:
        """Whether a port runs a record of ``tokens`` prompt tokens in a family whose sample holds the
        records of at most ``sample_tokens``."""
        if self.kind == "all":
            return True
        return tokens <= (self.max_tokens if self.kind == "max" else sample_tokens)

    @property
    def setting(self) -> str:
        """The option's value as given (``sample``, ``all`` or N)."""
        return str(self.max_tokens) if self.kind == "max" else self.kind

    def skip_reason(self, engine: str, record: str, tokens: int) -> str:
        """Why a record this scope leaves out does not run on ``engine``, naming the setting and how to widen it."""
        return (f"port {engine}: record {record!r} (~{tokens} prompt tokens) is not in --port-records {self.setting} "
                f"(pass --port-records all, or a number of tokens, to run it)")


@dataclass
class LeftOut:
    """The tests a port scope left out of one session's collection: per port engine, how many tests and
    which records (id -> its size in tokens on the pin it was judged on)."""

    setting: str
    tests: dict[str, int] = field(default_factory=dict)
    records: dict[str, dict[str, int]] = field(default_factory=dict)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> "LeftOut":
        """The counts of a :meth:`to_json` (``{}``: nothing left out, setting ``sample``)."""
        left_out = cls(str(doc.get("setting", "sample")))
        left_out.merge(doc)
        return left_out

    def add(self, engine: str, record: str, tokens: int) -> None:
        """One test of ``engine`` on ``record`` (``tokens`` long) left out."""
        self.tests[engine] = self.tests.get(engine, 0) + 1
        self.records.setdefault(engine, {})[record] = tokens

    def merge(self, other: dict[str, Any]) -> None:
        """Take a worker's :meth:`to_json` (every worker collects the same tests: the larger count is kept)."""
        for engine, n in other.get("ports", {}).items():
            self.tests[engine] = max(self.tests.get(engine, 0), int(n["tests"]))
            self.records.setdefault(engine, {}).update(n["records"])

    def to_json(self) -> dict[str, Any]:
        """``{"setting", "ports": {engine: {"tests", "records": {id: tokens}, "why"}}}``, the receipt's ``port_scope``."""
        return {"setting": self.setting, "ports": {
            engine: {"tests": self.tests[engine], "records": dict(sorted(self.records[engine].items())),
                     "why": f"records longer than --port-records {self.setting} allows; the reference runs them"}
            for engine in sorted(self.tests)}}

    def lines(self) -> list[str]:
        """One terminal line per port: the tests and records left out, and how to run them."""
        return [f"oracles: port {engine}: {self.tests[engine]} tests of {len(self.records[engine])} records left out by "
                f"--port-records {self.setting} (the reference runs them; --port-records all runs them here)"
                for engine in sorted(self.tests)]
