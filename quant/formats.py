"""Block formats as data.

Every ggml tensor type stores its elements in fixed-size blocks: `block_elements` weights
packed into `block_bytes` bytes. The numbers come from gguf's GGML_QUANT_SIZES (never a
hand-typed table); this module only adds names, the byte arithmetic built on them, and, for
the two formats the numpy reference implements (Q8_0, Q4_0), the layout of one block. SCALE_FIELDS
gives, per block type, where its floating-point scales sit and how they are encoded: a model's twin
(ondevice.quant.twin) fills a block with random bits and then puts a small normal number into each.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.core.errors import QuantError

__all__ = [
    "BlockFormat",
    "Q8_0Format",
    "Q4_0Format",
    "ScaleField",
    "SCALE_FIELDS",
    "SCALE_SPREAD",
    "SCALE_MANTISSA_BITS",
    "FLOAT_TYPES",
    "INTEGER_TYPES",
    "block_format",
    "all_formats",
    "tensor_bytes",
]


@dataclass(frozen=True)
class BlockFormat:
    """One ggml tensor type: how many elements a block holds and how many bytes it takes."""

    name: str  # ggml type name, e.g. "Q4_K"
    ggml_type: GGMLQuantizationType  # the gguf enum member
    block_elements: int  # weights per block
    block_bytes: int  # bytes per block (scales + packed quants)

    @property
    def bits_per_weight(self) -> float:
        """Bits each weight costs, scales included (Q8_0: 8.5, Q4_0: 4.5, F16: 16)."""
        return 8.0 * self.block_bytes / self.block_elements

    @property
    def is_quantized(self) -> bool:
        return self.block_elements > 1

    def row_bytes(self, n_elements: int) -> int:
        """Bytes of one row of `n_elements` weights; the row must be whole blocks."""
        if n_elements % self.block_elements:
            raise QuantError(
                f"{self.name}: a row of {n_elements} weights is not a whole number of "
                f"{self.block_elements}-weight blocks"
            )
        return n_elements // self.block_elements * self.block_bytes

    def tensor_bytes(self, shape_ggml: Sequence[int]) -> int:
        """Bytes of a tensor; `shape_ggml[0]` is the row length (ggml order, as in GGUF)."""
        if not shape_ggml:
            return self.row_bytes(1)
        n_rows = 1
        for dim in shape_ggml[1:]:
            n_rows *= int(dim)
        return n_rows * self.row_bytes(int(shape_ggml[0]))


@dataclass(frozen=True)
class Q8_0Format(BlockFormat):
    """Q8_0: one fp16 scale `d`, then `block_elements` int8 quants; x = d * q."""

    scale_bytes: ClassVar[int] = 2  # fp16 d at the start of the block
    quant_bits: ClassVar[int] = 8  # signed int8 per weight
    q_max: ClassVar[int] = 127  # d = amax / q_max


@dataclass(frozen=True)
class Q4_0Format(BlockFormat):
    """Q4_0: one fp16 scale `d`, then nibbles; x = d * (q - 8). Byte j holds weight j in its
    low nibble and weight j + block_elements/2 in its high nibble."""

    scale_bytes: ClassVar[int] = 2  # fp16 d at the start of the block
    quant_bits: ClassVar[int] = 4  # unsigned nibble per weight, offset by `offset`
    offset: ClassVar[int] = 8  # q - offset is the signed level, -8..7
    divisor: ClassVar[int] = -8  # d = (signed value of largest magnitude) / divisor


_SPECIAL = {GGMLQuantizationType.Q8_0: Q8_0Format, GGMLQuantizationType.Q4_0: Q4_0Format}


def _make(qtype: GGMLQuantizationType) -> BlockFormat:
    elements, nbytes = GGML_QUANT_SIZES[qtype]
    cls = _SPECIAL.get(qtype, BlockFormat)
    fmt = cls(name=qtype.name, ggml_type=qtype, block_elements=elements, block_bytes=nbytes)
    if isinstance(fmt, (Q8_0Format, Q4_0Format)):
        packed = fmt.scale_bytes + elements * fmt.quant_bits // 8
        if packed != nbytes:  # gguf's table and the layout here disagree: a format changed
            raise QuantError(f"{qtype.name}: layout gives {packed} bytes per block, gguf says {nbytes}")
    return fmt


def all_formats() -> dict[str, BlockFormat]:
    """Every tensor type gguf knows, by name."""
    return {qtype.name: _make(qtype) for qtype in GGML_QUANT_SIZES}


def block_format(kind: str | int | GGMLQuantizationType) -> BlockFormat:
    """The format of a ggml tensor type given by name ("Q8_0"), number or enum member."""
    try:
        if isinstance(kind, str):
            qtype = GGMLQuantizationType[kind.strip().upper()]
        else:
            qtype = GGMLQuantizationType(int(kind))
    except (KeyError, ValueError):
        valid = ", ".join(q.name for q in GGML_QUANT_SIZES)
        raise QuantError(f"unknown tensor type {kind!r}; known: {valid}") from None
    if qtype not in GGML_QUANT_SIZES:
        raise QuantError(f"tensor type {qtype.name} has no block size in gguf")
    return _make(qtype)


def tensor_bytes(shape_ggml: Sequence[int], kind: str | int | GGMLQuantizationType) -> int:
    """Bytes a tensor of this ggml-order shape takes in this type."""
    return block_format(kind).tensor_bytes(shape_ggml)


# ---------- where the scales sit: random blocks that dequantize to finite, trained-sized weights ----------


@dataclass(frozen=True)
class ScaleField:
    """A floating-point scale inside a block. Every other bit of a block (quants, grid indices, sign
    bits, the small integer sub-block scales and mins) may take any value and still dequantize to
    finite weights; the float scales may not (an all-ones f16 is NaN, a random e8m0 byte overflows).

    `magnitude` is the typical size of the decoded scale such that, with the other bits random, the
    block's weights come out about the size of a trained model's (~0.02), and never below the
    smallest normal number of the encoding (a twin has no subnormal scales)."""

    offset: int  # byte offset of the first value in the block
    encoding: str  # "f16"; "e8m0" (a power of two, decoded as ggml's half); "ue4m3" (unsigned fp8 e4m3, decoded
    # with NVFP4's factor 1/2); "f16_nibbles" (IQ1_M: one f16 spread over the top nibbles of four uint16)
    magnitude: float  # typical |decoded value|
    count: int = 1  # consecutive values of this encoding

    @property
    def n_bytes(self) -> int:
        return {"f16": 2, "e8m0": 1, "ue4m3": 1, "f16_nibbles": 8}[self.encoding] * self.count


def _f16(offset: int, magnitude: float) -> ScaleField:
    return ScaleField(offset, "f16", magnitude)


# Block layouts follow ggml-common.h (the same splits gguf.quants dequantizes by). Magnitudes: the
# decoded weight is scale x (quant level) x (sub-block scale, where there is one); e.g. Q4_0's level
# |q - 8| averages 4, so d ~ 0.005 gives weights ~0.02. Where that would put d below f16's smallest
# normal (6.1e-5: Q4_K, Q5_K, Q6_K, IQ4_XS, whose 6- or 8-bit sub-scales multiply it), d stays just
# above it and the weights come out a few times larger; still finite and far from overflow.
SCALE_FIELDS: dict[str, tuple[ScaleField, ...]] = {
    "Q4_0": (_f16(0, 5e-3),),  # d, qs[16]
    "Q4_1": (_f16(0, 3e-3), _f16(2, 2e-2)),  # d, m (the block's min), qs[16]
    "Q5_0": (_f16(0, 2.5e-3),),  # d, qh[4], qs[16]
    "Q5_1": (_f16(0, 1.3e-3), _f16(2, 2e-2)),  # d, m, qh[4], qs[16]
    "Q8_0": (_f16(0, 3e-4),),  # d, qs[32] int8
    "Q2_K": (_f16(80, 2e-3), _f16(82, 2e-3)),  # scales[16] (4-bit scale | 4-bit min), qs[64], d, dmin
    "Q3_K": (_f16(108, 6e-4),),  # hmask[32], qs[64], scales[12] (6-bit), d
    "Q4_K": (_f16(0, 1e-4), _f16(2, 5e-4)),  # d, dmin, scales[12] (6-bit scales and mins), qs[128]
    "Q5_K": (_f16(0, 1e-4), _f16(2, 3e-4)),  # d, dmin, scales[12], qh[32], qs[128]
    "Q6_K": (_f16(208, 1e-4),),  # ql[128], qh[64], scales[16] int8, d
    "IQ2_XXS": (_f16(0, 4e-4),),  # d, qs[32] uint16 (grid index, signs, 4-bit scale)
    "IQ2_XS": (_f16(0, 4e-4),),  # d, qs[32] uint16, scales[8]
    "IQ2_S": (_f16(0, 4e-4),),  # d, qs[64], qh[8], scales[8]
    "IQ3_XXS": (_f16(0, 2e-4),),  # d, qs[96] (grid indices, then signs and scales)
    "IQ3_S": (_f16(0, 2e-4),),  # d, qs[64], qh[8], signs[32], scales[4]
    "IQ1_S": (_f16(0, 2.5e-3),),  # d, qs[32], qh[8] uint16 (grid bits, 3-bit scale, delta sign)
    "IQ1_M": (ScaleField(48, "f16_nibbles", 2.5e-3),),  # qs[32], qh[16], scales[4] uint16 (3-bit scales + d)
    "IQ4_NL": (_f16(0, 4e-4),),  # d, qs[16] (indices into a 16-value table up to +-127)
    "IQ4_XS": (_f16(0, 1e-4),),  # d, scales_h uint16, scales_l[4], qs[128]
    "TQ1_0": (_f16(52, 2e-2),),  # qs[48] + qh[4] (base-3 packed ternary), d
    "TQ2_0": (_f16(64, 2e-2),),  # qs[64] (2-bit ternary), d
    "MXFP4": (ScaleField(0, "e8m0", 4e-3),),  # e (shared exponent), qs[16] (fp4 e2m1, doubled)
    "NVFP4": (ScaleField(0, "ue4m3", 8e-3, count=4),),  # d[4] (one ue4m3 per 16 weights), qs[32] (fp4 e2m1)
    "Q1_0": (_f16(0, 2e-2),),  # d, qs[16] (one sign bit per weight)
}
# How a twin spreads a field's values around its magnitude: log2|value| ~ Normal(log2 magnitude,
# SCALE_SPREAD), the mantissa cut to SCALE_MANTISSA_BITS bits (a quantizer divides block maxima of
# bf16 weights, which have 7). The spread matters to speed, not only to validity: x86 builds of ggml
# turn each block's f16 scale into f32 through a 256 KB lookup table, so the number and spread of
# distinct scale values decide how often that table misses the cache. On the default model (Q8_0 and
# Q5_0 blocks dominate its decode) a spread of 0.3 binade gave a twin within 2% of the model's decode
# time; 0.5 made it 14% slower, and every scale within one binade (a uniform 0.29 std) 9% faster.
# The model's own scales: 0.3-0.4 binade within a row, 0.1-0.6 between rows.
SCALE_SPREAD = 0.3  # std of log2|scale|, binades
SCALE_MANTISSA_BITS = 7  # mantissa bits kept in a twin's f16 scales
FLOAT_TYPES = ("F32", "F16", "BF16", "F64")  # elementwise floats: a twin writes normal(0, 0.02) values
INTEGER_TYPES = ("I8", "I16", "I32", "I64")  # index tables (expert routing maps): a twin writes zeros,
# the one value valid as an index into anything
