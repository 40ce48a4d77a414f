"""Which records a port engine runs: the one ``--port-records`` option, for every family.

The reference runs every record. A port on a slow device cannot: the mlx-cpu wheel on Linux links the
netlib reference BLAS (measured 3.1 GFLOPS on a 1024x1024 float32 matmul, against numpy's ~139), so
mlx-lm prefills SmolLM2-135M at ~5 tokens/s here. ``--port-records`` says which records a port runs:

``sample`` (the default, what ``make test`` runs)
    the records within each family's sample size: execution prompts of at most
    :data:`EXECUTION_SAMPLE_TOKENS` tokens, d1 requests whose longest row is at most
    :data:`oracles.families.d1.run.D1_SAMPLE_TOKENS` tokens;
``all``
    every record;
``N`` (a positive int)
    every record whose prompt is at most ``N`` tokens (d1: its longest row).

Pure; no pytest import.
"""

from __future__ import annotations

from dataclasses import dataclass

#: The execution families' sample: prompts up to 256 tokens, i.e. every record but the README prompt
#: (1,294 ids) and the README chat; a 256-token MLX prefill takes ~50 s here.
EXECUTION_SAMPLE_TOKENS = 256


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

    def skip_reason(self, engine: str, record: str, tokens: int) -> str:
        """The skip message of a record this scope leaves out, naming the setting and how to widen it."""
        setting = "sample" if self.kind == "sample" else str(self.max_tokens)
        return (f"port {engine}: record {record!r} (~{tokens} prompt tokens) is not in --port-records {setting} "
                f"(pass --port-records all, or a number of tokens, to run it)")
