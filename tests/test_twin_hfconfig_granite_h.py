"""Granite 4.0-H (GraniteMoeHybridForCausalLM) config.json -> the GGUF header llama.cpp's converter writes: the keys
one by one (KV heads per block, 0 for a Mamba-2 block; the SSM keys; rope off and a context of 2**20), the first Mamba
block and the first attention block tensor by tensor (routed and shared experts in H-Tiny, a dense MLP in H-Micro),
the published parameter counts, and a one-line SpecError for what the converter refuses or llama.cpp cannot load.
Tiny Granite-Hs, with experts and dense, load and generate at F16 and Q8_0. The product on it: twins of one and three
periods of its layer pattern, the cache of a Mamba-2 state reused only where all of it is a prefix, the timing's chain
reusing each link."""

from __future__ import annotations

import math
import re

import pytest
from gguf import GGUFValueType, Keys
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import quantized_header, write_twin

from ondevice.core.errors import SpecError
from ondevice.gguf.spec import inspect
from tests.hf_headers import arch_fields, hf_config
from tests.hf_headers import block_tensors as _block

ATTENTION = (5, 15, 25, 35)  # Granite 4.0-H's attention blocks; the other 36 of 40 are Mamba-2
TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 64}
TINY |= {"shared_intermediate_size": 64, "num_local_experts": 4, "num_experts_per_tok": 2, "num_hidden_layers": 3}
TINY |= {"vocab_size": 512, "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16}
TINY |= {"layer_types": ["mamba", "attention", "mamba"]}
DENSE = {"num_local_experts": 0, "num_experts_per_tok": 0, "intermediate_size": 128, "shared_intermediate_size": 128}


def _config(name: str = "granite-4.0-h-tiny") -> dict:
    return hf_config(name)


def test_granite_h_tiny_keys_as_the_converter_writes_them():
    header = header_from_hf_config(_config())
    assert header.arch == "granitehybrid" and header.n_layer == 40
    fields = arch_fields(header)
    values = {k: f.value for k, f in fields.items()}
    assert values == {
        "block_count": 40,
        "context_length": 2**20,  # a hybrid has no rope: the converter's 2**20 in the base's place
        "embedding_length": 1536,
        "feed_forward_length": 512,  # each routed expert's width
        "attention.head_count": 12,
        "attention.head_count_kv": tuple(4 if i in ATTENTION else 0 for i in range(40)),
        "rope.freq_base": 10000.0,  # written, unused (rope is off)
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-5),
        "expert_count": 64,
        "expert_used_count": 6,
        "vocab_size": 100352,
        "rope.dimension_count": 128,
        "attention.scale": 0.0078125,
        "embedding_scale": 12.0,
        "residual_scale": pytest.approx(0.22),
        "logit_scale": 6.0,
        "expert_shared_feed_forward_length": 1024,
        "ssm.conv_kernel": 4,
        "ssm.state_size": 128,
        "ssm.group_count": 1,
        "ssm.inner_size": 3072,  # mamba_expand x hidden_size
        "ssm.time_step_rank": 48,  # the SSM head count (mamba_n_heads), as llama.cpp uses it
        "rope.scaling.finetuned": False,  # llama.cpp's switch for rope: off
    }
    assert list(values)[-7:-1] == [
        "expert_shared_feed_forward_length",
        "ssm.conv_kernel",
        "ssm.state_size",
        "ssm.group_count",
        "ssm.inner_size",
        "ssm.time_step_rank",
    ]
    kv_heads = fields["attention.head_count_kv"]  # the converter's list of Python ints: an array of INT32
    assert (kv_heads.type, kv_heads.item_type) == (GGUFValueType.ARRAY, GGUFValueType.INT32)
    assert fields["ssm.inner_size"].type == GGUFValueType.UINT32
    assert fields["rope.scaling.finetuned"].type == GGUFValueType.BOOL
    assert header.value(Keys.General.FILE_TYPE) == 1  # MOSTLY_F16


def test_granite_h_first_mamba_and_attention_blocks():
    header = header_from_hf_config(_config())
    ffn = {
        "ffn_norm.weight": ((1536,), "F32"),
        "ffn_gate_inp.weight": ((1536, 64), "F32"),
        "ffn_gate_exps.weight": ((1536, 512, 64), "F16"),  # the checkpoint's input_linear, split into gate and up
        "ffn_up_exps.weight": ((1536, 512, 64), "F16"),
        "ffn_down_exps.weight": ((512, 1536, 64), "F16"),
        "ffn_gate_shexp.weight": ((1536, 1024), "F16"),
        "ffn_up_shexp.weight": ((1536, 1024), "F16"),
        "ffn_down_shexp.weight": ((1024, 1536), "F16"),
    }
    assert _block(header, 0) == {
        "attn_norm.weight": ((1536,), "F32"),  # the checkpoint's input_layernorm, before either kind of mixer
        "ssm_in.weight": ((1536, 2 * 3072 + 2 * 128 + 48), "F16"),  # z, x, B, C and one dt per head
        "ssm_conv1d.weight": ((4, 3072 + 2 * 128), "F32"),  # over x, B and C; kept F32 by the converter
        "ssm_conv1d.bias": ((3328,), "F32"),
        "ssm_dt.bias": ((48,), "F32"),
        "ssm_a": ((1, 48), "F32"),  # -exp(A_log), no ".weight"
        "ssm_d": ((1, 48), "F32"),
        "ssm_norm.weight": ((3072, 1), "F32"),  # per group
        "ssm_out.weight": ((3072, 1536), "F16"),
        **ffn,
    }
    assert _block(header, 5) == {
        "attn_norm.weight": ((1536,), "F32"),
        "attn_q.weight": ((1536, 1536), "F16"),
        "attn_k.weight": ((1536, 512), "F16"),  # 4 KV heads of 128
        "attn_v.weight": ((1536, 512), "F16"),
        "attn_output.weight": ((1536, 1536), "F16"),
        **ffn,
    }
    assert _block(header, 1) == _block(header, 0) and _block(header, 35) == _block(header, 5)
    assert [t.name for t in header.tensors if not t.name.startswith("blk.")] == [
        "token_embd.weight",
        "output_norm.weight",
    ]  # tied: no output.weight
    assert len(header.tensors) == 2 + 36 * 17 + 4 * 13


def test_granite_h_micro_is_dense_and_the_published_sizes():
    header = header_from_hf_config(_config("granite-4.0-h-micro"))
    assert header.value("granitehybrid.expert_count") == 0 and header.value("granitehybrid.expert_used_count") == 0
    assert header.value("granitehybrid.expert_shared_feed_forward_length") == 8192  # written; the loader ignores it
    assert header.value("granitehybrid.ssm.inner_size") == 4096
    assert header.value("granitehybrid.ssm.time_step_rank") == 64
    block = _block(header, 0)
    assert {k: v for k, v in block.items() if k.startswith("ffn")} == {
        "ffn_norm.weight": ((2048,), "F32"),
        "ffn_gate.weight": ((2048, 8192), "F16"),  # the checkpoint's shared_mlp, as the dense MLP
        "ffn_up.weight": ((2048, 8192), "F16"),
        "ffn_down.weight": ((8192, 2048), "F16"),
    }
    # the Hub pages' sizes: H-Tiny 6.94B (7B, 1B active), H-Micro 3.19B (3B), the tied embedding counted once
    tiny = header_from_hf_config(_config())
    assert sum(math.prod(t.shape) for t in tiny.tensors) == 6_939_037_248
    assert sum(math.prod(t.shape) for t in header.tensors) == 3_191_396_096


def test_granite_h_attention_layers_by_index_or_period_and_no_multiplier_missing():
    cfg = {k: v for k, v in _config().items() if k != "layer_types"}
    by_index = header_from_hf_config(cfg | {"attn_layer_indices": list(ATTENTION)})
    by_period = header_from_hf_config(cfg | {"attn_layer_period": 10, "attn_layer_offset": 5})
    assert by_index.fields == by_period.fields == header_from_hf_config(_config()).fields
    # config.json is read as it is (no AutoConfig): a multiplier it leaves out is not written
    bare = header_from_hf_config({k: v for k, v in _config().items() if k != "logits_scaling"})
    assert "granitehybrid.logit_scale" not in bare.fields
    no_bias = header_from_hf_config(_config() | {"mamba_conv_bias": False})
    assert "ssm_conv1d.bias" not in _block(no_bias, 0)
    untied = header_from_hf_config(_config() | {"tie_word_embeddings": False})
    assert [t.shape for t in untied.tensors if t.name == "output.weight"] == [(1536, 100352)]


@pytest.mark.parametrize(
    "change, message",
    [
        ({"layer_types": None}, "'layer_types' (or 'attn_layer_indices', 'attn_layer_period') is missing"),
        ({"layer_types": "mamba"}, "'layer_types' must be a list, not 'mamba'"),
        ({"layer_types": ["mamba"] * 39}, "'layer_types' names 39 blocks, not the 40 of num_hidden_layers"),
        ({"layer_types": ["mamba"] * 39 + ["conv"]}, "'layer_types' has 'conv'; a Granite-H block is 'mamba' or "),
        ({"layer_types": ["attention"] * 40}, "no block is 'mamba'; the converter writes it as granite or granitemoe"),
        ({"layer_types": None, "attn_layer_indices": [5, 40]}, "'attn_layer_indices' must list block indices 0..39"),
        ({"layer_types": None, "attn_layer_period": 10}, "'attn_layer_offset' must be 0..9, not None"),
        ({"mamba_expand": 3}, "'mamba_expand' is 3; llama.cpp's granitehybrid takes only 2"),
        ({"mamba_expand": None}, "'mamba_expand' is missing"),
        ({"mamba_d_state": None}, "'mamba_d_state' is missing"),
        ({"mamba_d_conv": 0}, "'mamba_d_conv' must be a positive integer, not 0"),
        ({"mamba_n_heads": 40}, "'mamba_n_heads' 40 must divide the inner size 3072 and be a multiple of"),
        ({"mamba_d_head": 32}, "'mamba_d_head' 32 x 48 heads is not the inner size 3072"),
        ({"mamba_proj_bias": True}, "'mamba_proj_bias' is True; llama.cpp's granitehybrid has no such bias"),
        ({"attention_bias": True}, "'attention_bias' is True; llama.cpp's granitehybrid has no such bias"),
        ({"hidden_act": "gelu"}, "'hidden_act' is 'gelu'; the converter takes only 'silu'"),
        ({"rms_norm_eps": None}, "'rms_norm_eps' is missing"),
        ({"num_experts_per_tok": 65}, "'num_experts_per_tok' 65 is more than the 64 experts"),
        ({"num_key_value_heads": 5}, "num_attention_heads 12 is not a multiple of num_key_value_heads 5"),
        ({"num_local_experts": 0}, "'shared_intermediate_size' 1024 is not intermediate_size 512; llama.cpp loads"),
    ],
)
def test_granite_h_invalid_config_is_one_line(change, message):
    cfg = {k: v for k, v in (_config() | change).items() if v is not None}
    with pytest.raises(SpecError, match=f"^config.json: {re.escape(message)}") as err:
        header_from_hf_config(cfg)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("dense", [False, True], ids=["experts", "dense"])
@pytest.mark.parametrize("qtype", [None, "Q8_0"])
def test_tiny_granite_h_loads_and_generates(tmp_path, qtype, dense):
    """Mamba-2, attention, Mamba-2: llama.cpp takes the blocks with 0 KV heads as recurrent."""
    from tests.test_hybrid_model import assert_tiny_hybrid_runs

    header = header_from_hf_config(_config() | TINY | (DENSE if dense else {}))
    if qtype:
        header = quantized_header(header, qtype)
    spec = assert_tiny_hybrid_runs(write_twin(header, tmp_path / "tiny-granite-h.gguf"))
    assert spec.attention_layers == (1,) and spec.kv_bytes_per_token_by_layer == (0, 2 * 2 * 2 * 16, 0)
    assert spec.n_expert == (0 if dense else 4) and spec.n_expert_used == (0 if dense else 2)


# ---------- the product: twins of its period, prefix reuse on a Mamba-2 state, the timing's chain ----------

SAMPLED = dict(max_tokens=12, temperature=1.0, seed=5, ignore_eos=True)  # a draw that any other state would move


@pytest.fixture(scope="module")
def engine(synth_dir):
    from ondevice.engine import load

    cfg = _config() | TINY | {"num_hidden_layers": 4, "layer_types": ["mamba", "attention", "mamba", "mamba"]}
    eng = load(write_twin(header_from_hf_config(cfg), synth_dir / "tiny-granite-h.gguf"), n_ctx=2048, n_threads=1)
    yield eng
    eng.close()


def test_granite_h_is_timed_on_twins_of_one_and_three_periods(tmp_path):
    from ondevice.quant.twin import leading_blocks, matching_blocks, reduce_layers

    from ondevice.probing.twins import twin_blocks, window_period

    header = quantized_header(header_from_hf_config(_config()), "Q4_K_M")
    spec = inspect(write_twin(header, tmp_path / "tiny.gguf", sparse=True))
    assert spec.attention_layers == ATTENTION and spec.kv_bytes_per_token == 4 * 2 * 2 * 4 * 128
    # attention at 5, 15, 25, 35: every 10 blocks, the five Mamba-2 blocks before the first within the period
    assert window_period(spec) == 10 and leading_blocks(header) == 0 and twin_blocks(spec) == (10, 30)
    for k in (10, 30):  # each twin block of its own kind, the KV heads per block cut with them
        twin = reduce_layers(header, k, matching_blocks(header, k))
        assert twin.value("granitehybrid.attention.head_count_kv") == tuple(4 * (i % 10 == 5) for i in range(k))


def test_granite_h_cache_reused_only_where_all_of_it_is_a_prefix(engine):
    assert engine.info.recurrent
    a = engine.generate(list(range(1, 40)), reuse_prefix=False, **SAMPLED)
    longer = list(range(1, 40)) + list(a.token_ids[:-1]) + [77, 78, 79]  # the cache holds all but the last output
    reused = engine.generate(longer, reuse_prefix=True, **SAMPLED)
    assert reused.cached_prompt_tokens == 50
    assert reused.token_ids == engine.generate(longer, reuse_prefix=False, **SAMPLED).token_ids
    other = list(range(1, 21)) + [300, 301, 302]  # shares 20 tokens: a Mamba-2 state cannot go back to them
    assert engine.cached_prefix(other) == 0
    g = engine.generate(other, reuse_prefix=True, **SAMPLED)
    assert g.cached_prompt_tokens == 0
    assert g.token_ids == engine.generate(other, reuse_prefix=False, **SAMPLED).token_ids


def test_granite_h_timing_chain_reuses_each_link(engine, monkeypatch):
    from tests.test_hybrid_model import assert_chain_reuses_each_link

    assert_chain_reuses_each_link(engine, monkeypatch)
