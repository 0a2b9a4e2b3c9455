"""gpt-oss (GptOssForCausalLM) from its config.json: the header llama.cpp's converter writes, key by key and the
first block tensor by tensor; what llama.cpp's quantizer makes of it at MXFP4_MOE (the published files' mix); the
spec's window on every other layer, as llama.cpp applies it, and the twins that follow from it; bad configs as
one-line SpecErrors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from ondevice.quant.hfconfig import header_from_hf_config
from ondevice.quant.twin import header_spec, quantized_header, reduce_layers, write_twin

from ondevice.core.errors import SpecError
from ondevice.gguf.spec import inspect
from ondevice.probing.twins import twin_blocks, window_period
from tests.hf_headers import CONFIGS, block_tensors
from tests.test_twin_hfconfig import tiny_config

GPT_OSS_20B = CONFIGS / "gpt-oss-20b.json"


def _config() -> dict:
    return json.loads(GPT_OSS_20B.read_text())


def test_gptoss_keys_and_first_block_as_the_converter_writes_them():
    header = header_from_hf_config(GPT_OSS_20B)
    assert header.arch == "gpt-oss" and header.n_layer == 24
    values = [(k.removeprefix("gpt-oss."), header.value(k)) for k in header.fields if k.startswith("gpt-oss.")]
    assert values == [  # the base keys in the converter's order, then the window and the experts' width
        ("block_count", 24),
        ("context_length", 131072),
        ("embedding_length", 2880),
        ("feed_forward_length", 2880),
        ("attention.head_count", 64),
        ("attention.head_count_kv", 8),
        ("rope.scaling.type", "yarn"),
        ("rope.scaling.factor", 32.0),
        ("rope.scaling.original_context_length", 4096),
        ("rope.scaling.yarn_beta_fast", 32.0),
        ("rope.scaling.yarn_beta_slow", 1.0),
        ("rope.freq_base", 150000.0),
        ("attention.layer_norm_rms_epsilon", pytest.approx(1e-5)),
        ("expert_count", 32),
        ("expert_used_count", 4),
        ("attention.key_length", 64),
        ("attention.value_length", 64),
        ("attention.sliding_window", 128),  # no pattern key: llama.cpp windows every other layer from the first
        ("expert_feed_forward_length", 2880),
    ]
    assert block_tensors(header) == {
        "attn_norm.weight": ((2880,), "F32"),
        "attn_q.weight": ((2880, 4096), "F16"),  # 64 heads of 64: wider than hidden_size
        "attn_q.bias": ((4096,), "F32"),
        "attn_k.weight": ((2880, 512), "F16"),
        "attn_k.bias": ((512,), "F32"),
        "attn_v.weight": ((2880, 512), "F16"),
        "attn_v.bias": ((512,), "F32"),
        "attn_output.weight": ((4096, 2880), "F16"),
        "attn_output.bias": ((2880,), "F32"),
        "attn_sinks.weight": ((64,), "F32"),  # one sink logit per query head
        "post_attention_norm.weight": ((2880,), "F32"),  # the norm before the experts
        "ffn_gate_inp.weight": ((2880, 32), "F32"),
        "ffn_gate_inp.bias": ((32,), "F32"),
        "ffn_gate_exps.weight": ((2880, 2880, 32), "F16"),
        "ffn_gate_exps.bias": ((2880, 32), "F32"),  # a matrix, F32 as every tensor not named .weight
        "ffn_up_exps.weight": ((2880, 2880, 32), "F16"),
        "ffn_up_exps.bias": ((2880, 32), "F32"),
        "ffn_down_exps.weight": ((2880, 2880, 32), "F16"),
        "ffn_down_exps.bias": ((2880, 32), "F32"),
    }
    outside = {t.name: (t.shape, t.type) for t in header.tensors if not t.name.startswith("blk.")}
    assert outside == {  # an untied head over the 201k vocabulary
        "token_embd.weight": ((2880, 201088), "F16"),
        "output_norm.weight": ((2880,), "F32"),
        "output.weight": ((2880, 201088), "F16"),
    }


def test_mxfp4_moe_is_the_published_files_mix_and_its_spec():
    header = quantized_header(header_from_hf_config(GPT_OSS_20B), "MXFP4_MOE")
    types = {t.name.removeprefix("blk.0."): t.type for t in header.tensors if not t.name.startswith("blk.")}
    types |= {t.name.removeprefix("blk.0."): t.type for t in header.tensors if t.name.startswith("blk.0.")}
    assert {n for n, t in types.items() if t == "MXFP4"} == {f"ffn_{p}_exps.weight" for p in ("gate", "up", "down")}
    assert {n for n, t in types.items() if t == "Q8_0"} == {
        f"{n}.weight" for n in ("token_embd", "output", "attn_q", "attn_k", "attn_v", "attn_output")
    }
    spec = header_spec(header)
    assert spec.quant == "MXFP4_MOE" and spec.weight_bytes == 12_096_558_336  # bartowski's MXFP4 file: 12.1 GB
    assert (spec.n_expert, spec.n_expert_used, spec.sliding_window) == (32, 4, 128)
    assert spec.swa_layers == tuple(range(0, 24, 2))  # the even layers, as llama.cpp's gpt-oss loader has them
    assert spec.n_params_active - 2880 * 201088 == 3_608_307_264  # the card's 3.61B active, outside the embedding
    per_block = 2 * 2880 * 4096 + 2 * 2880 * 512 + 2880 * 32 + 3 * 2880 * 2880 * 4  # attention, router, 4 experts
    assert spec.n_params_matmul == 2880 * 201088 + 24 * per_block  # the head and the blocks' matrices, no bias
    assert spec.kv_read_bytes(4096) == 12 * 4096 * 2048 + 12 * 128 * 2048  # full layers whole, windowed 128
    assert window_period(spec) == 2 and twin_blocks(spec) == (2, 6)  # twins of one and of three windowed+full pairs
    two = header_spec(reduce_layers(header, 2))  # prediction_accuracy's held8a: one windowed and one full layer
    assert two.swa_layers == (0,) and window_period(two) == 2 and twin_blocks(two) is None  # timed whole
    assert two.weight_bytes == 2_136_160_768


def test_tiny_gptoss_at_mxfp4_moe_loads_and_generates(tmp_path):
    from ondevice.engine import load

    header = quantized_header(header_from_hf_config(tiny_config("gpt-oss-20b")), "MXFP4_MOE")
    assert {t.type for t in header.tensors if "_exps.weight" in t.name} == {"MXFP4"}
    path = write_twin(header, tmp_path / "tiny.gguf")
    with load(path, n_ctx=256, n_threads=1) as eng:
        g = eng.generate("hello there", max_tokens=4, temperature=0, ignore_eos=True)
    assert len(g.timings.itl_s) == 3 and all(np.isfinite(g.timings.itl_s))
    spec = inspect(path)
    assert (spec.n_layer, spec.sliding_window, spec.swa_layers) == (2, 64, (0,))
    assert (spec.n_expert, spec.n_expert_used) == (4, 2)


def test_gptoss_defaults_and_model_type():
    bare = {k: v for k, v in _config().items() if k not in ("sliding_window", "layer_types", "architectures")}
    header = header_from_hf_config(bare)  # read by model_type; GptOssConfig's window and layer types
    assert header.arch == "gpt-oss" and header.value("gpt-oss.attention.sliding_window") == 128


@pytest.mark.parametrize(
    "change, match",
    [
        ({"attention_bias": False}, "'attention_bias' is False; llama.cpp loads no gpt-oss without biases"),
        (
            {"layer_types": ["full_attention", "sliding_attention"] * 12},
            "'layer_types' is not sliding and full attention in turn from the first layer; llama.cpp's gpt-oss "
            "windows every other layer from the first, whatever the config says",
        ),
        (
            {"layer_types": ["sliding_attention", "full_attention"] * 6},
            "'layer_types' is not sliding and full attention in turn from the first layer; llama.cpp's gpt-oss "
            "windows every other layer from the first, whatever the config says",
        ),
        ({"head_dim": None}, "'head_dim' is missing"),
        ({"num_local_experts": None}, "'num_local_experts' is missing"),
        ({"num_experts_per_tok": 33}, "'num_experts_per_tok' 33 is more than the 32 experts"),
        ({"sliding_window": "128"}, "'sliding_window' must be a positive integer, not '128'"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 32.0}}, "'original_max_position_embeddings' is missing"),
    ],
)
def test_gptoss_invalid_fields(change, match):
    cfg = {k: v for k, v in (_config() | change).items() if v is not None}
    with pytest.raises(SpecError, match=f"^config.json: {re.escape(match)}$"):
        header_from_hf_config(cfg)
