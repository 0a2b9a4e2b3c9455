"""Hugging Face config.json -> GGUF header: full-size public configs give the published models'
parameter counts and shapes; a tiny config of every architecture loads in llama.cpp and generates;
Gemma 3 270M's config, quantized by the dry run, is the default model's header; a missing or
invalid field is a SpecError that names it."""

from __future__ import annotations

import re

import numpy as np
import pytest
from gguf import Keys
from ondevice.quant.hfconfig import SUPPORTED, header_from_hf_config
from ondevice.quant.twin import quantized_header, read_header, shape_key, write_twin

from ondevice.core.errors import SpecError
from ondevice.gguf.spec import inspect
from ondevice.llama.log import log_listener
from ondevice.llama.logits import LogitsModel
from tests.hf_headers import CONFIGS, block_tensors, hf_config

# Published parameter counts (the models' safetensors totals) and a few shapes to check.
PUBLISHED = {
    "llama-3.1-8b": (8_030_261_248, {"n_layer": 32, "d_model": 4096, "n_head_kv": 8, "n_vocab": 128256}),
    "mistral-7b-v0.1": (7_241_732_096, {"n_layer": 32, "n_head_kv": 8, "n_vocab": 32000}),
    "mixtral-8x7b-v0.1": (46_702_792_704, {"n_layer": 32, "n_expert": 8, "n_expert_used": 2}),
    "qwen2.5-0.5b": (494_032_768, {"n_layer": 24, "d_model": 896, "n_head_kv": 2, "tied_output": True}),
    "qwen3-0.6b": (596_049_920, {"n_layer": 28, "head_dim_k": 128, "tied_output": True}),
    "qwen3-30b-a3b": (30_532_122_624, {"n_layer": 48, "n_expert": 128, "n_expert_used": 8, "head_dim_k": 128}),
    "gemma-2-2b": (2_614_341_888, {"n_layer": 26, "head_dim_k": 256, "sliding_window": 4096}),
    "gemma-3-1b-pt": (999_885_952, {"n_layer": 26, "n_head_kv": 1, "sliding_window": 512}),
    "gemma-3-270m": (268_098_176, {"n_layer": 18, "d_model": 640, "n_vocab": 262144}),
    "phi-3-mini-4k-instruct": (3_821_079_552, {"n_layer": 32, "d_model": 3072, "n_vocab": 32064}),
    "qwen2.5-7b": (7_615_616_512, {"n_layer": 28, "d_model": 3584, "n_head_kv": 4, "n_vocab": 152064}),
    "llama-3.2-3b": (3_212_749_824, {"n_layer": 28, "d_model": 3072, "tied_output": True, "n_vocab": 128256}),
    "smollm2-1.7b": (1_711_376_384, {"n_layer": 24, "d_model": 2048, "n_head_kv": 32, "tied_output": True}),
    "smollm2-360m": (361_821_120, {"n_layer": 32, "d_model": 960, "n_head_kv": 5, "n_vocab": 49152}),
    "qwen2.5-1.5b": (1_543_714_304, {"n_layer": 28, "d_model": 1536, "n_head_kv": 2, "tied_output": True}),
    "llama-3.2-1b": (1_235_814_400, {"n_layer": 16, "d_model": 2048, "n_head_kv": 8, "tied_output": True}),
    # head_dim 128 where hidden_size / heads would be 80 and 160
    "qwen3-4b": (4_022_468_096, {"n_layer": 36, "d_model": 2560, "head_dim_k": 128, "tied_output": True}),
    "mistral-nemo-base-2407": (12_247_782_400, {"n_layer": 40, "d_model": 5120, "head_dim_k": 128, "n_vocab": 131072}),
    # 1.7B with the tied embedding counted once (its card: 1.7B, 1.4B of them outside the embedding)
    "qwen3-1.7b": (1_720_574_976, {"n_layer": 28, "d_model": 2048, "head_dim_k": 128, "tied_output": True}),
    # its card: 3.09B, 2.77B of them outside the embedding
    "qwen2.5-3b": (3_085_938_688, {"n_layer": 36, "d_model": 2048, "n_head_kv": 2, "tied_output": True}),
    "qwen3-8b": (8_190_735_360, {"n_layer": 36, "d_model": 4096, "n_head_kv": 8, "head_dim_k": 128}),
    # Granite 3 (its card: 2.5B; the tied embedding counted once) and OLMo 2 (no norm before attention or the
    # feed-forward, one after each, q/k norms over all heads; cards: 1.48B and 7.3B, 1B and 7B by name)
    "granite-3.1-2b-base": (2_533_531_648, {"n_layer": 40, "d_model": 2048, "n_head_kv": 8, "tied_output": True}),
    "granite-3.3-8b-instruct": (8_170_864_640, {"n_layer": 40, "d_model": 4096, "n_vocab": 49159, "tied_output": True}),
    "olmo-2-0425-1b": (1_484_916_736, {"n_layer": 16, "d_model": 2048, "n_head_kv": 16, "n_vocab": 100352}),
    "olmo-2-1124-7b": (7_298_617_344, {"n_layer": 32, "d_model": 4096, "n_head_kv": 32, "tied_output": False}),
    # LFM2 (the cards' exact counts: 1,170,340,608 and 354,483,968; 10 short-convolution and 6 attention blocks)
    "lfm2-1.2b": (1_170_340_608, {"n_layer": 16, "d_model": 2048, "n_head_kv": 8, "tied_output": True}),
    "lfm2-350m": (354_483_968, {"n_layer": 16, "d_model": 1024, "n_head_kv": 8, "tied_output": True}),
    # OLMoE (its card: 6.9B total, 1.3B active; 64 experts of 1,024 a block, 8 used), Gemma 2 9B (its card: 9B;
    # 9,241,705,984 on its Hub page, the tied embedding counted once), Qwen2.5 14B (its card: 14.7B, 13.1B of them
    # outside the embedding; the exact figure derived from the config's shapes)
    "olmoe-1b-7b-0924": (6_919_161_856, {"n_layer": 16, "d_model": 2048, "n_expert": 64, "n_expert_used": 8}),
    "gemma-2-9b": (9_241_705_984, {"n_layer": 42, "d_model": 3584, "head_dim_k": 256, "n_head_kv": 8}),
    "qwen2.5-14b": (14_770_033_664, {"n_layer": 48, "d_model": 5120, "n_head_kv": 8, "n_vocab": 152064}),
    # Qwen1.5-MoE (its card: 14.3B total, 2.7B activated; 60 experts of 1,408 and a shared one of 5,632 a block) and
    # Starcoder2 3B (its Hub page: 3.03B, the tied embedding counted once)
    "qwen1.5-moe-a2.7b": (14_315_784_192, {"n_layer": 24, "d_model": 2048, "n_expert": 60, "n_expert_used": 4}),
    "starcoder2-3b": (3_030_371_328, {"n_layer": 30, "d_model": 3072, "n_head_kv": 2, "tied_output": True}),
    # gpt-oss-20b (its model card: 20.91B total, 3.61B active outside the embedding; 32 experts of 2,880, 4 used)
    "gpt-oss-20b": (20_914_757_184, {"n_layer": 24, "d_model": 2880, "n_expert": 32, "sliding_window": 128}),
    # DeepSeek-V2-Lite (its card: 15.7B total, 2.4B active: 64 routed experts of 1,408 a block, 6 used, 2 shared;
    # one KV head of 576, the latent and the rope key, and 512 for values: MLA as llama.cpp runs it)
    "deepseek-v2-lite": (15_706_484_224, {"n_layer": 27, "n_expert": 64, "n_head_kv": 1, "head_dim_k": 576}),
    # Granite 4.0-H (the Hub pages: 6.94B and 3.19B, the tied embedding counted once; 36 Mamba-2 and 4 attention
    # blocks; H-Tiny 64 experts of 512 a block, 6 used, and a shared one of 1,024; H-Micro a dense MLP of 8,192)
    "granite-4.0-h-tiny": (6_939_037_248, {"n_layer": 40, "d_model": 1536, "n_expert": 64, "n_head_kv": 4}),
    "granite-4.0-h-micro": (3_191_396_096, {"n_layer": 40, "d_model": 2048, "n_expert": 0, "n_head_kv": 8}),
}


_config = hf_config


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_full_size_config_matches_the_published_model(tmp_path, name):
    count, shape = PUBLISHED[name]
    header = header_from_hf_config(CONFIGS / f"{name}.json")
    spec = inspect(write_twin(header, tmp_path / "twin.gguf", sparse=True))
    assert abs(spec.n_params / count - 1) < 0.01, (spec.n_params, count)
    assert {k: getattr(spec, k) for k in shape} == shape
    assert spec.quant == "F16" and not spec.warnings
    assert {t for t in spec.bytes_by_type} <= {"F16", "F32"}


def test_llama_31_has_rope_freqs_and_the_converters_keys():
    header = header_from_hf_config(_config("llama-3.1-8b"))
    rope = [t for t in header.tensors if t.name == "rope_freqs.weight"]
    assert [(t.shape, t.type) for t in rope] == [((64,), "F32")]
    assert header.value("llama.rope.freq_base") == 500000.0 and header.value("llama.vocab_size") == 128256
    assert header.value("llama.rope.dimension_count") == 128
    assert header.value(Keys.General.FILE_TYPE) == 1  # MOSTLY_F16
    assert len(header.value(Keys.Tokenizer.LIST)) == 128256
    blk0 = {t.name: t.shape for t in header.tensors if t.name.startswith("blk.0.")}
    assert blk0["blk.0.attn_k.weight"] == (4096, 1024) and blk0["blk.0.ffn_down.weight"] == (14336, 4096)


def test_gemma3_conditional_generation_uses_its_text_config():
    header = header_from_hf_config(_config("gemma-3-4b-it"))
    assert header.arch == "gemma3" and header.n_layer == 34
    assert header.value("gemma3.rope.scaling.type") == "linear" and header.value("gemma3.rope.scaling.factor") == 8.0
    assert header.value("gemma3.attention.head_count") == 8 and header.value("gemma3.attention.head_count_kv") == 4
    assert header.value("gemma3.attention.sliding_window") == 1024
    embed = next(t for t in header.tensors if t.name == "token_embd.weight")
    assert embed.shape == (2560, 262144)  # the tokenizer's 262144 rows, not vocab_size 262208
    assert not any(t.name == "output.weight" for t in header.tensors)


def test_qwen3_moe_and_mixtral_experts():
    qwen = header_from_hf_config(_config("qwen3-30b-a3b"))
    shapes = {t.name: (t.shape, t.type) for t in qwen.tensors}
    assert shapes["blk.0.ffn_gate_exps.weight"] == ((2048, 768, 128), "F16")
    assert shapes["blk.0.ffn_down_exps.weight"] == ((768, 2048, 128), "F16")
    assert shapes["blk.0.ffn_gate_inp.weight"] == ((2048, 128), "F32")
    assert qwen.value("qwen3moe.expert_feed_forward_length") == 768 and qwen.value("qwen3moe.expert_count") == 128
    mixtral = header_from_hf_config(_config("mixtral-8x7b-v0.1"))
    assert mixtral.arch == "llama" and mixtral.value("llama.expert_count") == 8
    assert {t.name for t in mixtral.tensors if t.name.startswith("blk.0.ffn_") and "norm" not in t.name} == {
        f"blk.0.ffn_{p}.weight" for p in ("gate_inp", "gate_exps", "up_exps", "down_exps")
    }


def test_phi3_long_rope_factors():
    cfg = _config("phi-3-mini-4k-instruct") | {"max_position_embeddings": 131072}
    cfg["rope_scaling"] = {"type": "longrope", "long_factor": [1.5] * 48, "short_factor": [1.0] * 48}
    header = header_from_hf_config(cfg)
    factors = {t.name: t.shape for t in header.tensors if t.name.startswith("rope_factors")}
    assert factors == {"rope_factors_long.weight": (48,), "rope_factors_short.weight": (48,)}
    assert header.value("phi3.rope.scaling.attn_factor") == pytest.approx(1.1902380714238083)
    cfg["rope_scaling"]["short_factor"] = [1.0] * 47
    with pytest.raises(SpecError, match="48 values"):
        header_from_hf_config(cfg)


def test_granite_has_llamas_keys_and_its_four_multipliers():
    header = header_from_hf_config(_config("granite-3.1-2b-base") | {"head_dim": 128})  # the converter drops it
    assert header.arch == "granite" and header.n_layer == 40
    scales = {k: header.value(f"granite.{k}") for k in ("attention.scale", "embedding_scale", "residual_scale")}
    assert scales == {"attention.scale": 0.015625, "embedding_scale": 12.0, "residual_scale": 0.22}
    assert header.value("granite.logit_scale") == 8.0 and header.value("granite.vocab_size") == 49155
    assert header.value("granite.rope.dimension_count") == 64  # hidden_size / heads, not the config's head_dim
    assert header.value("granite.rope.freq_base") == 5_000_000.0
    assert "granite.attention.key_length" not in header.fields
    blk0 = {t.name: t.shape for t in header.tensors if t.name.startswith("blk.0.")}
    assert blk0["blk.0.attn_k.weight"] == (2048, 512) and blk0["blk.0.ffn_down.weight"] == (8192, 2048)
    assert {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight"} <= set(blk0)
    assert not any(t.name in ("output.weight", "rope_freqs.weight") for t in header.tensors)  # tied, no llama3 rope


def test_olmo2_norms_after_attention_and_feed_forward_only():
    header = header_from_hf_config(_config("olmo-2-1124-7b") | {"num_key_value_heads": 8})  # grouped, as its 32B
    assert header.arch == "olmo2"
    blk0 = block_tensors(header)
    norms = {name: shape for name, (shape, _) in blk0.items() if "norm" in name}
    assert norms == {
        "attn_q_norm.weight": (4096,),  # every head's q at once
        "attn_k_norm.weight": (1024,),  # every KV head's k at once
        "post_attention_norm.weight": (4096,),
        "post_ffw_norm.weight": (4096,),
    }
    assert blk0["attn_k.weight"] == ((4096, 1024), "F16") and blk0["ffn_gate.weight"] == ((4096, 11008), "F16")
    assert len(blk0) == 11
    assert header.value("olmo2.attention.layer_norm_rms_epsilon") == pytest.approx(1e-6)
    assert header.value("olmo2.rope.freq_base") == 500000.0
    assert not any(k.endswith(("rope.dimension_count", "vocab_size", "sliding_window")) for k in header.fields)
    assert [t.shape for t in header.tensors if t.name == "output.weight"] == [(4096, 100352)]


def test_olmoe_experts_and_norms_before_and_over_all_heads():
    header = header_from_hf_config(_config("olmoe-1b-7b-0924") | {"rms_norm_eps": 1e-6})
    assert header.arch == "olmoe" and header.n_layer == 16
    blk0 = block_tensors(header)
    assert blk0 == {
        "attn_norm.weight": ((2048,), "F32"),
        "attn_q.weight": ((2048, 2048), "F16"),
        "attn_k.weight": ((2048, 2048), "F16"),
        "attn_v.weight": ((2048, 2048), "F16"),
        "attn_q_norm.weight": ((2048,), "F32"),  # every head's q at once
        "attn_k_norm.weight": ((2048,), "F32"),
        "attn_output.weight": ((2048, 2048), "F16"),
        "ffn_norm.weight": ((2048,), "F32"),
        "ffn_gate_inp.weight": ((2048, 64), "F32"),
        "ffn_gate_exps.weight": ((2048, 1024, 64), "F16"),  # each expert as wide as intermediate_size
        "ffn_up_exps.weight": ((2048, 1024, 64), "F16"),
        "ffn_down_exps.weight": ((1024, 2048, 64), "F16"),
    }
    assert header.value("olmoe.expert_count") == 64 and header.value("olmoe.expert_used_count") == 8
    assert header.value("olmoe.feed_forward_length") == 1024 and header.value("olmoe.rope.freq_base") == 10000.0
    # the converter writes 1e-5 over the config's epsilon, in the place the config's took
    assert header.value("olmoe.attention.layer_norm_rms_epsilon") == pytest.approx(1e-5)
    keys = [k for k in header.fields if k.startswith("olmoe.")]
    assert keys.index("olmoe.attention.layer_norm_rms_epsilon") < keys.index("olmoe.expert_used_count")
    assert not any(k.endswith(("expert_feed_forward_length", "rope.dimension_count", "vocab_size")) for k in keys)
    assert [t.shape for t in header.tensors if t.name == "output.weight"] == [(2048, 50304)]
    # grouped queries: the converter would write k's norm 4 x 128 wide, llama.cpp takes it only hidden_size wide
    with pytest.raises(SpecError, match="^config.json: 'num_key_value_heads' 4 is not num_attention_heads 16; "):
        header_from_hf_config(_config("olmoe-1b-7b-0924") | {"num_key_value_heads": 4})


def test_qwen2moe_routed_experts_and_a_gated_shared_expert():
    header = header_from_hf_config(_config("qwen1.5-moe-a2.7b"))
    assert header.arch == "qwen2moe" and header.n_layer == 24
    blk0 = block_tensors(header)
    assert blk0 == {
        "attn_norm.weight": ((2048,), "F32"),
        "attn_q.weight": ((2048, 2048), "F16"),
        "attn_k.weight": ((2048, 2048), "F16"),
        "attn_v.weight": ((2048, 2048), "F16"),
        "attn_q.bias": ((2048,), "F32"),
        "attn_k.bias": ((2048,), "F32"),
        "attn_v.bias": ((2048,), "F32"),
        "attn_output.weight": ((2048, 2048), "F16"),
        "ffn_norm.weight": ((2048,), "F32"),
        "ffn_gate_inp.weight": ((2048, 60), "F32"),
        "ffn_gate_exps.weight": ((2048, 1408, 60), "F16"),
        "ffn_up_exps.weight": ((2048, 1408, 60), "F16"),
        "ffn_down_exps.weight": ((1408, 2048, 60), "F16"),
        "ffn_gate_inp_shexp.weight": ((2048, 1), "F32"),  # the shared expert's sigmoid gate, (1, 2048) in torch
        "ffn_gate_shexp.weight": ((2048, 5632), "F16"),
        "ffn_up_shexp.weight": ((2048, 5632), "F16"),
        "ffn_down_shexp.weight": ((5632, 2048), "F16"),
    }
    values = {k.removeprefix("qwen2moe."): header.value(k) for k in header.fields if k.startswith("qwen2moe.")}
    assert values == {
        "block_count": 24,
        "context_length": 8192,
        "embedding_length": 2048,
        "feed_forward_length": 5632,
        "attention.head_count": 16,
        "attention.head_count_kv": 16,
        "rope.freq_base": 1_000_000.0,
        "attention.layer_norm_rms_epsilon": pytest.approx(1e-6),
        "expert_used_count": 4,
        "expert_count": 60,
        "expert_feed_forward_length": 1408,
        "expert_shared_feed_forward_length": 5632,
    }
    assert list(values)[-3:] == ["expert_count", "expert_feed_forward_length", "expert_shared_feed_forward_length"]
    assert [t.shape for t in header.tensors if t.name == "output.weight"] == [(2048, 151936)]
    with pytest.raises(SpecError, match="^config.json: 'mlp_only_layers' / 'decoder_sparse_step': dense layers in a "):
        header_from_hf_config(_config("qwen1.5-moe-a2.7b") | {"decoder_sparse_step": 2})


def test_starcoder2_layer_norms_biases_and_an_ungated_feed_forward():
    header = header_from_hf_config(_config("starcoder2-3b"))
    assert header.arch == "starcoder2" and header.n_layer == 30
    blk0 = block_tensors(header)
    weights = {"attn_q": (3072, 3072), "attn_k": (3072, 256), "attn_v": (3072, 256), "attn_output": (3072, 3072)}
    weights |= {"ffn_up": (3072, 12288), "ffn_down": (12288, 3072)}
    assert blk0 == {
        **{f"{n}.weight": ((3072,), "F32") for n in ("attn_norm", "ffn_norm")},
        **{f"{n}.bias": ((3072,), "F32") for n in ("attn_norm", "ffn_norm", "attn_q", "attn_output", "ffn_down")},
        **{f"{n}.bias": ((256,), "F32") for n in ("attn_k", "attn_v")},
        "ffn_up.bias": ((12288,), "F32"),
        **{f"{n}.weight": (shape, "F16") for n, shape in weights.items()},
    }
    assert [t.name for t in header.tensors if not t.name.startswith("blk.")] == [
        "token_embd.weight",
        "output_norm.weight",
        "output_norm.bias",
    ]  # tied: Starcoder2Config's default, the checkpoint holds no lm_head
    values = {k.removeprefix("starcoder2."): header.value(k) for k in header.fields if k.startswith("starcoder2.")}
    assert values == {
        "block_count": 30,
        "context_length": 16384,
        "embedding_length": 3072,
        "feed_forward_length": 12288,
        "attention.head_count": 24,
        "attention.head_count_kv": 2,
        "rope.freq_base": pytest.approx(999999.4420358813),
        "attention.layer_norm_epsilon": pytest.approx(1e-5),
    }  # no sliding_window: the converter writes none and llama.cpp's starcoder2 attends the whole context
    untied = header_from_hf_config(_config("starcoder2-3b") | {"tie_word_embeddings": False})
    assert [t.shape for t in untied.tensors if t.name == "output.weight"] == [(3072, 49152)]
    # Starcoder2Config's defaults where a config leaves a field out, as the converter reads it through AutoConfig
    bare = {k: v for k, v in _config("starcoder2-3b").items() if k not in ("norm_epsilon", "num_key_value_heads")}
    assert header_from_hf_config(bare).value("starcoder2.attention.layer_norm_epsilon") == pytest.approx(1e-5)
    assert header_from_hf_config(bare).value("starcoder2.attention.head_count_kv") == 2


# ---------- tiny configs: every architecture loads and generates ----------

TINY = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128}
TINY |= {"num_hidden_layers": 2, "vocab_size": 512, "max_position_embeddings": 512}
TINY_IF_PRESENT = {"moe_intermediate_size": 64, "num_experts": 4, "num_local_experts": 4, "num_experts_per_tok": 2}
TINY_IF_PRESENT |= {"sliding_window": 64, "shared_expert_intermediate_size": 96}
TINY_IF_PRESENT |= {"original_max_position_embeddings": 512, "head_dim": 16, "rope_scaling": None}
# DeepSeek-V2 in three blocks, the first dense: a q latent (llama.cpp loads a model without one only at 26 or 27
# blocks), small MLA widths, 4 routed experts and 2 shared, YaRN kept
DEEPSEEK_TINY: dict = {"num_hidden_layers": 3, "q_lora_rank": 32, "kv_lora_rank": 32, "n_routed_experts": 4}
DEEPSEEK_TINY |= {"qk_nope_head_dim": 16, "qk_rope_head_dim": 16, "v_head_dim": 16, "moe_intermediate_size": 32}
DEEPSEEK_TINY["rope_scaling"] = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 128}
DEEPSEEK_TINY["rope_scaling"] |= {"beta_fast": 32, "beta_slow": 1, "mscale": 0.707, "mscale_all_dim": 0.707}
ARCH_CONFIGS = {  # one public config per architecture (and per HF class that reads differently)
    "LlamaForCausalLM": "llama-3.1-8b",
    "MistralForCausalLM": "mistral-7b-v0.1",
    "MixtralForCausalLM": "mixtral-8x7b-v0.1",
    "Qwen2ForCausalLM": "qwen2.5-0.5b",
    "Qwen3ForCausalLM": "qwen3-0.6b",
    "Qwen3MoeForCausalLM": "qwen3-30b-a3b",
    "Gemma2ForCausalLM": "gemma-2-2b",
    "Gemma3ForCausalLM": "gemma-3-1b-pt",
    "Gemma3ForConditionalGeneration": "gemma-3-4b-it",
    "Phi3ForCausalLM": "phi-3-mini-4k-instruct",
    "GraniteForCausalLM": "granite-3.1-2b-base",
    "Olmo2ForCausalLM": "olmo-2-0425-1b",
    "OlmoeForCausalLM": "olmoe-1b-7b-0924",
    "Lfm2ForCausalLM": "lfm2-1.2b",
    "Qwen2MoeForCausalLM": "qwen1.5-moe-a2.7b",
    "Starcoder2ForCausalLM": "starcoder2-3b",
    "GptOssForCausalLM": "gpt-oss-20b",
    "DeepseekV2ForCausalLM": "deepseek-v2-lite",
    "GraniteMoeHybridForCausalLM": "granite-4.0-h-tiny",
}


def tiny_config(name: str) -> dict:
    """A public config with small widths and two layers (inside text_config where it has one)."""
    cfg = _config(name)
    text = dict(cfg.get("text_config", cfg))
    text |= TINY | {k: v for k, v in TINY_IF_PRESENT.items() if k in text}
    if name.startswith("gemma"):
        text["head_dim"] = 16
    if name.startswith("lfm2"):  # a short convolution, then attention; block_ff_dim is LFM2's intermediate_size
        text |= {"layer_types": ["conv", "full_attention"], "block_ff_dim": 192}
    if name.startswith("olmoe"):  # llama.cpp loads no OLMoE with grouped queries
        text["num_key_value_heads"] = text["num_attention_heads"]
    if name == "llama-3.1-8b":
        text["rope_scaling"] = cfg["rope_scaling"]  # keep the llama3 rope (its rope_freqs tensor)
    if name.startswith("gpt-oss"):  # its yarn rope kept, its layer types as few as the layers
        text |= {"rope_scaling": cfg["rope_scaling"], "layer_types": cfg["layer_types"][: TINY["num_hidden_layers"]]}
    if name.startswith("deepseek"):
        text |= DEEPSEEK_TINY
    if name.startswith("granite-4.0-h"):  # a Mamba-2 block, then attention; experts as wide as intermediate_size
        text |= {"layer_types": ["mamba", "attention"], "mamba_n_heads": 4, "mamba_d_head": 32, "mamba_d_state": 16}
        text |= {"shared_intermediate_size": 64}
    return cfg | {"text_config": text} if "text_config" in cfg else text


def test_every_supported_architecture_has_a_config():
    assert set(ARCH_CONFIGS) == set(SUPPORTED)


@pytest.mark.parametrize("hf_arch", sorted(ARCH_CONFIGS))
@pytest.mark.parametrize("qtype", [None, "Q8_0"])
def test_tiny_config_twin_loads_and_generates(tmp_path, hf_arch, qtype):
    from ondevice.engine import load

    header = header_from_hf_config(tiny_config(ARCH_CONFIGS[hf_arch]))
    if qtype:
        header = quantized_header(header, qtype)
    path = write_twin(header, tmp_path / "tiny.gguf")
    with load(path, n_ctx=256, n_threads=1) as eng:
        g = eng.generate("hello there", max_tokens=4, temperature=0, ignore_eos=True)
    assert len(g.timings.itl_s) == 3
    lines: list[str] = []
    with log_listener(lines.append), LogitsModel(path, n_ctx=256, n_threads=1) as m:
        logits = m.window_logits([1, 300, 301, 302], 1)
        llama_window = m._h.n_swa
    assert np.isfinite(logits).all() and logits.std() > 0
    spec = inspect(path)  # the window the roofline and the twins use is the one llama.cpp applies, on its layers
    assert (spec.sliding_window or 0) == llama_window, (spec.arch, spec.sliding_window, llama_window)
    flags = re.findall(r"layer +(\d+) assigned to device \S+, is_swa = (\d)", "".join(lines))  # its loader's log
    assert len(flags) > spec.n_layer and spec.swa_layers == tuple(int(i) for i, swa in flags if swa == "1")


@pytest.mark.default_model
def test_gemma3_270m_config_quantized_is_the_default_model(default_model):
    real = read_header(default_model)
    twin = quantized_header(header_from_hf_config(CONFIGS / "gemma-3-270m.json"), "Q4_K_M")
    assert twin.tensors == real.tensors  # names, shapes, llama.cpp's Q4_K_M mix with its fallbacks, order

    def hparams(h):
        return {k: f for k, f in h.fields.items() if k.startswith("gemma3.")}

    assert {k: (f.type, float(np.float32(f.value))) for k, f in hparams(twin).items()} == {
        k: (f.type, float(np.float32(f.value))) for k, f in hparams(real).items()
    }
    assert shape_key(twin) == shape_key(real)


# ---------- bad input ----------


@pytest.mark.parametrize(
    "change, match",
    [
        ({"hidden_size": None}, "'hidden_size' is missing"),
        ({"num_hidden_layers": "32"}, "'num_hidden_layers' must be a positive integer"),
        ({"intermediate_size": 0}, "'intermediate_size' must be a positive integer"),
        ({"vocab_size": True}, "'vocab_size' must be a positive integer"),
        ({"vocab_size": 100}, "'vocab_size' 100 is too small"),
        ({"num_key_value_heads": 5}, "not a multiple of num_key_value_heads"),
        ({"rms_norm_eps": "small"}, "'rms_norm_eps' must be a number"),
        ({"rope_scaling": [1, 2]}, "'rope_scaling' must be an object"),
        ({"architectures": ["BertModel"], "model_type": "bert"}, "'BertModel' is not a supported model"),
        ({"architectures": None, "model_type": None}, "is not a supported model"),
    ],
)
def test_invalid_config_names_the_field(change, match):
    cfg = {k: v for k, v in (_config("llama-3.1-8b") | change).items() if v is not None}
    with pytest.raises(SpecError, match=match):
        header_from_hf_config(cfg)


def test_invalid_moe_and_text_config():
    with pytest.raises(SpecError, match="'num_experts_per_tok' 9 is more than the 8 experts"):
        header_from_hf_config(_config("mixtral-8x7b-v0.1") | {"num_experts_per_tok": 9})
    with pytest.raises(SpecError, match="'num_local_experts' is missing"):
        header_from_hf_config({k: v for k, v in _config("mixtral-8x7b-v0.1").items() if k != "num_local_experts"})
    with pytest.raises(SpecError, match="dense layers"):
        header_from_hf_config(_config("qwen3-30b-a3b") | {"mlp_only_layers": [0]})
    with pytest.raises(SpecError, match="'text_config' must be an object"):
        header_from_hf_config(_config("gemma-3-4b-it") | {"text_config": [1]})
    with pytest.raises(SpecError, match="'head_dim' is missing"):  # Gemma 2 has no default head size
        header_from_hf_config({k: v for k, v in _config("gemma-2-2b").items() if k != "head_dim"})


@pytest.mark.parametrize("field, key", [("attention_multiplier", "attention.scale"), ("logits_scaling", "logit_scale")])
def test_granite_multipliers_missing_invalid_or_zero(field, key):
    cfg = {k: v for k, v in _config("granite-3.1-2b-base").items() if k != field}
    assert header_from_hf_config(cfg).value(f"granite.{key}") == 1.0  # GraniteConfig's default, as AutoConfig reads it
    with pytest.raises(SpecError, match=f"^config.json: '{field}' must be a number, not '12'$"):
        header_from_hf_config(cfg | {field: "12"})
    with pytest.raises(SpecError, match=f"^config.json: '{field}' is 0; llama.cpp loads no Granite model without it$"):
        header_from_hf_config(cfg | {field: 0})


@pytest.mark.parametrize(
    "name, field",
    [
        ("granite-3.1-2b-base", "num_attention_heads"),
        ("olmo-2-0425-1b", "intermediate_size"),
        ("olmoe-1b-7b-0924", "num_experts"),
        ("olmoe-1b-7b-0924", "num_experts_per_tok"),
        ("qwen1.5-moe-a2.7b", "shared_expert_intermediate_size"),
        ("qwen1.5-moe-a2.7b", "moe_intermediate_size"),
        ("starcoder2-3b", "intermediate_size"),
    ],
)
def test_new_architectures_without_a_required_field_name_it(name, field):
    cfg = {k: v for k, v in _config(name).items() if k != field}
    with pytest.raises(SpecError, match=f"^config.json: '{field}' is missing$"):
        header_from_hf_config(cfg)


@pytest.mark.parametrize("content, match", [("{not json", "not a readable JSON"), ("[1, 2]", "JSON object")])
def test_config_file_that_is_not_a_config(tmp_path, content, match):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(SpecError, match=match):
        header_from_hf_config(path)
    with pytest.raises(SpecError, match="no such file"):
        header_from_hf_config(tmp_path / "missing.json")


@pytest.mark.parametrize(
    "change, match",
    [
        ({"use_bias": False}, "'use_bias' is False; llama.cpp loads no Starcoder2 without biases"),
        ({"use_bias": "yes"}, "'use_bias' is 'yes'; llama.cpp loads no Starcoder2 without biases"),
        ({"norm_epsilon": "1e-5"}, "'norm_epsilon' must be a number, not '1e-5'"),
        ({"num_key_value_heads": 5}, "num_attention_heads 24 is not a multiple of num_key_value_heads 5"),
    ],
)
def test_starcoder2_invalid_fields(change, match):
    with pytest.raises(SpecError, match=f"^config.json: {re.escape(match)}$"):
        header_from_hf_config(_config("starcoder2-3b") | change)


@pytest.mark.parametrize(
    "change, match",
    [
        ({"shared_expert_intermediate_size": 0}, "'shared_expert_intermediate_size' must be a positive integer, not 0"),
        ({"num_experts_per_tok": 61}, "'num_experts_per_tok' 61 is more than the 60 experts"),
        ({"num_experts": "60"}, "'num_experts' must be a positive integer, not '60'"),
    ],
)
def test_qwen2moe_invalid_fields(change, match):
    with pytest.raises(SpecError, match=f"^config.json: {re.escape(match)}$"):
        header_from_hf_config(_config("qwen1.5-moe-a2.7b") | change)
