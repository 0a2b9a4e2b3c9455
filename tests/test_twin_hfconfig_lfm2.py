"""LFM2 (Lfm2ForCausalLM) config.json -> the GGUF header llama.cpp's converter writes: the keys one by one (KV heads
per block, 0 for a short convolution), the first convolution block and the first attention block tensor by tensor,
the first checkpoints' keys and Lfm2Config's defaults, the feed-forward width after block_auto_adjust_ff_dim, and a
one-line SpecError for what llama.cpp cannot load. A tiny LFM2 loads and generates (test_twin_hfconfig's tiny test
covers it too, F16 and Q8_0)."""

from __future__ import annotations

import re

import pytest
from gguf import GGUFValueType, Keys
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import quantized_header, write_twin

from ondevice.core.errors import SpecError
from tests.hf_headers import arch_fields, hf_config
from tests.hf_headers import block_tensors as _block

ATTENTION = (2, 5, 8, 10, 12, 14)  # LFM2 1.2B's attention blocks; the other ten of 16 are short convolutions
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "block_ff_dim": 192}
TINY |= {"num_hidden_layers": 3, "vocab_size": 512, "max_position_embeddings": 512}
TINY |= {"layer_types": ["conv", "full_attention", "conv"]}


def _config(name: str = "lfm2-1.2b") -> dict:
    return hf_config(name)


def test_lfm2_keys_as_the_converter_writes_them():
    header = header_from_hf_config(_config())
    assert header.arch == "lfm2" and header.n_layer == 16
    fields = arch_fields(header)
    values = {k: f.value for k, f in fields.items()}
    assert values == {
        "block_count": 16,
        "context_length": 128000,
        "embedding_length": 2048,
        "feed_forward_length": 8192,  # block_ff_dim 12288: 2/3 of it, rounded up to a multiple of 256
        "attention.head_count": 32,
        "attention.head_count_kv": tuple(8 if i in ATTENTION else 0 for i in range(16)),
        "rope.freq_base": 1_000_000.0,
        "vocab_size": 65536,
        "shortconv.l_cache": 3,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-5),
    }
    assert list(values)[-3:] == ["vocab_size", "shortconv.l_cache", "attention.layer_norm_rms_epsilon"]
    kv_heads = fields["attention.head_count_kv"]  # the converter's list of Python ints: an array of INT32
    assert (kv_heads.type, kv_heads.item_type) == (GGUFValueType.ARRAY, GGUFValueType.INT32)
    assert fields["feed_forward_length"].type == GGUFValueType.UINT32
    assert header.value(Keys.General.FILE_TYPE) == 1  # MOSTLY_F16


def test_lfm2_first_convolution_and_attention_blocks():
    header = header_from_hf_config(_config())
    ffn = {
        "ffn_norm.weight": ((2048,), "F32"),
        "ffn_gate.weight": ((2048, 8192), "F16"),
        "ffn_up.weight": ((2048, 8192), "F16"),
        "ffn_down.weight": ((8192, 2048), "F16"),
    }
    assert _block(header, 0) == {
        "attn_norm.weight": ((2048,), "F32"),  # the checkpoint's operator_norm, before either kind of block
        "shortconv.conv.weight": ((3, 2048), "F32"),  # (hidden, 1, L) squeezed; kept F32 by the converter
        "shortconv.in_proj.weight": ((2048, 6144), "F16"),  # B, C and x gates
        "shortconv.out_proj.weight": ((2048, 2048), "F16"),
        **ffn,
    }
    assert _block(header, 2) == {
        "attn_norm.weight": ((2048,), "F32"),
        "attn_q.weight": ((2048, 2048), "F16"),
        "attn_k.weight": ((2048, 512), "F16"),
        "attn_v.weight": ((2048, 512), "F16"),
        "attn_q_norm.weight": ((64,), "F32"),  # per head
        "attn_k_norm.weight": ((64,), "F32"),
        "attn_output.weight": ((2048, 2048), "F16"),
        **ffn,
    }
    assert _block(header, 1) == _block(header, 0) and _block(header, 14) == _block(header, 2)
    assert [t.name for t in header.tensors if not t.name.startswith("blk.")] == [
        "token_embd.weight",
        "token_embd_norm.weight",  # the final norm (the checkpoint's embedding_norm; llama.cpp's output norm)
    ]  # tied: no output.weight
    assert len(header.tensors) == 2 + 10 * 8 + 6 * 11


def test_lfm2_first_checkpoints_keys_and_lfm2config_defaults():
    cfg = {k: v for k, v in _config().items() if k != "layer_types"}
    first = cfg | {"full_attn_idxs": list(ATTENTION), "tie_embedding": False, "theta": 500_000.0}
    header = header_from_hf_config(first)
    assert header.value("lfm2.attention.head_count_kv") == tuple(8 if i in ATTENTION else 0 for i in range(16))
    assert header.value("lfm2.rope.freq_base") == 500_000.0
    assert [t.shape for t in header.tensors if t.name == "output.weight"] == [(2048, 65536)]
    # what a config leaves out is Lfm2Config's default, as the converter reads it through AutoConfig
    gone = ("conv_L_cache", "norm_eps", "num_key_value_heads", "rope_theta", "block_multiple_of")
    gone += ("block_ffn_dim_multiplier", "max_position_embeddings")
    bare = {k: v for k, v in _config().items() if k not in gone}
    assert header_from_hf_config(bare).fields == header_from_hf_config(_config()).fields
    # later configs give intermediate_size (adjusted all the same); block_ff_dim, where both are, is what counts
    later = {k: v for k, v in _config().items() if k != "block_ff_dim"} | {"intermediate_size": 12288}
    assert header_from_hf_config(later).value("lfm2.feed_forward_length") == 8192
    both = _config() | {"intermediate_size": 6656}
    assert header_from_hf_config(both).value("lfm2.feed_forward_length") == 8192


@pytest.mark.parametrize(
    "width, auto, multiplier, multiple, expected",
    [
        (12288, True, 1.0, 256, 8192),  # LFM2 1.2B
        (6656, True, 1.0, 256, 4608),  # LFM2 350M: int(2 * 6656 / 3) = 4437, rounded up
        (10752, False, 1.0, 256, 10752),  # as given
        (12288, True, 1.5, 256, 12288),
        (12288, True, None, 256, 8192),  # no multiplier
        (1000, True, 1.0, 100, 700),
    ],
)
def test_lfm2_feed_forward_width(width, auto, multiplier, multiple, expected):
    change = {"block_ff_dim": width, "block_auto_adjust_ff_dim": auto, "block_multiple_of": multiple}
    header = header_from_hf_config(_config() | change | {"block_ffn_dim_multiplier": multiplier})
    assert header.value("lfm2.feed_forward_length") == expected
    assert _block(header, 0)["ffn_down.weight"] == ((expected, 2048), "F16")


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": None}, "'layer_types' (or 'full_attn_idxs') is missing"),
        ({"layer_types": "conv"}, "'layer_types' must be a list, not 'conv'"),
        ({"layer_types": ["conv"] * 15}, "'layer_types' names 15 blocks, not the 16 of num_hidden_layers"),
        ({"layer_types": ["conv"] * 15 + ["mamba"]}, "'layer_types' has 'mamba'; an LFM2 block is 'conv' or "),
        ({"layer_types": None, "full_attn_idxs": [2, 16]}, "'full_attn_idxs' must list block indices 0..15, not [2,"),
        ({"conv_L_cache": 1}, "'conv_L_cache' must be at least 2, not 1"),
        ({"conv_L_cache": "3"}, "'conv_L_cache' must be a positive integer, not '3'"),
        ({"conv_bias": True}, "'conv_bias' is True; llama.cpp's LFM2 has no such bias"),
        ({"block_auto_adjust_ff_dim": "yes"}, "'block_auto_adjust_ff_dim' must be true or false, not 'yes'"),
        ({"block_multiple_of": 0}, "'block_multiple_of' must be a positive integer, not 0"),
        ({"block_ffn_dim_multiplier": "x"}, "'block_ffn_dim_multiplier' must be a number, not 'x'"),
        ({"block_ffn_dim_multiplier": 1e-6}, "the feed-forward width comes out 0"),
        ({"head_dim": 128}, "32 heads of 128 are not hidden_size 2048; llama.cpp loads no such LFM2"),
        ({"norm_eps": "small"}, "'norm_eps' must be a number, not 'small'"),
        ({"num_key_value_heads": 5}, "num_attention_heads 32 is not a multiple of num_key_value_heads 5"),
        ({"block_ff_dim": None, "intermediate_size": None}, "'intermediate_size' is missing"),
    ],
)
def test_lfm2_invalid_config_is_one_line(change, message):
    cfg = {k: v for k, v in (_config() | change).items() if v is not None}
    with pytest.raises(SpecError, match=f"^config.json: {re.escape(message)}") as err:
        header_from_hf_config(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("qtype", [None, "Q8_0"])
def test_tiny_lfm2_loads_and_generates(tmp_path, qtype):
    """Convolution, attention, convolution: llama.cpp takes the blocks with 0 KV heads as recurrent."""
    from tests.test_hybrid_model import assert_tiny_hybrid_runs

    header = header_from_hf_config(_config() | TINY)
    if qtype:
        header = quantized_header(header, qtype)
    spec = assert_tiny_hybrid_runs(write_twin(header, tmp_path / "tiny-lfm2.gguf"))
    assert spec.attention_layers == (1,) and spec.kv_bytes_per_token_by_layer == (0, 2 * 2 * 2 * 16, 0)
