"""Block formats as data, and the numpy reference quantizers against gguf's own."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq
from ondevice.quant import reference
from ondevice.quant.formats import Q4_0Format, Q8_0Format, all_formats, block_format, tensor_bytes

from ondevice.core.errors import QuantError


def test_every_format_comes_from_gguf_table():
    formats = all_formats()
    assert set(formats) == {q.name for q in GGML_QUANT_SIZES}
    for qtype, (elements, nbytes) in GGML_QUANT_SIZES.items():
        fmt = formats[qtype.name]
        assert (fmt.block_elements, fmt.block_bytes, fmt.ggml_type) == (elements, nbytes, qtype)


def test_bits_per_weight_and_classes():
    assert isinstance(block_format("Q8_0"), Q8_0Format)
    assert isinstance(block_format("q4_0"), Q4_0Format)
    assert block_format("Q8_0").bits_per_weight == 8.5
    assert block_format("Q4_0").bits_per_weight == 4.5
    assert block_format("F16").bits_per_weight == 16.0
    assert block_format(GGMLQuantizationType.Q4_K).bits_per_weight == 4.5
    assert block_format(14).name == "Q6_K"  # by number
    assert not block_format("F32").is_quantized and block_format("Q6_K").is_quantized


def test_tensor_bytes_arithmetic():
    # ggml order: (row length, rows)
    assert tensor_bytes((64, 512), "Q8_0") == 512 * 2 * 34
    assert tensor_bytes((256, 3), "Q4_K") == 3 * 144
    assert tensor_bytes((7,), "F32") == 28
    with pytest.raises(QuantError, match="not a whole number"):
        tensor_bytes((48, 2), "Q8_0")
    with pytest.raises(QuantError, match="unknown tensor type 'Q9_9'"):
        block_format("Q9_9")


def _cases(rng: np.random.Generator) -> list[np.ndarray]:
    """Random tensors at several scales plus the blocks where rounding rules matter."""
    cases = [(rng.standard_normal((16, 256)) * scale).astype(np.float32) for scale in (1e-4, 0.02, 1.0, 300.0)]
    edge = np.zeros((8, 32), dtype=np.float32)
    edge[1] = 0.5  # all equal: exact halves after scaling
    edge[2] = np.arange(32) - 15.5  # symmetric ramp, ties in magnitude
    edge[3] = np.linspace(-1, 1, 32)
    edge[4, 5] = -3.0  # one negative spike
    edge[5] = np.where(np.arange(32) % 2, 1.0, -1.0)  # equal magnitudes, first one wins for Q4_0
    edge[6] = rng.standard_normal(32) * 1e-30  # subnormal scales
    edge[7] = 65504.0 * np.sign(rng.standard_normal(32))  # fp16's largest finite scale range
    cases.append(edge)
    cases.append(rng.standard_normal((3, 4, 64)).astype(np.float16))  # 3-D, fp16 input
    return cases


@pytest.mark.parametrize("name", ["Q8_0", "Q4_0"])
def test_reference_matches_gguf_bit_for_bit(name):
    qtype = GGMLQuantizationType[name]
    for x in _cases(np.random.default_rng(7)):
        with np.errstate(over="ignore"):
            mine = reference.quantize(x, name)
            theirs = gq.quantize(x, qtype)
        assert mine.dtype == theirs.dtype == np.uint8
        assert mine.shape == theirs.shape
        assert np.array_equal(mine, theirs), f"{name}: bytes differ for a case of shape {x.shape}"
        back, back_gguf = reference.dequantize(mine, name), gq.dequantize(theirs, qtype)
        assert back.shape == x.shape
        assert np.array_equal(back, back_gguf, equal_nan=True)


def test_reference_round_trip_error_is_bounded():
    x = np.random.default_rng(1).standard_normal((64, 128)).astype(np.float32)
    # Q8_0: half a step of amax/127; Q4_0: a whole step of amax/8 (the level +8 is clipped to +7)
    for name, max_steps in (("Q8_0", 0.5 / 127), ("Q4_0", 1.0 / 8)):
        back = reference.dequantize(reference.quantize(x, name), name)
        amax = np.abs(x.reshape(-1, 32)).max(axis=1, keepdims=True)
        err = np.abs(back - x).reshape(-1, 32)
        assert np.all(err <= amax * max_steps + amax * 2e-3 + 1e-7)  # + fp16 rounding of the scale
    assert np.sqrt(np.mean((reference.dequantize(reference.quantize(x, "Q8_0"), "Q8_0") - x) ** 2)) < 0.01


def test_round_half_away_from_zero():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 0.49999997, -0.49999997, 2.4999998], dtype=np.float32)
    assert reference.round_half_away(x).tolist() == [1, 2, 3, -1, -2, 0, -0, 2]


def test_reference_rejects_bad_shapes_and_types():
    with pytest.raises(QuantError, match="multiple of 32"):
        reference.quantize(np.zeros((2, 33), np.float32), "Q8_0")
    with pytest.raises(QuantError, match="multiple of 18"):
        reference.dequantize(np.zeros((2, 20), np.uint8), "Q4_0")
    with pytest.raises(QuantError, match="implements Q8_0, Q4_0"):
        reference.quantize(np.zeros((1, 256), np.float32), "Q4_K")
