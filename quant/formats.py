"""Block formats as data.

Every ggml tensor type stores its elements in fixed-size blocks: `block_elements` weights
packed into `block_bytes` bytes. The numbers come from gguf's GGML_QUANT_SIZES (never a
hand-typed table); this module only adds names, the byte arithmetic built on them, and, for
the two formats the numpy reference implements (Q8_0, Q4_0), the layout of one block.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.core.errors import QuantError

__all__ = ["BlockFormat", "Q8_0Format", "Q4_0Format", "block_format", "all_formats", "tensor_bytes"]


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
                f"{self.name}: a row of {n_elements} weights is not a whole number of {self.block_elements}-weight blocks"
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
