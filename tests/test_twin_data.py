"""Twin data of every tensor type: the scale layout in formats.SCALE_FIELDS fits each block, every
scale is a small normal number, and the blocks dequantize (with gguf's own dequantizers) to finite
weights of a trained model's size."""

from __future__ import annotations

import io

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq
from ondevice.quant import twindata
from ondevice.quant.formats import (
    FLOAT_TYPES,
    INTEGER_TYPES,
    SCALE_FIELDS,
    SCALE_MANTISSA_BITS,
    SCALE_SPREAD,
    block_format,
)
from ondevice.quant.twindata import GAIN_STD, block_pool, gain_pool, supported_types, write_tiled

from ondevice.core.errors import QuantError

_F16_MIN_NORMAL = 2.0**-14
# gguf has no dequantizer for these; their scales are checked field by field below
NO_DEQUANTIZER = {"Q1_0"}
BLOCK_TYPES = sorted(SCALE_FIELDS)


def test_every_storable_type_gguf_knows_has_twin_data():
    known = {q.name for q in GGML_QUANT_SIZES}
    activation_only = {"Q8_1", "Q8_K"}  # llama.cpp's activation types, not stored in model files
    assert set(supported_types()) == known - activation_only
    for name in activation_only:
        with pytest.raises(QuantError, match="activation-only"):
            block_pool(name, np.random.default_rng(0))


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_scale_fields_fit_their_block(name):
    fmt = block_format(name)
    spans = sorted((f.offset, f.offset + f.n_bytes) for f in SCALE_FIELDS[name])
    assert spans[0][0] >= 0 and spans[-1][1] <= fmt.block_bytes
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(spans, spans[1:]))  # no overlap


def _decoded_scales(name: str, blocks: np.ndarray) -> np.ndarray:
    """Every scale of every block, decoded as ggml decodes it."""
    out = []
    for f in SCALE_FIELDS[name]:
        raw = np.ascontiguousarray(blocks[:, f.offset : f.offset + f.n_bytes])
        if f.encoding == "f16":
            out.append(raw.view(np.float16).astype(np.float64).ravel())
        elif f.encoding == "e8m0":
            assert raw.min() >= 2 and raw.max() <= 254  # 255 is NaN; below 2 the value is subnormal
            out.append(np.exp2(raw.astype(np.float64) - 128).ravel())
        elif f.encoding == "ue4m3":
            exp, man = raw >> 3, raw & 7
            assert exp.min() >= 1 and exp.max() <= 14 and not (raw == 0x7F).any()  # normal, not NaN
            out.append((0.5 * (1 + man / 8.0) * np.exp2(exp.astype(np.float64) - 7)).ravel())
        else:  # f16_nibbles (IQ1_M)
            words = raw.view(np.uint16).astype(np.uint32)
            bits = sum(((words[:, k] >> 12) & 0xF) << (4 * k) for k in range(4)).astype(np.uint16)
            out.append(bits.view(np.float16).astype(np.float64))
    return np.concatenate(out)


@pytest.mark.parametrize("name", BLOCK_TYPES)
def test_every_scale_is_a_small_normal_number(name):
    fmt = block_format(name)
    blocks = block_pool(name, np.random.default_rng(1), 1 << 16).reshape(-1, fmt.block_bytes)
    scales = np.abs(_decoded_scales(name, blocks))
    assert np.isfinite(scales).all()
    assert scales.min() >= _F16_MIN_NORMAL and scales.max() < 0.1  # no subnormals, nothing large


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0", "Q5_1", "IQ4_NL", "TQ2_0"])
def test_scales_spread_as_a_quantized_models(name):
    """log2|d| spreads SCALE_SPREAD binades around the magnitude, mantissas cut to SCALE_MANTISSA_BITS:
    the spread of distinct scale values moves decode time on x86 (ggml's f16 lookup table)."""
    fmt, field = block_format(name), SCALE_FIELDS[name][0]
    blocks = block_pool(name, np.random.default_rng(4), 1 << 20).reshape(-1, fmt.block_bytes)
    raw = np.ascontiguousarray(blocks[:, field.offset : field.offset + 2]).view(np.uint16).ravel()
    log2 = np.log2(np.abs(raw.view(np.float16).astype(np.float64)))
    assert abs(log2.mean() - np.log2(field.magnitude)) < 0.05
    assert abs(log2.std() - SCALE_SPREAD) < 0.03
    assert not (raw & ((1 << (10 - SCALE_MANTISSA_BITS)) - 1)).any()  # the low mantissa bits are zero


@pytest.mark.parametrize("name", [n for n in BLOCK_TYPES if n not in NO_DEQUANTIZER] + ["BF16"])
def test_blocks_dequantize_to_finite_trained_size_weights(name):
    fmt = block_format(name)
    pool = block_pool(name, np.random.default_rng(2), 1 << 16)
    weights = gq.dequantize(pool, fmt.ggml_type).astype(np.float64)
    assert weights.size == pool.size // fmt.block_bytes * fmt.block_elements
    assert np.isfinite(weights).all()
    rms = float(np.sqrt(np.mean(weights**2)))
    assert 0.005 < rms < 0.2 and np.abs(weights).max() < 1.0  # a trained model's weights: ~0.02
    assert len(np.unique(weights)) > 8  # the other bits are random


@pytest.mark.parametrize("name", FLOAT_TYPES + INTEGER_TYPES)
def test_float_and_integer_types(name):
    fmt = block_format(name)
    pool = block_pool(name, np.random.default_rng(3), 1 << 12)
    if name in INTEGER_TYPES:
        assert not pool.any()  # valid as an index into anything
        return
    dtype = {"F32": np.float32, "F16": np.float16, "F64": np.float64}.get(name)
    values = gq.dequantize(pool, fmt.ggml_type) if dtype is None else pool.view(dtype)
    assert np.isfinite(values).all() and 0.015 < float(np.std(values)) < 0.025


def test_pools_follow_the_seed():
    a = block_pool("Q4_K", np.random.default_rng(9))
    assert np.array_equal(a, block_pool("Q4_K", np.random.default_rng(9)))
    assert not np.array_equal(a, block_pool("Q4_K", np.random.default_rng(10)))
    assert a.size % GGML_QUANT_SIZES[GGMLQuantizationType.Q4_K][1] == 0


@pytest.mark.parametrize("n_bytes, start", [(0, 0), (5, 3), (100, 0), (1000, 60), (64 * 30 + 7, 64 * 7)])
def test_write_tiled_repeats_the_pool_from_its_start(monkeypatch, n_bytes, start):
    monkeypatch.setattr(twindata, "CHUNK_BYTES", 96)  # many chunks, not a multiple of the pool
    pool = np.arange(64 * 10, dtype=np.uint32).astype(np.uint8)[: 64 * 10]
    out = io.BytesIO()
    write_tiled(out, pool, n_bytes, start=start)
    expected = np.tile(pool, n_bytes // pool.size + 3)[start % pool.size : start % pool.size + n_bytes]
    assert out.getvalue() == expected.tobytes()


@pytest.mark.parametrize("name, dtype", [("F32", np.float32), ("F16", np.float16)])
def test_gains_are_positive_values_around_one(name, dtype):
    values = gain_pool(name, np.random.default_rng(5), 1 << 16).view(dtype).astype(np.float64)
    assert np.isfinite(values).all() and values.min() > 0
    assert abs(values.mean() - 1) < 0.01 and abs(values.std() - GAIN_STD) < 0.01


def test_bf16_gains_are_around_one_and_a_block_type_gets_its_blocks():
    bf16 = gain_pool("BF16", np.random.default_rng(6), 1 << 12).view(np.uint16).astype(np.uint32) << 16
    assert abs(bf16.view(np.float32).mean() - 1) < 0.02
    assert np.array_equal(gain_pool("Q8_0", np.random.default_rng(7)), block_pool("Q8_0", np.random.default_rng(7)))
