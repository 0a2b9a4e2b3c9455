"""Reference Q8_0 and Q4_0 quantizers in numpy.

Readable versions of ggml's reference block quantizers (quantize_row_q8_0_ref,
quantize_row_q4_0_ref): the output bytes are the bytes a GGUF file holds. The arithmetic is
float32 throughout, scales are stored as fp16, so results agree bit for bit with
`gguf.quants.quantize` and, for tensors llama.cpp quantized, dequantize to the same values as
`gguf.quants.dequantize`. Shapes follow gguf.quants: a float array of shape (..., n) becomes
uint8 of shape (..., n / block_elements * block_bytes) and back.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from ondevice.quant.formats import BlockFormat, Q4_0Format, Q8_0Format, block_format

from ondevice.core.errors import QuantError

__all__ = [
    "quantize",
    "dequantize",
    "quantize_q8_0",
    "dequantize_q8_0",
    "quantize_q4_0",
    "dequantize_q4_0",
    "round_half_away",
    "SUPPORTED",
]

_Q8_0: Q8_0Format = block_format("Q8_0")  # type: ignore[assignment]
_Q4_0: Q4_0Format = block_format("Q4_0")  # type: ignore[assignment]


def round_half_away(x: np.ndarray) -> np.ndarray:
    """C's roundf: to nearest, halves away from zero. Exact in float32 (no `+ 0.5` rounding)."""
    a = np.abs(x)
    whole = np.floor(a)
    up = (a - whole) >= np.float32(0.5)  # a - floor(a) is exact in binary floating point
    return np.copysign(whole + up.astype(a.dtype), x)


def _to_blocks(x: np.ndarray, fmt: BlockFormat) -> tuple[np.ndarray, tuple[int, ...]]:
    """float32 view of shape (n_blocks, block_elements), and the shape of the packed output."""
    x = np.asarray(x)
    if x.ndim == 0 or x.shape[-1] % fmt.block_elements:
        raise QuantError(
            f"{fmt.name}: row length {x.shape[-1] if x.ndim else 0} is not a multiple of {fmt.block_elements}"
        )
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, fmt.block_elements)
    out_shape = (*x.shape[:-1], x.shape[-1] // fmt.block_elements * fmt.block_bytes)
    return blocks, out_shape


def _to_packed(data: np.ndarray, fmt: BlockFormat) -> tuple[np.ndarray, tuple[int, ...]]:
    """uint8 view of shape (n_blocks, block_bytes), and the shape of the float output."""
    data = np.asarray(data)
    if data.dtype != np.uint8:
        data = data.view(np.uint8)
    if data.ndim == 0 or data.shape[-1] % fmt.block_bytes:
        raise QuantError(
            f"{fmt.name}: {data.shape[-1] if data.ndim else 0} bytes per row is not a multiple of {fmt.block_bytes}"
        )
    packed = np.ascontiguousarray(data).reshape(-1, fmt.block_bytes)
    out_shape = (*data.shape[:-1], data.shape[-1] // fmt.block_bytes * fmt.block_elements)
    return packed, out_shape


def _inverse(d: np.ndarray) -> np.ndarray:
    """1/d in float32, 0 where d is 0 (an all-zero block)."""
    inv = np.zeros_like(d)
    np.divide(np.float32(1.0), d, out=inv, where=d != 0)
    return inv


def _scale_bytes(d: np.ndarray) -> np.ndarray:
    return d.astype(np.float16).view(np.uint8).reshape(-1, 2)


def _scales(packed: np.ndarray, fmt: BlockFormat) -> np.ndarray:
    return packed[:, : fmt.scale_bytes].copy().view(np.float16).astype(np.float32)  # (n_blocks, 1)


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """d = max|x| / 127 per block; q = roundf(x / d) as int8."""
    blocks, out_shape = _to_blocks(x, _Q8_0)
    d = np.max(np.abs(blocks), axis=1, keepdims=True) / np.float32(_Q8_0.q_max)
    q = round_half_away(blocks * _inverse(d)).astype(np.int8)
    out = np.empty((blocks.shape[0], _Q8_0.block_bytes), dtype=np.uint8)
    out[:, : _Q8_0.scale_bytes] = _scale_bytes(d)
    out[:, _Q8_0.scale_bytes :] = q.view(np.uint8)
    return out.reshape(out_shape)


def dequantize_q8_0(data: np.ndarray) -> np.ndarray:
    packed, out_shape = _to_packed(data, _Q8_0)
    q = packed[:, _Q8_0.scale_bytes :].view(np.int8).astype(np.float32)
    return (q * _scales(packed, _Q8_0)).reshape(out_shape)


def quantize_q4_0(x: np.ndarray) -> np.ndarray:
    """d = (the value of largest magnitude, first if tied) / -8; q = min(15, trunc(x/d + 8.5))."""
    blocks, out_shape = _to_blocks(x, _Q4_0)
    first_max = np.argmax(np.abs(blocks), axis=1)[:, None]
    d = np.take_along_axis(blocks, first_max, axis=1) / np.float32(_Q4_0.divisor)
    shifted = blocks * _inverse(d) + np.float32(_Q4_0.offset + 0.5)
    q = np.minimum(np.trunc(shifted), np.float32(15)).astype(np.uint8)
    half = _Q4_0.block_elements // 2
    out = np.empty((blocks.shape[0], _Q4_0.block_bytes), dtype=np.uint8)
    out[:, : _Q4_0.scale_bytes] = _scale_bytes(d)
    out[:, _Q4_0.scale_bytes :] = q[:, :half] | (q[:, half:] << np.uint8(4))
    return out.reshape(out_shape)


def dequantize_q4_0(data: np.ndarray) -> np.ndarray:
    packed, out_shape = _to_packed(data, _Q4_0)
    nibbles = packed[:, _Q4_0.scale_bytes :]
    q = np.concatenate([nibbles & np.uint8(0x0F), nibbles >> np.uint8(4)], axis=1)
    levels = q.astype(np.float32) - np.float32(_Q4_0.offset)
    return (levels * _scales(packed, _Q4_0)).reshape(out_shape)


_QUANTIZERS: dict[str, tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]] = {
    "Q8_0": (quantize_q8_0, dequantize_q8_0),
    "Q4_0": (quantize_q4_0, dequantize_q4_0),
}
SUPPORTED = tuple(_QUANTIZERS)


def _pair(kind: str) -> tuple[Callable[[np.ndarray], np.ndarray], Callable[[np.ndarray], np.ndarray]]:
    name = block_format(kind).name
    if name not in _QUANTIZERS:
        raise QuantError(f"the numpy reference implements {', '.join(SUPPORTED)}, not {name}")
    return _QUANTIZERS[name]


def quantize(x: np.ndarray, kind: str) -> np.ndarray:
    """Quantize float weights (..., n) to packed bytes in format `kind` ("Q8_0" or "Q4_0")."""
    return _pair(kind)[0](x)


def dequantize(data: np.ndarray, kind: str) -> np.ndarray:
    """Packed bytes (..., n_bytes) in format `kind` back to float32 weights."""
    return _pair(kind)[1](data)
