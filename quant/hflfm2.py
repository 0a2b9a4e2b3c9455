"""LFM2 (Liquid's Lfm2ForCausalLM, GGUF architecture "lfm2") as llama.cpp's converter writes it: most blocks a
gated short convolution (in_proj to three times the width, a depthwise convolution over the last conv_L_cache
tokens, out_proj; a small recurrent state, no KV cache), a few grouped-query attention with q/k norms, every block
a SwiGLU feed-forward; one RMS norm after the last block (the checkpoint's embedding_norm, "token_embd_norm" in
the file), the head tied to the embedding.

The converter (its LFM2Model) reads the config through transformers' Lfm2Config, writes TextModel's keys with
num_key_value_heads per layer (0 marks a convolution block: llama.cpp's loader takes those as recurrent), then
vocab_size, shortconv.l_cache and norm_eps as the RMS epsilon, and the feed-forward width after
block_auto_adjust_ff_dim (two thirds, times block_ffn_dim_multiplier, rounded up to block_multiple_of) in the place
the base gave intermediate_size. ondevice.quant.hfconfig calls lfm2_params before the shape is read, lfm2_keys
after the base keys, lfm2_tensors for the tensor table.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from gguf import MODEL_ARCH, MODEL_TENSOR, GGUFValueType, Keys
from ondevice.quant.header import Field, TensorSpec
from ondevice.quant.hfshape import Dims, Params, kinds_from_indices, layer_kinds, tensor_spec

from ondevice.core.errors import SpecError

__all__ = ["lfm2_params", "lfm2_keys", "lfm2_tensors", "attention_layers"]

# Lfm2Config's defaults, which the converter sees for fields a config.json leaves out (through AutoConfig), where
# they differ from what a missing field gives here; the published configs leave out tie_word_embeddings (tied)
_DEFAULTS = {
    "max_position_embeddings": 128_000,
    "num_key_value_heads": 8,
    "norm_eps": 1e-5,
    "conv_L_cache": 3,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "block_multiple_of": 256,
    "block_ffn_dim_multiplier": 1.0,
    "block_auto_adjust_ff_dim": True,
}
_CONV, _ATTENTION = "conv", "full_attention"  # Lfm2Config's layer types
_KINDS = (_CONV, _ATTENTION)


def lfm2_params(hp: Params) -> Params:
    """The config as the converter reads it: Lfm2Config's defaults, the first checkpoints' keys in the place of
    transformers' (block_ff_dim as intermediate_size, tie_embedding, theta; full_attn_idxs as layer_types), and
    intermediate_size the feed-forward width llama.cpp's blocks have. SpecError for what llama.cpp cannot load."""
    values: dict[str, Any] = {**_DEFAULTS, **hp.values}
    for original, key in (("block_ff_dim", "intermediate_size"), ("tie_embedding", "tie_word_embeddings")):
        if values.get(original) is not None:
            values[key] = values[original]
    if values.get("theta") is not None:
        values["rope_theta"] = values["theta"]
    read = Params(values)
    values["layer_types"] = _layer_types(read)
    values["intermediate_size"] = _feed_forward_length(read)
    if read.get("conv_bias") not in (None, False):  # the converter would write biases llama.cpp's loader never takes
        raise SpecError(f"config.json: 'conv_bias' is {read.get('conv_bias')!r}; llama.cpp's LFM2 has no such bias")
    if read.integer("conv_L_cache") < 2:  # llama.cpp's graph asserts (aborts) on a window of one
        raise SpecError("config.json: 'conv_L_cache' must be at least 2, not 1")
    read.number("norm_eps")
    return Params(values)


def attention_layers(hp: Params) -> tuple[bool, ...]:
    """Per block: whether it attends (else it is a short convolution), from lfm2_params' layer_types."""
    return tuple(kind == _ATTENTION for kind in hp.values["layer_types"])


def _layer_types(hp: Params) -> list[str]:
    kinds = hp.get("layer_types")
    if kinds is None and hp.get("full_attn_idxs") is not None:  # the first checkpoints: the attention blocks' indices
        kinds = kinds_from_indices(hp, "full_attn_idxs", _KINDS)
    if kinds is None:  # (Lfm2Config would make every block attend: no LFM2 is that)
        raise SpecError("config.json: 'layer_types' (or 'full_attn_idxs') is missing")
    return layer_kinds(hp, kinds, _KINDS, "an LFM2")


def _feed_forward_length(hp: Params) -> int:
    """LFM2Model._add_feed_forward_length: with block_auto_adjust_ff_dim, two thirds of intermediate_size, times
    block_ffn_dim_multiplier, rounded up to a multiple of block_multiple_of."""
    width = hp.integer("intermediate_size")
    auto = hp.get("block_auto_adjust_ff_dim")
    if not isinstance(auto, bool):
        raise SpecError(f"config.json: 'block_auto_adjust_ff_dim' must be true or false, not {auto!r}")
    if auto:
        width = int(2 * width / 3)
        if hp.get("block_ffn_dim_multiplier") is not None:
            width = int(hp.number("block_ffn_dim_multiplier") * width)
        multiple = hp.integer("block_multiple_of")
        width = multiple * ((width + multiple - 1) // multiple)
    if width < 1:
        raise SpecError(f"config.json: the feed-forward width comes out {width} (intermediate_size after adjusting)")
    return width


def lfm2_keys(kv: Any, hp: Params, dims: Dims) -> list[TensorSpec]:
    """After TextModel's keys (kv: hfconfig's writer): the KV heads per block in the base's place (0 for a
    convolution), vocab_size, shortconv.l_cache, norm_eps as the RMS epsilon."""
    if dims.n_head * dims.head_dim != dims.d_model:  # llama.cpp's q and output projections are hidden_size square
        raise SpecError(
            f"config.json: {dims.n_head} heads of {dims.head_dim} are not hidden_size {dims.d_model}; "
            "llama.cpp loads no such LFM2"
        )
    heads = [dims.n_head_kv if attends else 0 for attends in attention_layers(hp)]
    kv.put(Keys.Attention.HEAD_COUNT_KV, Field.array(heads, GGUFValueType.INT32))
    kv.u32(Keys.LLM.VOCAB_SIZE, dims.n_vocab)
    kv.u32(Keys.ShortConv.L_CACHE, hp.integer("conv_L_cache"))
    kv.f32(Keys.Attention.LAYERNORM_RMS_EPS, hp.number("norm_eps"))
    return []


def lfm2_tensors(dims: Dims, hp: Params) -> tuple[TensorSpec, ...]:
    """The tensors llama.cpp's lfm2 loader takes: per block its norm, attention (q, k, v, q/k norms per head,
    output) or short convolution (the depthwise kernel, F32 as the converter keeps it, in_proj, out_proj), the
    feed-forward's norm and matrices; the final norm under the embedding norm's name; a head only when untied."""
    arch, T = MODEL_ARCH.LFM2, MODEL_TENSOR
    d, ff, hd, v = dims.d_model, dims.n_ff, dims.head_dim, dims.n_vocab
    kv = dims.n_head_kv * hd
    out = [tensor_spec(arch, T.TOKEN_EMBD, (d, v))]
    for bid, attends in enumerate(attention_layers(hp)):
        parts: list[tuple[MODEL_TENSOR, tuple[int, ...]]] = [(T.ATTN_NORM, (d,))]
        if attends:
            parts += [(T.ATTN_Q, (d, d)), (T.ATTN_K, (d, kv)), (T.ATTN_V, (d, kv))]
            parts += [(T.ATTN_Q_NORM, (hd,)), (T.ATTN_K_NORM, (hd,)), (T.ATTN_OUT, (d, d))]
        else:
            parts += [(T.SHORTCONV_CONV, (hp.integer("conv_L_cache"), d))]
            parts += [(T.SHORTCONV_INPROJ, (d, 3 * d)), (T.SHORTCONV_OUTPROJ, (d, d))]
        parts += [(T.FFN_NORM, (d,)), (T.FFN_GATE, (d, ff)), (T.FFN_UP, (d, ff)), (T.FFN_DOWN, (ff, d))]
        out += [_typed(tensor_spec(arch, kind, shape, bid)) for kind, shape in parts]
    out.append(tensor_spec(arch, T.TOKEN_EMBD_NORM, (d,)))
    if not dims.tied:
        out.append(tensor_spec(arch, T.OUTPUT, (d, v)))
    return tuple(out)


def _typed(t: TensorSpec) -> TensorSpec:
    """The convolution kernel stays F32 (the converter's list of tensors kept in float32, as llama.cpp's quantizer
    keeps them)."""
    return replace(t, type="F32") if t.name.endswith(".shortconv.conv.weight") else t
