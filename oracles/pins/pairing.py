"""Port pins: a converted artifact the ports load, paired with the reference pin it is held against.

``--port-pin REF=ARTIFACT`` (or ``ARTIFACT`` alone, when its pin file names its ``reference``) adds, to
every port test, a run with the reference on pin REF and the port on pin ARTIFACT: a 4-bit artifact
against the float32 snapshot dequantized from it (the port's arithmetic alone, held to the float32
thresholds), a bfloat16 artifact against its float32 original (a calibrated band: oracles.checks.judgment).
The records are REF's, so the two pins must tokenize alike: their tokenizer files must be equal.

Pure: pin files only (no torch, mlx or numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oracles.errors import PinError

if TYPE_CHECKING:
    from oracles.checks.judgment import Judgment
    from oracles.pins.pin import Pin, PinStore

#: The compute types a band engine runs in: the torch reference's dtypes other than float32
#: (``oracles.engines.torch.reference.TorchReference.DTYPES``; a unit test holds the two equal).
BAND_DTYPES = ("bfloat16", "float16", "q8_0", "q8_1", "q8_K", "per-tensor")
#: The file a dequantized GGUF reference holds its per-Linear rounding plan in (``per-tensor`` band).
PLAN_FILE = "ggml_rounding.json"


@dataclass(frozen=True)
class PortPair:
    """The reference runs on pin ``reference``, the port on pin ``artifact``."""

    reference: str
    artifact: str

    @property
    def label(self) -> str:
        """``REF=ARTIFACT``, as ``--port-pin`` takes it."""
        return f"{self.reference}={self.artifact}"


def parse_port_pins(value: str | None, where: "PinStore", default: tuple[str, ...] = ()) -> tuple[PortPair, ...]:
    """A ``--port-pin`` value as its pairs, in order, each once; None: the pairs of ``default`` (artifact
    names whose pin files name their reference); ``"none"``: no pairs.

    Raises:
        PinError: one line starting ``--port-pin ITEM:``: an unknown pin (known ones listed), an artifact
            whose pin file names no reference given without ``REF=``, the artifact paired with itself, or
            two pins whose tokenizer files differ (both digests).
    """
    if value is not None and value.strip().lower() == "none":
        return ()
    items = default if value is None else tuple(v.strip() for v in value.split(",") if v.strip())
    pairs: dict[PortPair, None] = {}
    for item in items:
        ref_name, sep, art_name = item.rpartition("=")
        try:
            artifact = where.load(art_name)
            if not sep:
                declared = artifact.reference
                if declared is None:
                    raise PinError(f"pin {art_name} names no reference (field 'reference' of {artifact.path}); "
                                   f"write REF={art_name}")
                ref_name = declared
            reference = where.load(ref_name)
        except PinError as exc:
            raise PinError(f"--port-pin {item}: {exc}") from None
        if reference.name == artifact.name:
            raise PinError(f"--port-pin {item}: the artifact is its own reference; every port test already runs the "
                           "port on the reference's pin")
        refuse_other_tokenizer(item, reference, artifact)
        judgment_of(reference, artifact)  # a pair nothing can judge is refused here, not in every test
        pairs[PortPair(reference.name, artifact.name)] = None
    return tuple(pairs)


def refuse_other_tokenizer(item: str, reference: "Pin", artifact: "Pin") -> None:
    """Refuse a pair whose pins' tokenizer files differ: the records are tokenized by the reference's.

    Raises:
        PinError: ``--port-pin ITEM: ...`` naming both pins and both tokenizer digests.
    """
    ref_sha, art_sha = reference.tokenizer_sha256, artifact.tokenizer_sha256
    if ref_sha != art_sha:
        raise PinError(f"--port-pin {item}: pin {artifact.name}'s tokenizer files differ from pin {reference.name}'s "
                       f"(tokenizer sha256 {art_sha[:12]} vs {ref_sha[:12]}): the port would be fed ids another "
                       "tokenizer made")


def judgment_of(reference: "Pin", artifact: "Pin") -> "Judgment":
    """How a port on ``artifact`` is judged against the reference on ``reference``
    (:mod:`oracles.checks.judgment`), from the two pins' precision:

    * the same pin, or ``reference`` the float32 snapshot dequantized from ``artifact`` (its
      ``dequantized_from``, or a ``dequantize:`` source whose digest is the sha256 of the artifact's file:
      ``oracles pin REF --dequantize-from FILE.gguf`` of the file ``oracles pin NAME --from FILE.gguf`` pins),
      or both float32:
      ``exact`` when the artifact computes in float32 (its port's own bounds, FLOAT32 by default);
    * an artifact that computes in bfloat16 / float16 on weights of that dtype converted from
      ``reference``: ``band`` in that dtype;
    * a dequantized reference whose artifact computes in a reduced dtype, or on activations rounded to
      8-bit blocks (``q8_1``: llama.cpp's CPU on a quantized GGUF): ``band`` too.

    Raises:
        PinError: a quantized artifact held against a reference that does not hold its weights (its
            dequantized reference is what judges it; its quantization cost is graded), a reduced-precision
            artifact whose weights are not a cast of the reference's, or a compute no band engine runs in
            (:data:`BAND_DTYPES`); one line naming both pins.
    """
    from oracles.checks.judgment import Judgment

    compute, weights = artifact.precision.compute, artifact.precision.weights
    same_weights = (artifact.name == reference.name or reference.precision.dequantized_from == artifact.name
                    or dequantized_file(reference, artifact) or weights == "float32" == reference.precision.weights)
    cast_of = artifact.converted_from == reference.name and weights == compute
    if same_weights and compute == "float32":
        return Judgment("exact", f"port pin {artifact.name} computes in float32 on the weights of {reference.name}")
    if (same_weights or cast_of) and compute not in BAND_DTYPES:
        raise PinError(f"--port-pin {reference.name}={artifact.name}: pin {artifact.name} computes in {compute!r} "
                       f"({artifact.precision.describe()}), and no band engine runs the reference in that precision "
                       f"(the torch reference runs {', '.join(BAND_DTYPES)})")
    if same_weights and compute == "per-tensor" and PLAN_FILE not in reference.files:
        raise PinError(f"--port-pin {reference.name}={artifact.name}: pin {artifact.name} rounds each matrix's "
                       f"activations its own way (per-tensor) and pin {reference.name} pins no {PLAN_FILE} saying how; "
                       f"rebuild it: oracles pin NAME --dequantize-from FILE.gguf")
    if same_weights or cast_of:
        how = (f"on activations rounded to {compute} blocks" if compute.startswith("q8") else
               "on activations rounded per matrix as llama.cpp's CPU rounds each" if compute == "per-tensor" else
               f"in {compute}")
        return Judgment("band", f"port pin {artifact.name} computes {how}: held to the band of the reference run "
                                f"{how} on {reference.name}", dtype=compute)
    raise PinError(f"--port-pin {reference.name}={artifact.name}: pin {artifact.name} holds {weights} weights, which pin "
                   f"{reference.name} does not hold; hold it against its dequantized reference (oracles pin NAME "
                   "--dequantize-from DIR); its quantization cost against the float32 original is graded (-m graded)")


def dequantized_file(reference: "Pin", artifact: "Pin") -> bool:
    """Whether ``reference`` is the float32 snapshot dequantized from a file ``artifact`` pins: a
    ``dequantize:`` source whose ``source_sha256`` is the sha256 of one of ``artifact``'s pinned files."""
    if reference.source_parts()["derived"] != "dequantize" or reference.source_sha256 is None:
        return False
    return any(d.sha256 == reference.source_sha256 for d in artifact.files.values())
