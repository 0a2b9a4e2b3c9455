"""A Hugging Face config.json -> the header of the F16 GGUF llama.cpp's converter (convert_hf_to_gguf.py)
would write for it: the same keys and value types, tensor names, shapes and types, with a synthetic
vocabulary of the config's vocab_size in place of the tokenizer's strings (their count is what
decides speed). With ondevice.quant.twin it gives a twin of a model that was never downloaded:

    header = quantized_header(header_from_hf_config("config.json"), "Q4_K_M")

Supported (`architectures`[0], or `model_type`): Llama and Mistral (llama), Mixtral (llama with
experts), Qwen2, Qwen3, Qwen3-MoE, Gemma 2, Gemma 3 (text; Gemma3ForConditionalGeneration's
text_config), Phi-3, Granite 3 (Llama with four multipliers), OLMo 2 (norms after attention and
the feed-forward, none before; q/k norms over all heads), OLMoE (a mixture of experts each as
wide as intermediate_size, with Llama's norms before attention and the feed-forward and OLMo 2's
q/k norms), Qwen2-MoE (Qwen1.5-MoE: routed experts and one shared expert behind its own sigmoid
gate, q/k/v biases), Starcoder2 (LayerNorm with biases, a non-gated GELU feed-forward, biases
on every projection; its sliding_window is not written, as llama.cpp attends the whole context),
gpt-oss (attention sinks, biases on every projection and expert, a window on every other layer),
DeepSeek-V2 (multi-head latent attention, leading dense blocks, routed and shared experts: hfdeepseek),
LFM2 (short convolutions between a few attention blocks: hflfm2) and Granite 4.0-H (Mamba-2 between a few
attention blocks, experts or a dense MLP: hfgranite).
A field the converter needs that is missing or invalid is a SpecError naming it. Fields
transformers fills in when the converter loads a config (AutoConfig) are filled here with the
same defaults where the converter relies on them (Gemma 3's text_config, Granite's multipliers,
Starcoder2's context, KV heads, norm epsilon, tied embedding and biases, gpt-oss's window).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gguf import (
    GGML_QUANT_VERSION,
    MODEL_ARCH,
    MODEL_ARCH_NAMES,
    MODEL_TENSOR,
    GGUFValueType,
    Keys,
    LlamaFileType,
    RopeScalingType,
    TokenType,
)
from ondevice.quant.header import Field, Header, TensorSpec
from ondevice.quant.hfdeepseek import deepseek2_keys, deepseek2_params, routing_keys
from ondevice.quant.hfgranite import granite_hybrid_builder, granite_hybrid_params, granite_hybrid_tensors
from ondevice.quant.hflfm2 import lfm2_keys, lfm2_params, lfm2_tensors
from ondevice.quant.hfllama import llama_config  # kept importable from here
from ondevice.quant.hfshape import Dims, Params, tensor_list, tensor_spec
from ondevice.quant.synth import synthetic_vocab

from ondevice.core.errors import SpecError

__all__ = ["header_from_hf_config", "llama_config", "SUPPORTED"]

# architectures[0] -> (gguf arch, builder key); model_type -> architectures name
SUPPORTED: dict[str, MODEL_ARCH] = {
    "LlamaForCausalLM": MODEL_ARCH.LLAMA,
    "MistralForCausalLM": MODEL_ARCH.LLAMA,
    "MixtralForCausalLM": MODEL_ARCH.LLAMA,
    "Qwen2ForCausalLM": MODEL_ARCH.QWEN2,
    "Qwen3ForCausalLM": MODEL_ARCH.QWEN3,
    "Qwen3MoeForCausalLM": MODEL_ARCH.QWEN3MOE,
    "Gemma2ForCausalLM": MODEL_ARCH.GEMMA2,
    "Gemma3ForCausalLM": MODEL_ARCH.GEMMA3,
    "Gemma3ForConditionalGeneration": MODEL_ARCH.GEMMA3,
    "Phi3ForCausalLM": MODEL_ARCH.PHI3,
    "GraniteForCausalLM": MODEL_ARCH.GRANITE,
    "Olmo2ForCausalLM": MODEL_ARCH.OLMO2,
    "OlmoeForCausalLM": MODEL_ARCH.OLMOE,
    "Lfm2ForCausalLM": MODEL_ARCH.LFM2,
    "Qwen2MoeForCausalLM": MODEL_ARCH.QWEN2MOE,
    "Starcoder2ForCausalLM": MODEL_ARCH.STARCODER2,
    "GptOssForCausalLM": MODEL_ARCH.GPT_OSS,
    "DeepseekV2ForCausalLM": MODEL_ARCH.DEEPSEEK2,
    "GraniteMoeHybridForCausalLM": MODEL_ARCH.GRANITE_HYBRID,
}
_MODEL_TYPES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3": "Gemma3ForConditionalGeneration",
    "phi3": "Phi3ForCausalLM",
    "granite": "GraniteForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
}
# Gemma3TextConfig's defaults, which the converter sees for fields a config.json leaves out
_GEMMA3_DEFAULTS = {"vocab_size": 262208, "sliding_window": 4096, "rope_theta": 1_000_000.0}
# Granite's multipliers -> the keys the converter writes them under, in its order; one a config leaves out is
# GraniteConfig's default, 1.0 (the converter reads the config through AutoConfig)
_GRANITE_SCALES = {
    "attention_multiplier": Keys.Attention.SCALE,
    "embedding_multiplier": Keys.LLM.EMBEDDING_SCALE,
    "residual_multiplier": Keys.LLM.RESIDUAL_SCALE,
    "logits_scaling": Keys.LLM.LOGIT_SCALE,
}
# the RMS norm epsilon the converter writes for every OLMoE, whatever its config says
_OLMOE_RMS_EPS = 1e-5
# Starcoder2Config's defaults, which the converter sees for fields a config.json leaves out, where they differ from
# what a missing field gives here (the published configs leave out tie_word_embeddings: no lm_head in the checkpoint)
_STARCODER2_DEFAULTS = {
    "max_position_embeddings": 4096,
    "num_key_value_heads": 2,
    "rope_theta": 10000.0,
    "norm_epsilon": 1e-5,
    "tie_word_embeddings": True,
    "use_bias": True,
}
_ENDOFTEXT = "<|endoftext|>"


def header_from_hf_config(config: Mapping[str, Any] | str | Path, *, name: str | None = None) -> Header:
    """The F16 GGUF header llama.cpp's converter writes for this config (see the module docstring)."""
    cfg = _load(config)
    hf_arch = _hf_arch(cfg)
    text = cfg.get("text_config")
    if text is not None and not isinstance(text, Mapping):
        raise SpecError("config.json: 'text_config' must be an object")
    hp = Params({**cfg, **(text or {})})  # the converter moves text_config to the top level
    arch = SUPPORTED[hf_arch]
    if arch == MODEL_ARCH.GEMMA3:
        hp = Params({**_GEMMA3_DEFAULTS, **hp.values})
    if arch == MODEL_ARCH.STARCODER2:
        hp = Params({**_STARCODER2_DEFAULTS, **hp.values})
    if arch == MODEL_ARCH.DEEPSEEK2:
        hp = deepseek2_params(hp)
    if arch == MODEL_ARCH.LFM2:
        hp = lfm2_params(hp)
    if arch == MODEL_ARCH.GRANITE_HYBRID:
        hp = granite_hybrid_params(hp)
    if arch == MODEL_ARCH.GRANITE:  # the converter drops a head_dim: Granite's heads are hidden_size / heads wide
        hp = Params({k: v for k, v in hp.values.items() if k != "head_dim"})
    dims = Dims.read(hp, arch, hf_arch)
    kv = _KV(MODEL_ARCH_NAMES[arch])
    kv.string(Keys.General.ARCHITECTURE, MODEL_ARCH_NAMES[arch])
    kv.string(Keys.General.TYPE, "model")
    kv.string(Keys.General.NAME, name or str(cfg.get("_name_or_path") or hf_arch))
    extra = _BUILDERS[arch](kv, hp, dims)  # tensors the converter makes from the config (rope factors)
    _vocab(kv, dims.n_vocab)
    kv.u32(Keys.General.QUANTIZATION_VERSION, GGML_QUANT_VERSION)
    tensors = _TENSORS[arch](dims, hp) if arch in _TENSORS else tensor_list(arch, dims)
    return Header(kv.fields, tuple(extra) + tensors)


def _load(config: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    if isinstance(config, Mapping):
        return config
    path = Path(config)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SpecError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise SpecError(f"{path}: not a readable JSON config ({exc})") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a config.json holds a JSON object, not {type(data).__name__}")
    return data


def _hf_arch(cfg: Mapping[str, Any]) -> str:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs and archs[0] in SUPPORTED:
        return archs[0]
    if cfg.get("model_type") in _MODEL_TYPES:
        return _MODEL_TYPES[cfg["model_type"]]
    given = archs[0] if isinstance(archs, list) and archs else cfg.get("model_type")
    raise SpecError(
        f"config.json: 'architectures' / 'model_type' {given!r} is not a supported model; "
        f"supported: {', '.join(SUPPORTED)}"
    )


class _KV:
    """Metadata in the order written; a key set twice keeps its first place (as gguf's writer does)."""

    def __init__(self, arch: str):
        self.arch = arch
        self.fields: dict[str, Field] = {}

    def put(self, template: str, value: Field) -> None:
        self.fields[template.format(arch=self.arch)] = value

    def u32(self, template: str, value: int) -> None:
        self.put(template, Field.u32(value))

    def f32(self, template: str, value: float) -> None:
        self.put(template, Field.f32(value))

    def string(self, template: str, value: str) -> None:
        self.put(template, Field.string(value))


# ---------- per-architecture metadata, as the converter's set_gguf_parameters writes it ----------


def _base(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """TextModel.set_gguf_parameters: what every converter class built on it writes."""
    kv.u32(Keys.LLM.BLOCK_COUNT, dims.n_layer)
    for key in ("max_position_embeddings", "n_ctx", "n_positions"):
        if hp.get(key) is not None:
            kv.u32(Keys.LLM.CONTEXT_LENGTH, hp.integer(key))
            break
    kv.u32(Keys.LLM.EMBEDDING_LENGTH, dims.d_model)
    kv.u32(Keys.LLM.FEED_FORWARD_LENGTH, dims.n_ff)
    if hp.get("num_attention_heads") is not None:
        kv.u32(Keys.Attention.HEAD_COUNT, dims.n_head)
    if hp.get("num_key_value_heads") is not None:
        kv.u32(Keys.Attention.HEAD_COUNT_KV, dims.n_head_kv)
    _rope_scaling(kv, hp)
    if (theta := hp.rope_theta()) is not None:
        kv.f32(Keys.Rope.FREQ_BASE, theta)
    if hp.get("rms_norm_eps") is not None:
        kv.f32(Keys.Attention.LAYERNORM_RMS_EPS, hp.number("rms_norm_eps"))
    for key in ("layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"):  # LayerNorm's, where a model has one
        if hp.get(key) is not None:
            kv.f32(Keys.Attention.LAYERNORM_EPS, hp.number(key))
            break
    if hp.get("num_local_experts") is not None:
        kv.u32(Keys.LLM.EXPERT_COUNT, dims.n_expert)
    if hp.get("num_experts_per_tok") is not None:
        kv.u32(Keys.LLM.EXPERT_USED_COUNT, dims.n_expert_used)
    routing_keys(kv, hp)
    if hp.get("head_dim") is not None:
        kv.u32(Keys.Attention.KEY_LENGTH, dims.head_dim)
        kv.u32(Keys.Attention.VALUE_LENGTH, dims.head_dim)
    kv.u32(Keys.General.FILE_TYPE, LlamaFileType.MOSTLY_F16.value)
    return []


def _rope_scaling(kv: _KV, hp: Params) -> None:
    rope = hp.rope()
    kind = str(rope.get("rope_type", rope.get("type", ""))).lower()
    factor = rope.get("factor")
    if kind == "linear" and factor is not None:
        kv.string(Keys.Rope.SCALING_TYPE, RopeScalingType.LINEAR.value)
        kv.f32(Keys.Rope.SCALING_FACTOR, hp._number("rope_scaling.factor", factor))
    elif kind == "yarn" and factor is not None:
        kv.string(Keys.Rope.SCALING_TYPE, RopeScalingType.YARN.value)
        kv.f32(Keys.Rope.SCALING_FACTOR, hp._number("rope_scaling.factor", factor))
        orig = Params(rope).integer("original_max_position_embeddings")
        kv.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, orig)
        for name, key in (
            ("extrapolation_factor", Keys.Rope.SCALING_YARN_EXT_FACTOR),
            ("attention_factor", Keys.Rope.SCALING_YARN_ATTN_FACTOR),
            ("beta_fast", Keys.Rope.SCALING_YARN_BETA_FAST),
            ("beta_slow", Keys.Rope.SCALING_YARN_BETA_SLOW),
        ):
            if rope.get(name) is not None:
                kv.f32(key, hp._number(f"rope_scaling.{name}", rope[name]))
    elif kind in ("su", "longrope"):
        kv.string(Keys.Rope.SCALING_TYPE, RopeScalingType.LONGROPE.value)


def _llama(kv: _KV, hp: Params, dims: Dims, arch: MODEL_ARCH = MODEL_ARCH.LLAMA) -> list[TensorSpec]:
    _base(kv, hp, dims)
    kv.u32(Keys.LLM.VOCAB_SIZE, dims.n_vocab)
    kv.u32(Keys.Rope.DIMENSION_COUNT, dims.head_dim)
    if str(hp.rope().get("rope_type", "")).lower() == "llama3":  # Llama 3.1's rope: per-frequency factors
        return [tensor_spec(arch, MODEL_TENSOR.ROPE_FREQS, (dims.head_dim // 2,))]
    return []


def _granite(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """Llama's keys, then the multipliers of embeddings, residuals, attention scores and logits."""
    extra = _llama(kv, hp, dims, MODEL_ARCH.GRANITE)
    for field, key in _GRANITE_SCALES.items():
        value = hp.number(field, 1.0)
        if value == 0:  # the converter writes no key for a zero, and llama.cpp loads no Granite without all four
            raise SpecError(f"config.json: {field!r} is 0; llama.cpp loads no Granite model without it")
        kv.f32(key, value)
    return extra


def _qwen3moe(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    _base(kv, hp, dims)
    kv.u32(Keys.LLM.EXPERT_COUNT, dims.n_expert)
    kv.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, dims.n_ff_exp)
    return []


def _qwen2moe(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """The base keys, then the expert count and the routed and the shared expert's widths."""
    _qwen3moe(kv, hp, dims)
    kv.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, dims.n_ff_shexp)
    return []


def _starcoder2(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """The base keys only (norm_epsilon as the LayerNorm epsilon); the config's sliding_window is not written."""
    if hp.get("use_bias") is not True:  # llama.cpp takes every Starcoder2 bias as required
        raise SpecError(
            f"config.json: 'use_bias' is {hp.get('use_bias')!r}; llama.cpp loads no Starcoder2 without biases"
        )
    return _base(kv, hp, dims)


def _gptoss(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """The base keys, the window (GptOssConfig's 128 where a config has none) and the experts' width."""
    _base(kv, hp, dims)
    kv.u32(Keys.Attention.SLIDING_WINDOW, hp.integer("sliding_window", 128))
    kv.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, dims.n_ff_exp)
    return []


def _deepseek2(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """The base keys, then DeepseekV2Model's own (hfdeepseek)."""
    _base(kv, hp, dims)
    deepseek2_keys(kv, hp, dims)
    return []


def _olmoe(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    """The base keys, the norm epsilon the converter fixes (in the place the config's took), the expert count."""
    _base(kv, hp, dims)
    kv.f32(Keys.Attention.LAYERNORM_RMS_EPS, _OLMOE_RMS_EPS)
    kv.u32(Keys.LLM.EXPERT_COUNT, dims.n_expert)
    return []


def _gemma2(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    kv.u32(Keys.LLM.CONTEXT_LENGTH, hp.integer("max_position_embeddings"))
    kv.u32(Keys.LLM.EMBEDDING_LENGTH, dims.d_model)
    kv.u32(Keys.LLM.BLOCK_COUNT, dims.n_layer)
    kv.u32(Keys.LLM.FEED_FORWARD_LENGTH, dims.n_ff)
    kv.u32(Keys.Attention.HEAD_COUNT, dims.n_head)
    kv.u32(Keys.Attention.HEAD_COUNT_KV, dims.n_head_kv)
    kv.f32(Keys.Attention.LAYERNORM_RMS_EPS, hp.number("rms_norm_eps"))
    kv.u32(Keys.Attention.KEY_LENGTH, hp.integer("head_dim"))
    kv.u32(Keys.Attention.VALUE_LENGTH, hp.integer("head_dim"))
    kv.u32(Keys.General.FILE_TYPE, LlamaFileType.MOSTLY_F16.value)
    kv.f32(Keys.LLM.ATTN_LOGIT_SOFTCAPPING, hp.number("attn_logit_softcapping"))
    kv.f32(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, hp.number("final_logit_softcapping"))
    kv.u32(Keys.Attention.SLIDING_WINDOW, hp.integer("sliding_window"))
    return []


def _gemma3(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    _base(kv, hp, dims)
    kv.u32(Keys.LLM.CONTEXT_LENGTH, hp.integer("max_position_embeddings", 131072))
    kv.u32(Keys.Attention.HEAD_COUNT, dims.n_head)
    kv.f32(Keys.Attention.LAYERNORM_RMS_EPS, hp.number("rms_norm_eps", 1e-6))
    kv.u32(Keys.Attention.KEY_LENGTH, dims.head_dim)
    kv.u32(Keys.Attention.VALUE_LENGTH, dims.head_dim)
    kv.f32(Keys.Rope.FREQ_BASE, hp.rope_theta_or(1_000_000.0))
    if hp.get("final_logit_softcapping"):
        kv.f32(Keys.LLM.FINAL_LOGIT_SOFTCAPPING, hp.number("final_logit_softcapping"))
    if hp.get("sliding_window_pattern") != 1:
        kv.u32(Keys.Attention.SLIDING_WINDOW, hp.integer("sliding_window"))
    kv.u32(Keys.Attention.HEAD_COUNT_KV, dims.n_head_kv)
    return []


def _phi3(kv: _KV, hp: Params, dims: Dims) -> list[TensorSpec]:
    rope = hp.rope()
    orig = Params({**hp.values, **rope}).integer("original_max_position_embeddings")
    rope_dims = int(hp.number("partial_rotary_factor", 1.0) * dims.d_model) // dims.n_head
    kv.u32(Keys.LLM.CONTEXT_LENGTH, hp.integer("max_position_embeddings"))
    kv.u32(Keys.Rope.SCALING_ORIG_CTX_LEN, orig)
    kv.u32(Keys.LLM.EMBEDDING_LENGTH, dims.d_model)
    kv.u32(Keys.LLM.FEED_FORWARD_LENGTH, dims.n_ff)
    kv.u32(Keys.LLM.BLOCK_COUNT, dims.n_layer)
    kv.u32(Keys.Attention.HEAD_COUNT, dims.n_head)
    kv.u32(Keys.Attention.HEAD_COUNT_KV, dims.n_head_kv)
    kv.f32(Keys.Attention.LAYERNORM_RMS_EPS, hp.number("rms_norm_eps"))
    kv.u32(Keys.Rope.DIMENSION_COUNT, rope_dims)
    kv.f32(Keys.Rope.FREQ_BASE, hp.rope_theta_or(None))
    kv.u32(Keys.General.FILE_TYPE, LlamaFileType.MOSTLY_F16.value)
    kv.u32(Keys.Attention.SLIDING_WINDOW, hp.integer("sliding_window", 0) if hp.get("sliding_window") else 0)
    return _phi3_long_rope(kv, hp, rope, orig, rope_dims)


def _phi3_long_rope(kv: _KV, hp: Params, rope: Mapping, orig: int, rope_dims: int) -> list[TensorSpec]:
    """Phi-3's long-context models: an attention factor and the long and short rope factors as tensors."""
    import math

    long, short = rope.get("long_factor"), rope.get("short_factor")
    if not long:
        return []
    kind = str(rope.get("rope_type", rope.get("type", ""))).lower()
    scale = hp.integer("max_position_embeddings") / orig
    if kind in ("su", "longrope"):
        factor = math.sqrt(1 + math.log(scale) / math.log(orig)) if scale > 1.0 else 1.0
    elif kind == "yarn":
        factor = 0.1 * math.log(scale) + 1.0 if scale > 1.0 else 1.0
    else:
        raise SpecError(f"config.json: rope_scaling type {kind!r} is not supported for Phi-3")
    if not isinstance(short, list) or len(long) != len(short) or 2 * len(long) != rope_dims:
        raise SpecError(f"config.json: rope_scaling long_factor and short_factor must have {rope_dims // 2} values")
    kv.f32(Keys.Rope.SCALING_ATTN_FACTOR, factor)
    return [
        tensor_spec(MODEL_ARCH.PHI3, kind, (rope_dims // 2,))
        for kind in (MODEL_TENSOR.ROPE_FACTORS_LONG, MODEL_TENSOR.ROPE_FACTORS_SHORT)
    ]


_BUILDERS = {
    MODEL_ARCH.LLAMA: _llama,
    MODEL_ARCH.QWEN2: _base,
    MODEL_ARCH.QWEN3: _base,
    MODEL_ARCH.QWEN3MOE: _qwen3moe,
    MODEL_ARCH.GEMMA2: _gemma2,
    MODEL_ARCH.GEMMA3: _gemma3,
    MODEL_ARCH.PHI3: _phi3,
    MODEL_ARCH.GRANITE: _granite,
    MODEL_ARCH.OLMO2: _base,
    MODEL_ARCH.OLMOE: _olmoe,
    MODEL_ARCH.LFM2: lambda kv, hp, dims: _base(kv, hp, dims) + lfm2_keys(kv, hp, dims),
    MODEL_ARCH.QWEN2MOE: _qwen2moe,
    MODEL_ARCH.STARCODER2: _starcoder2,
    MODEL_ARCH.GPT_OSS: _gptoss,
    MODEL_ARCH.DEEPSEEK2: _deepseek2,
    MODEL_ARCH.GRANITE_HYBRID: granite_hybrid_builder(_llama),
}
_TENSORS = {MODEL_ARCH.LFM2: lfm2_tensors, MODEL_ARCH.GRANITE_HYBRID: granite_hybrid_tensors}  # their own block lists


def _vocab(kv: _KV, n_vocab: int) -> None:
    """synth's synthetic vocabulary (<unk>, <s>, </s>, 256 byte tokens, word pieces) of n_vocab tokens,
    its last token "<|endoftext|>": llama.cpp looks that token up by its text (and fails to load
    without it) in every model whose general.name says Phi-3."""
    tokens, scores, types = synthetic_vocab(n_vocab)
    tokens[-1], types[-1] = _ENDOFTEXT, int(TokenType.CONTROL)
    kv.string(Keys.Tokenizer.MODEL, "llama")
    kv.put(Keys.Tokenizer.LIST, Field.array(tokens, GGUFValueType.STRING))
    kv.put(Keys.Tokenizer.SCORES, Field.array(scores, GGUFValueType.FLOAT32))
    kv.put(Keys.Tokenizer.TOKEN_TYPE, Field.array(types, GGUFValueType.INT32))
    kv.u32(Keys.Tokenizer.BOS_ID, 1)
    kv.u32(Keys.Tokenizer.EOS_ID, 2)
    kv.u32(Keys.Tokenizer.UNK_ID, 0)
    kv.put(Keys.Tokenizer.ADD_BOS, Field.boolean(True))
    kv.put(Keys.Tokenizer.ADD_EOS, Field.boolean(False))
    kv.put(Keys.Tokenizer.ADD_PREFIX, Field.boolean(False))
