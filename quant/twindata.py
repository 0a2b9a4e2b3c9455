"""Valid random tensor data of any ggml type, fast: a pool of random blocks per type, tiled.

Kernel speed does not depend on the weights' values, only on their type and shape, so a model's
twin needs data that is valid (every scale a small normal number, no NaN/Inf, no subnormals:
formats.SCALE_FIELDS), its scales spread as a quantized model's are (formats.SCALE_SPREAD: on x86
the spread of scale values moves decode time), but not distinct per weight. One pool of POOL_BYTES
per type is drawn from the seed and repeated over every tensor of that type, each tensor starting
at its own point of the pool; writing is then a memory copy.

Values are not all alike in speed, though: a tensor that multiplies activations (a norm's gain, RoPE's
frequency factors) sets their size, and the size of activations moves prefill time where a kernel
branches or looks up by value (GELU's table, exp's range checks in softmax). A trained model's gains are
of order one; gains drawn as weights (about 0.02) shrink every activation to near zero, and such a twin
of Gemma 3 270M prefilled about 10% faster than the model. So gains get their own pool (`gain_pool`),
values around one.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np
from ondevice.quant.formats import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    SCALE_FIELDS,
    SCALE_MANTISSA_BITS,
    SCALE_SPREAD,
    ScaleField,
    block_format,
)

from ondevice.core.errors import QuantError

__all__ = ["block_pool", "gain_pool", "write_tiled", "supported_types", "POOL_BYTES", "WEIGHT_STD", "GAIN_STD"]

POOL_BYTES = 1 << 20  # random bytes per type (whole blocks), repeated over its tensors
CHUNK_BYTES = 8 << 20  # bytes handed to one write() call
WEIGHT_STD = 0.02  # std of float weights, like a trained model's
GAIN_STD = 0.1  # std of gains about their mean of one (norm gains, RoPE frequency factors)
_F16_MIN_NORMAL = 2.0**-14


def supported_types() -> tuple[str, ...]:
    """Every tensor type a twin can hold: float and integer types, and each block type with its scale layout."""
    return FLOAT_TYPES + INTEGER_TYPES + tuple(SCALE_FIELDS)


def block_pool(type_name: str, rng: np.random.Generator, pool_bytes: int = POOL_BYTES) -> np.ndarray:
    """Whole blocks of valid random data of a type, as a flat uint8 array of about `pool_bytes`."""
    fmt = block_format(type_name)
    n_blocks = max(1, pool_bytes // fmt.block_bytes)
    if fmt.name in FLOAT_TYPES:
        values = rng.standard_normal(n_blocks, dtype=np.float32) * np.float32(WEIGHT_STD)
        return _float_bytes(values, fmt.name)
    if fmt.name in INTEGER_TYPES:
        return np.zeros(n_blocks * fmt.block_bytes, dtype=np.uint8)
    fields = SCALE_FIELDS.get(fmt.name)
    if fields is None:
        raise QuantError(
            f"tensor type {fmt.name} has no scale layout here (an activation-only type, not stored in model files); "
            f"twins hold {', '.join(supported_types())}"
        )
    blocks = rng.integers(0, 256, size=(n_blocks, fmt.block_bytes), dtype=np.uint8)
    for field in fields:
        _fill_scale(blocks, field, rng)
    return blocks.reshape(-1)


def gain_pool(type_name: str, rng: np.random.Generator, pool_bytes: int = POOL_BYTES) -> np.ndarray:
    """Values of a float type around one (std GAIN_STD, all positive), for tensors that scale activations; a
    type that is not a float (no model stores gains so) gets its block_pool."""
    fmt = block_format(type_name)
    if fmt.name not in FLOAT_TYPES:
        return block_pool(type_name, rng, pool_bytes)
    n_values = max(1, pool_bytes // fmt.block_bytes)
    values = 1 + rng.standard_normal(n_values, dtype=np.float32) * np.float32(GAIN_STD)
    return _float_bytes(np.maximum(values, np.float32(0.5)), fmt.name)


def write_tiled(out: BinaryIO, pool: np.ndarray, n_bytes: int, start: int = 0) -> None:
    """Write `n_bytes` of `pool` repeated, beginning `start` bytes into it (whole blocks keep their
    layout as long as `start` and the pool are whole blocks)."""
    period = pool.size
    start %= period
    reps = -(-(min(n_bytes, CHUNK_BYTES) + start) // period) + 1
    chunk = np.tile(pool, reps)  # a buffer of at least one chunk from any start within the period
    left = n_bytes
    while left:
        n = min(left, CHUNK_BYTES)
        out.write(chunk.data[start : start + n])
        start = (start + n) % period
        left -= n


def _float_bytes(values: np.ndarray, type_name: str) -> np.ndarray:
    if type_name == "F32":
        return values.view(np.uint8)
    if type_name == "F64":
        return values.astype(np.float64).view(np.uint8)
    if type_name == "F16":
        return values.astype(np.float16).view(np.uint8)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)  # BF16: the top half of an f32, truncated
    return bf16.view(np.uint8)


def _scale_sizes(magnitude: float, n: int, rng: np.random.Generator) -> np.ndarray:
    """n values log-normally spread around `magnitude` (SCALE_SPREAD binades), mantissas cut to
    SCALE_MANTISSA_BITS bits, none below f16's smallest normal."""
    log2 = rng.normal(np.log2(magnitude), SCALE_SPREAD, n)
    exponent = np.floor(log2)
    step = 2.0**-SCALE_MANTISSA_BITS
    mantissa = np.floor((np.exp2(log2 - exponent) - 1) / step) * step
    return np.maximum((1 + mantissa) * np.exp2(exponent), _F16_MIN_NORMAL)


def _fill_scale(blocks: np.ndarray, field: ScaleField, rng: np.random.Generator) -> None:
    """Overwrite one scale field of every block with small normal values around field.magnitude."""
    n = blocks.shape[0] * field.count
    size = _scale_sizes(field.magnitude, n, rng)
    span = slice(field.offset, field.offset + field.n_bytes)
    if field.encoding == "f16":
        sign = rng.choice(np.array([-1.0, 1.0]), n)
        value = (sign * size).astype(np.float16)
        blocks[:, span] = value.view(np.uint8).reshape(blocks.shape[0], -1)
    elif field.encoding == "e8m0":  # decoded (as ggml's half) to 2**(e - 128)
        blocks[:, span] = np.clip(np.rint(np.log2(size)) + 128, 2, 254).astype(np.uint8).reshape(-1, field.count)
    elif field.encoding == "ue4m3":  # decoded to 0.5 * (1 + m/8) * 2**(e - 7); e >= 1 keeps it normal
        exp = np.clip(np.floor(np.log2(2 * size)) + 7, 1, 14).astype(np.uint8)
        man = rng.integers(0, 8, n, dtype=np.uint8)
        blocks[:, span] = ((exp << 3) | man).reshape(-1, field.count)
    elif field.encoding == "f16_nibbles":  # IQ1_M: bits 4k..4k+3 of the f16 in the top nibble of uint16 k
        d = size.astype(np.float16).view(np.uint16)
        words = blocks[:, span].copy().view(np.uint16)  # (n_blocks, 4)
        for k in range(4):
            words[:, k] = (words[:, k] & 0x0FFF) | (((d >> (4 * k)) & 0xF) << 12)
        blocks[:, span] = words.view(np.uint8)
    else:
        raise QuantError(f"unknown scale encoding {field.encoding!r}")
