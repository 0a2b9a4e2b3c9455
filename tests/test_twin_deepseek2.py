"""DeepSeek-V2 (multi-head latent attention, a leading dense block, routed and shared experts) from its config.json,
as llama.cpp's converter writes it and the bundled llama.cpp loads it; and what the product does on it: the KV cache
llama.cpp allocates (the latent alone), the weights a decoded token reads, the twins of a model whose first block is
unlike the rest, and the extrapolation from them."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import leading_blocks, matching_blocks, quantized_header, reduce_layers, write_twin

from ondevice.core.errors import SpecError
from ondevice.gguf.spec import inspect
from ondevice.probing.twins import twin_blocks
from ondevice.roofline import ShapeTiming, extrapolate_layers
from tests.hf_headers import block_tensors as _block

CONFIG = Path(__file__).parent / "data" / "hf_configs" / "deepseek-v2-lite.json"
# DeepSeek-V2-Lite's shape at tiny widths, all 27 blocks: llama.cpp takes a model without q_lora_rank only at 26 or 27
TINY_LITE = {"hidden_size": 64, "num_attention_heads": 4, "intermediate_size": 128, "moe_intermediate_size": 32}
TINY_LITE |= {"n_routed_experts": 4, "num_experts_per_tok": 2, "kv_lora_rank": 32, "qk_rope_head_dim": 16}
TINY_LITE |= {"qk_nope_head_dim": 16, "v_head_dim": 16, "vocab_size": 512, "max_position_embeddings": 512}


def _config(**change) -> dict:
    return json.loads(CONFIG.read_text()) | change


@pytest.fixture(scope="module")
def lite():
    return header_from_hf_config(CONFIG)


@pytest.fixture(scope="module")
def lite_q4(lite):
    return quantized_header(lite, "Q4_K_M")


@pytest.fixture(scope="module")
def tiny_lite(tmp_path_factory) -> Path:
    header = quantized_header(header_from_hf_config(_config(**TINY_LITE)), "Q8_0")
    return write_twin(header, tmp_path_factory.mktemp("dsv2") / "tiny-lite.gguf")


def test_the_header_key_by_key(lite):
    values = {k.removeprefix("deepseek2."): lite.value(k) for k in lite.fields if k.startswith("deepseek2.")}
    assert values == {
        "block_count": 27,
        "context_length": 163840,
        "embedding_length": 2048,
        "feed_forward_length": 10944,  # the dense first block's
        "attention.head_count": 16,
        "attention.head_count_kv": 1,  # MLA as multi-query attention over the latent
        "rope.scaling.type": "yarn",
        "rope.scaling.factor": 40.0,
        "rope.scaling.original_context_length": 4096,
        "rope.scaling.yarn_beta_fast": 32.0,
        "rope.scaling.yarn_beta_slow": 1.0,
        "rope.freq_base": 10000.0,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-6),
        "expert_used_count": 6,
        "expert_group_count": 1,  # n_group, topk_group and scoring_func: the converter's base class
        "expert_group_used_count": 1,
        "expert_gating_func": 1,  # softmax
        "attention.key_length": 576,  # the cache's K: the 512 latent and the 64 rope key
        "attention.value_length": 512,
        "leading_dense_block_count": 1,
        "vocab_size": 102400,
        "attention.kv_lora_rank": 512,
        "attention.key_length_mla": 192,  # per head: 128 without rope, 64 with
        "attention.value_length_mla": 128,
        "expert_feed_forward_length": 1408,
        "expert_count": 64,
        "expert_shared_count": 2,
        "expert_weights_scale": 1.0,
        "rope.dimension_count": 64,
        "rope.scaling.yarn_log_multiplier": pytest.approx(0.0707),  # 0.1 x mscale_all_dim
    }
    keys = list(lite.fields)  # key_length/value_length keep the place AutoConfig's head_dim gave them in the base
    assert keys.index("deepseek2.attention.key_length") < keys.index("general.file_type")
    assert keys.index("general.file_type") < keys.index("deepseek2.leading_dense_block_count")
    # no q latent (q_lora_rank null), norm_topk_prob false: neither key
    assert not any(k.endswith(("q_lora_rank", "expert_weights_norm")) for k in lite.fields)
    assert [t.name for t in lite.tensors if not t.name.startswith("blk.")] == [
        "token_embd.weight",
        "output_norm.weight",
        "output.weight",
    ]


def test_the_dense_first_block_and_the_first_moe_block(lite):
    attention = {
        "attn_norm.weight": ((2048,), "F32"),
        "attn_q.weight": ((2048, 16 * 192), "F16"),
        "attn_kv_a_norm.weight": ((512,), "F32"),
        "attn_kv_a_mqa.weight": ((2048, 512 + 64), "F16"),
        "attn_k_b.weight": ((128, 512, 16), "F16"),  # kv_b split as the converter does for MLA
        "attn_v_b.weight": ((512, 128, 16), "F16"),
        "attn_output.weight": ((16 * 128, 2048), "F16"),
        "ffn_norm.weight": ((2048,), "F32"),
    }
    assert _block(lite, 0) == attention | {
        "ffn_gate.weight": ((2048, 10944), "F16"),
        "ffn_up.weight": ((2048, 10944), "F16"),
        "ffn_down.weight": ((10944, 2048), "F16"),
    }
    assert _block(lite, 1) == attention | {
        "ffn_gate_inp.weight": ((2048, 64), "F32"),
        "ffn_gate_exps.weight": ((2048, 1408, 64), "F16"),
        "ffn_up_exps.weight": ((2048, 1408, 64), "F16"),
        "ffn_down_exps.weight": ((1408, 2048, 64), "F16"),
        "ffn_gate_shexp.weight": ((2048, 2 * 1408), "F16"),  # the two shared experts as one, no gate of its own
        "ffn_up_shexp.weight": ((2048, 2 * 1408), "F16"),
        "ffn_down_shexp.weight": ((2 * 1408, 2048), "F16"),
    }
    assert _block(lite, 26) == _block(lite, 1)


def test_a_q_latent_and_the_other_routing_settings():
    """DeepSeek-V2 (236B)'s way: q through a latent of 1,536 and its norm; normalised top-k weights; sigmoid routing."""
    header = header_from_hf_config(_config(q_lora_rank=1536, norm_topk_prob=True, scoring_func="sigmoid"))
    assert header.value("deepseek2.attention.q_lora_rank") == 1536
    assert header.value("deepseek2.expert_weights_norm") is True and header.value("deepseek2.expert_gating_func") == 2
    q = {name: shape for name, (shape, _t) in _block(header, 0).items() if name.startswith("attn_q")}
    assert q == {"attn_q_a_norm.weight": (1536,), "attn_q_a.weight": (2048, 1536), "attn_q_b.weight": (1536, 3072)}


@pytest.mark.parametrize(
    "change, match",
    [
        ({"num_hidden_layers": 3}, "'q_lora_rank' is null; llama.cpp loads a DeepSeek-V2 without one"),
        ({"first_k_dense_replace": 28}, "'first_k_dense_replace' must be 0..27 (num_hidden_layers), not 28"),
        ({"first_k_dense_replace": "1"}, "'first_k_dense_replace' must be 0..27 (num_hidden_layers), not '1'"),
        ({"moe_layer_freq": 2}, "'moe_layer_freq' is 2; llama.cpp's deepseek2 makes every block after"),
        ({"scoring_func": "tanh"}, "'scoring_func' 'tanh' is not one of 'softmax', 'sigmoid'"),
        ({"n_shared_experts": 0}, "'n_shared_experts' must be a positive integer, not 0"),
        ({"n_routed_experts": None}, "'n_routed_experts' is missing"),
        ({"qk_rope_head_dim": None}, "'qk_rope_head_dim' is missing"),
        ({"kv_lora_rank": 0}, "'kv_lora_rank' must be a positive integer, not 0"),
        ({"num_experts_per_tok": 65}, "'num_experts_per_tok' 65 is more than the 64 experts"),
    ],
)
def test_a_bad_config_is_one_line_naming_the_field(change, match):
    cfg = {k: v for k, v in _config(**change).items() if v is not None}
    with pytest.raises(SpecError, match=f"^config.json: {re.escape(match)}") as err:
        header_from_hf_config(cfg)
    assert "\n" not in str(err.value)


def test_the_lite_shape_loads_with_its_27_blocks_and_cut_to_3(tiny_lite, tmp_path):
    """llama.cpp tells DeepSeek-V2-Lite (no q latent, no q_lora_rank key) by its 27 blocks; cut to 3 (a twin, a
    model of fewer blocks), the header says q_lora_rank 0, or llama.cpp would ask for the key and refuse it."""
    from ondevice.engine import load

    cut = reduce_layers(quantized_header(header_from_hf_config(_config(**TINY_LITE)), "Q8_0"), 3)
    assert cut.value("deepseek2.attention.q_lora_rank") == 0
    for path in (tiny_lite, write_twin(cut, tmp_path / "cut.gguf")):
        with load(path, n_ctx=256, n_threads=1) as eng:
            g = eng.generate("hello there", max_tokens=4, temperature=0, ignore_eos=True)
        assert len(g.timings.itl_s) == 3


def test_the_kv_cache_is_the_latent_alone_as_llama_cpp_allocates_it(tiny_lite):
    """With MLA llama.cpp caches K alone, key_length wide (the latent and the rope key), and reads V as a view of
    it: the spec's KV bytes per token are what llama.cpp's KV buffer holds per cell, not K + V."""
    from ondevice.engine import load
    from ondevice.llama.log import log_listener
    from ondevice.llama.memlog import parse_buffer_log

    spec = inspect(tiny_lite)
    assert spec.kv_k_only and spec.kv_bytes_per_token_by_layer == (2 * (32 + 16),) * 27
    lines: list[str] = []
    with log_listener(lines.append), load(tiny_lite, n_ctx=512, n_threads=1):
        pass
    assert parse_buffer_log(lines).total_bytes("KV") == pytest.approx(512 * spec.kv_bytes_per_token, abs=10 << 10)
    q8 = spec.with_kv_cache("q8_0", "q8_0")  # the V type changes nothing: there is no V
    assert q8.kv_bytes_per_token == round(27 * 48 * 34 / 32) and spec.with_kv_cache("q8_0", "f16") == replace(
        q8, kv_cache_types=("q8_0", "f16")
    )


def test_a_decoded_token_reads_the_used_experts_the_shared_ones_and_the_dense_block(lite, tmp_path):
    spec = inspect(write_twin(lite, tmp_path / "lite.gguf", sparse=True))
    routed = sum(t.n_bytes for t in lite.tensors if "_exps" in t.name)
    embed = next(t for t in lite.tensors if t.name == "token_embd.weight")
    rest = sum(t.n_bytes for t in lite.tensors if "_exps" not in t.name) - embed.n_bytes
    assert spec.decode_weight_bytes == rest + round(routed * 6 / 64) + embed.n_bytes // 102400
    assert spec.n_params_active - 2048 * 102400 == pytest.approx(2.4e9, rel=0.03)  # the card's 2.4B active


def test_twins_of_a_model_with_a_dense_first_block(lite_q4):
    """A twin keeps the model's first blocks, so its block 0 is the dense block: it takes its types from the dense
    block, the others from the MoE blocks in their mix of types (the Q4_K_M mix differs between them)."""
    assert leading_blocks(lite_q4) == 1
    assert matching_blocks(lite_q4, 1) == [0]
    picks = matching_blocks(lite_q4, 3)
    assert picks[0] == 0 and all(b > 0 for b in picks[1:])
    kinds = {_block(lite_q4, b)["ffn_down_exps.weight"][1] for b in picks[1:]}
    assert kinds == {_block(lite_q4, b)["ffn_down_exps.weight"][1] for b in range(1, 27)}  # both of the mix
    for k in (1, 3):
        twin = reduce_layers(lite_q4, k, matching_blocks(lite_q4, k))
        ffn = {name: kind for name, (_shape, kind) in _block(twin, 0).items() if name.startswith("ffn_")}
        assert ffn == {name: kind for name, (_shape, kind) in _block(lite_q4, 0).items() if name.startswith("ffn_")}
    v3_like = quantized_header(header_from_hf_config(_config(first_k_dense_replace=3)), "Q8_0")
    assert leading_blocks(v3_like) == 3 and matching_blocks(v3_like, 5)[:3] == [0, 1, 2]


def _timing(outside: float, blocks: list[float]) -> ShapeTiming:
    """A timing whose every point is the outside's time plus its blocks' (a decode step, a chunk)."""
    t = outside + sum(blocks)
    return ShapeTiming(decode=((16, t), (32, t)), prefill=((0, 1, t), (0, 16, 16 * t)))


@pytest.mark.parametrize("lead", [1, 3])
def test_the_twins_extrapolate_to_the_dense_blocks_and_the_rest_moe(lead):
    """Twins of the first blocks, the fewer holding every leading dense block: the line through them gives the
    lead once and the other blocks as MoE blocks. DeepSeek-V2 and GLM-4.5-Air have one dense block, DeepSeek-V3 and
    GLM-4.5 have 3: twins of 1 and 3 would hold nothing but dense blocks there and give 61 of them."""
    outside, dense, moe, n_layer = 0.002, 0.003, 0.001, 61

    def twin(blocks: int) -> ShapeTiming:
        return _timing(outside, [dense if i < lead else moe for i in range(blocks)])

    few, more = twin_blocks(_spec(n_layer), lead) or (0, 0)
    assert (few, more) == ((2, 4) if lead == 1 else (4, 6))
    full = extrapolate_layers(twin(few), twin(more), few, more, n_layer)
    truth = outside + lead * dense + (n_layer - lead) * moe
    assert [t for _c, t in full.decode] == pytest.approx([truth, truth], rel=1e-9)
    naive = extrapolate_layers(twin(1), twin(3), 1, 3, n_layer)  # the twins before they knew the lead
    assert dict(naive.decode)[16] == pytest.approx(truth if lead == 1 else outside + n_layer * dense, rel=1e-9)


def _spec(n_layer: int):
    from ondevice.roofline.spec import spec_from_flags

    return replace(
        spec_from_flags(params=16e9, quant="Q4_K_M", layers=n_layer, kv_heads=1, head_dim=576), weight_bytes=10 << 30
    )


def test_twin_blocks_keep_every_leading_block_in_the_fewer_twin():
    spec = _spec(27)
    assert twin_blocks(spec) == (1, 3) and twin_blocks(spec, 1) == (2, 4)
    assert twin_blocks(spec, 3) == (4, 6) and twin_blocks(spec, 4) == (5, 7)
    assert twin_blocks(_spec(6), 3) is None  # no fewer blocks to time than the model has: timed whole


@pytest.mark.parametrize("lead", [1, 3])
def test_a_prompt_chunk_extrapolates_exactly_though_the_last_block_runs_its_feed_forward_for_one_token(lead):
    """llama.cpp's last block computes its feed-forward for the output tokens only. A k-token chunk through blocks
    [kinds...] costs, per block, attention(k) and its feed-forward for k tokens, the last block's for 1. With the
    fewer twin ending on a dense block (twins of `lead` blocks and two more), the line takes the dense block's
    one-token feed-forward for the model's and misses its k-token one; twins ending on MoE blocks, as the model
    does, give the model's chunk exactly."""
    k, n_layer, attention = 16, 27, 0.004
    ffn = {"dense": lambda n: 0.002 * n, "moe": lambda n: 0.0005 + 0.0001 * n}  # seconds for n tokens

    def chunk_s(blocks: int) -> float:
        kinds = ["dense" if i < lead else "moe" for i in range(blocks)]
        return sum(attention + ffn[kind](1 if i == blocks - 1 else k) for i, kind in enumerate(kinds))

    def twin(blocks: int) -> ShapeTiming:
        return ShapeTiming(decode=((16, 0.01), (32, 0.01)), prefill=((0, 1, 0.01), (0, k, chunk_s(blocks))))

    def extrapolated(few: int, more: int) -> float:
        return dict(((p, n), t) for p, n, t in extrapolate_layers(twin(few), twin(more), few, more, n_layer).prefill)[
            (0, k)
        ]

    few, more = twin_blocks(_spec(n_layer), lead) or (0, 0)
    assert extrapolated(few, more) == pytest.approx(chunk_s(n_layer), rel=1e-9)
    assert extrapolated(lead, lead + 2) != pytest.approx(chunk_s(n_layer), rel=1e-3)  # the twins ending on dense


def test_a_model_with_a_dense_first_block_is_timed_on_its_twins(tiny_lite, tmp_path, monkeypatch):
    """The whole path `ondevice predict` takes for a large model: twins of 2 and 4 blocks of a 27-block Lite (the
    fewer its dense block and a MoE block, the more 2 MoE blocks beyond), holding the model's bytes, loaded, timed,
    extrapolated."""
    from ondevice.quant.twin import read_header

    import ondevice.probing.timing as timing_mod
    from ondevice.probing.twins import time_header
    from tests.test_twin_timing import PLAN

    monkeypatch.setattr(timing_mod, "_ATTENTION_BUDGET_S", 0.0)  # a tiny twin's bursts: one pair a round
    args = {"n_ctx": 256, "n_threads": 1}
    header = read_header(tiny_lite)
    timing, info = time_header(
        header,
        inspect(tiny_lite),
        plan=PLAN,
        work_dir=tmp_path / "w",
        engine_args=args,
        blocks=(2, 4),
        model_path=tiny_lite,
    )
    assert timing.source == "twins" and timing.layers == (2, 4) and info.spec.n_layer == 2
    assert all(s > 0 for _c, s in timing.decode)
