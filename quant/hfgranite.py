"""Granite 4.0-H (IBM's GraniteMoeHybridForCausalLM, GGUF architecture "granitehybrid") as llama.cpp's converter
writes it: most blocks a Mamba-2 mixer (in_proj to z, x, B, C and one dt per head; a depthwise convolution over the
last conv_kernel positions of x, B and C; the selective scan with A and D per head; a grouped RMS norm gated by z;
out_proj), a few grouped-query attention blocks without positional encoding, and after either a SwiGLU
feed-forward: routed experts beside a shared expert (H-Tiny, H-Small) or one dense MLP (H-Micro). Granite's four
multipliers scale embeddings, residuals, attention scores and logits.

The converter (GraniteHybridModel, built on Mamba2Model and GraniteMoeModel) reads config.json as it is, not through
transformers' AutoConfig: a field the file leaves out is not filled in, so a multiplier or a shared expert width that
is missing is not written, and a Mamba field it needs is a KeyError. It looks each Mamba field up under its plain
name and then with the "mamba_" prefix (mamba_d_conv, mamba_d_state, mamba_n_groups, mamba_expand, mamba_n_heads).
It writes Granite's keys (TextModel's, Llama's vocab_size and rope width, the multipliers, the shared expert's width),
then the SSM keys (conv kernel, state size, group count, inner size expand x hidden_size, time-step rank = the SSM
head count), the KV heads per block in the base's place (0 for a Mamba block: llama.cpp's loader takes those as
recurrent), rope.scaling.finetuned false (llama.cpp's switch for rope: a hybrid attends without it) and a context
length of 2**20 in the base's place (the scan has no trained length; nor has attention without positions).
ondevice.quant.hfconfig calls granite_hybrid_params before the shape is read, granite_hybrid_builder's keys after
them, granite_hybrid_tensors for the tensor table.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from gguf import MODEL_ARCH, MODEL_TENSOR, TENSOR_NAMES, GGUFValueType, Keys
from ondevice.quant.header import Field, TensorSpec
from ondevice.quant.hfshape import Dims, Params, kinds_from_indices, layer_kinds, tensor_spec

from ondevice.core.errors import SpecError

__all__ = ["granite_hybrid_params", "granite_hybrid_builder", "granite_hybrid_tensors", "attention_layers"]

_ATTENTION, _MAMBA = "attention", "mamba"  # GraniteMoeHybridConfig's layer types
_KINDS = (_MAMBA, _ATTENTION)
# Granite's multipliers -> their keys, in the converter's order; written only where the config has a non-zero one
_SCALES = {
    "attention_multiplier": Keys.Attention.SCALE,
    "embedding_multiplier": Keys.LLM.EMBEDDING_SCALE,
    "residual_multiplier": Keys.LLM.RESIDUAL_SCALE,
    "logits_scaling": Keys.LLM.LOGIT_SCALE,
}
_NO_ROPE_CONTEXT = 2**20  # the context length the converter writes for a hybrid (no rope)


def _mamba(hp: Params, *names: str) -> int:
    """The converter's find_hparam: the first of `names` the config has, then each with the "mamba_" prefix."""
    for name in names + tuple(f"mamba_{n}" for n in names):
        if hp.get(name) is not None:
            return hp.integer(name)
    raise SpecError(f"config.json: 'mamba_{names[-1]}' is missing")


def granite_hybrid_params(hp: Params) -> Params:
    """The config as the converter reads it, with layer_types resolved (from the list, the attention blocks' indices,
    or a period and offset) and head_dim dropped (GraniteModel ignores it: heads are hidden_size / heads wide).
    SpecError for what the converter refuses or llama.cpp cannot load."""
    values: dict[str, Any] = {k: v for k, v in hp.values.items() if k != "head_dim"}
    read = Params(values)
    values["layer_types"] = _layer_types(read)
    if _MAMBA not in values["layer_types"]:  # the converter writes it as "granite" or "granitemoe"
        raise SpecError("config.json: no block is 'mamba'; the converter writes it as granite or granitemoe")
    d_model, expand = read.integer("hidden_size"), _mamba(read, "expand")
    heads, groups = _mamba(read, "n_heads"), _mamba(read, "n_groups")
    if expand != 2:  # llama.cpp's loader asserts (aborts) unless the inner size is twice the width
        raise SpecError(f"config.json: 'mamba_expand' is {expand}; llama.cpp's granitehybrid takes only 2")
    d_inner = expand * d_model
    if d_inner % heads or heads % groups:
        raise SpecError(
            f"config.json: 'mamba_n_heads' {heads} must divide the inner size {d_inner} and be a multiple of "
            f"'mamba_n_groups' {groups}"
        )
    if read.get("mamba_d_head") is not None and read.integer("mamba_d_head") * heads != d_inner:
        raise SpecError(
            f"config.json: 'mamba_d_head' {read.get('mamba_d_head')} x {heads} heads is not the inner size {d_inner}"
        )
    if read.get("hidden_act") not in (None, "silu"):  # the converter asserts it
        raise SpecError(f"config.json: 'hidden_act' is {read.get('hidden_act')!r}; the converter takes only 'silu'")
    for bias in ("mamba_proj_bias", "attention_bias"):  # the converter would write biases no loader path reads
        if read.get(bias) not in (None, False):
            raise SpecError(f"config.json: {bias!r} is {read.get(bias)!r}; llama.cpp's granitehybrid has no such bias")
    _mamba(read, "d_conv"), _mamba(read, "d_state"), read.integer("num_key_value_heads")
    read.number("rms_norm_eps")  # llama.cpp's loader requires the RMS epsilon
    shared, width = read.get("shared_intermediate_size"), read.get("intermediate_size")
    if not read.get("num_local_experts") and (shared or 0) != width:  # dense: the checkpoint's shared_mlp is the MLP,
        raise SpecError(  # the converter writes intermediate_size as its width
            f"config.json: 'shared_intermediate_size' {shared!r} is not intermediate_size {width!r}; llama.cpp loads "
            "no dense Granite-H whose MLP is not feed_forward_length wide"
        )
    return Params(values)


def attention_layers(hp: Params) -> tuple[bool, ...]:
    """Per block: whether it attends (else it is a Mamba-2 mixer), from granite_hybrid_params' layer_types."""
    return tuple(kind == _ATTENTION for kind in hp.values["layer_types"])


def _layer_types(hp: Params) -> list[str]:
    kinds = hp.get("layer_types")  # else the converter's fallbacks: the attention blocks' indices, or a period
    if kinds is None and hp.get("attn_layer_indices") is not None:
        kinds = kinds_from_indices(hp, "attn_layer_indices", _KINDS)
    elif kinds is None and hp.get("attn_layer_period") is not None:
        period, offset = hp.integer("attn_layer_period"), hp.get("attn_layer_offset")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset < period:
            raise SpecError(f"config.json: 'attn_layer_offset' must be 0..{period - 1}, not {offset!r}")
        kinds = [_ATTENTION if i % period == offset else _MAMBA for i in range(hp.integer("num_hidden_layers"))]
    if kinds is None:
        raise SpecError("config.json: 'layer_types' (or 'attn_layer_indices', 'attn_layer_period') is missing")
    return layer_kinds(hp, kinds, _KINDS, "a Granite-H")


def _experts(dims: Dims, hp: Params) -> Dims:
    """The routed experts (each intermediate_size wide) and the shared expert (shared_intermediate_size), or none."""
    n_exp = hp.get("num_local_experts") or 0
    if not n_exp:
        return dims
    used = hp.integer("num_experts_per_tok")
    if used > hp.integer("num_local_experts"):
        raise SpecError(f"config.json: 'num_experts_per_tok' {used} is more than the {n_exp} experts")
    shared = hp.integer("shared_intermediate_size", 0)
    return replace(dims, n_expert=n_exp, n_expert_used=used, n_ff_exp=dims.n_ff, n_ff_shexp=shared)


def granite_hybrid_builder(llama: Callable[..., list]) -> Callable[[Any, Params, Dims], list]:
    """hfconfig's builder of Granite-H's keys from its Llama builder (`llama`: TextModel's keys, vocab_size, the rope
    width)."""

    def build(kv: Any, hp: Params, dims: Dims) -> list:
        dims = _experts(dims, hp)
        extra = llama(kv, hp, dims, MODEL_ARCH.GRANITE_HYBRID)
        for field, key in _SCALES.items():
            if hp.get(field):  # the converter's `if value := hparams.get(...)`: none for a missing or zero one
                kv.f32(key, hp.number(field))
        if hp.get("shared_intermediate_size"):
            kv.u32(Keys.LLM.EXPERT_SHARED_FEED_FORWARD_LENGTH, hp.integer("shared_intermediate_size"))
        kv.u32(Keys.SSM.CONV_KERNEL, _mamba(hp, "conv_kernel", "d_conv"))
        kv.u32(Keys.SSM.STATE_SIZE, _mamba(hp, "state_size", "d_state"))
        kv.u32(Keys.SSM.GROUP_COUNT, _mamba(hp, "n_groups"))
        kv.u32(Keys.SSM.INNER_SIZE, _mamba(hp, "expand") * dims.d_model)
        kv.u32(Keys.SSM.TIME_STEP_RANK, _mamba(hp, "n_heads"))
        if hp.get("attn_rotary_emb") is not None:
            kv.u32(Keys.Rope.DIMENSION_COUNT, hp.integer("attn_rotary_emb"))
        heads = [dims.n_head_kv if attends else 0 for attends in attention_layers(hp)]
        kv.put(Keys.Attention.HEAD_COUNT_KV, Field.array(heads, GGUFValueType.INT32))
        kv.put(Keys.Rope.SCALING_FINETUNED, Field.boolean(False))
        kv.u32(Keys.LLM.CONTEXT_LENGTH, _NO_ROPE_CONTEXT)
        return extra

    return build


def granite_hybrid_tensors(dims: Dims, hp: Params) -> tuple[TensorSpec, ...]:
    """The tensors llama.cpp's granitehybrid loader takes: per block its norm, then a Mamba-2 mixer (ssm_in; the
    convolution's kernel, F32 as the converter keeps it, and bias; dt's bias, A and D per head, F32; the grouped norm;
    ssm_out) or attention (q, k, v, output); then the feed-forward's norm and a dense MLP or a router, the routed
    experts merged and the shared expert; the final norm; a head only when untied."""
    dims, arch, T = _experts(dims, hp), MODEL_ARCH.GRANITE_HYBRID, MODEL_TENSOR
    d, hd, v = dims.d_model, dims.head_dim, dims.n_vocab
    conv, state = _mamba(hp, "conv_kernel", "d_conv"), _mamba(hp, "state_size", "d_state")
    groups = _mamba(hp, "n_groups")
    d_inner, heads = _mamba(hp, "expand") * d, _mamba(hp, "n_heads")
    xbc = d_inner + 2 * groups * state  # what the convolution mixes: x, B and C
    out = [tensor_spec(arch, T.TOKEN_EMBD, (d, v))]
    for bid, attends in enumerate(attention_layers(hp)):
        out.append(tensor_spec(arch, T.ATTN_NORM, (d,), bid))
        if attends:
            q, kv = dims.n_head * hd, dims.n_head_kv * hd
            parts = [(T.ATTN_Q, (d, q)), (T.ATTN_K, (d, kv)), (T.ATTN_V, (d, kv)), (T.ATTN_OUT, (q, d))]
            out += [tensor_spec(arch, kind, shape, bid) for kind, shape in parts]
        else:
            out.append(tensor_spec(arch, T.SSM_IN, (d, 2 * d_inner + 2 * groups * state + heads), bid))
            out.append(replace(tensor_spec(arch, T.SSM_CONV1D, (conv, xbc), bid), type="F32"))
            if hp.get("mamba_conv_bias", True) is not False:  # GraniteMoeHybridConfig's default: a bias
                out.append(tensor_spec(arch, T.SSM_CONV1D, (xbc,), bid, "bias"))
            out.append(tensor_spec(arch, T.SSM_DT, (heads,), bid, "bias"))
            out += [TensorSpec(TENSOR_NAMES[kind].format(bid=bid), (1, heads), "F32") for kind in (T.SSM_A, T.SSM_D)]
            out.append(tensor_spec(arch, T.SSM_NORM, (d_inner // groups, groups), bid))
            out.append(tensor_spec(arch, T.SSM_OUT, (d_inner, d), bid))
        out += [tensor_spec(arch, kind, shape, bid) for kind, shape in _ffn(dims)]
    out.append(tensor_spec(arch, T.OUTPUT_NORM, (d,)))
    if not dims.tied:
        out.append(tensor_spec(arch, T.OUTPUT, (d, v)))
    return tuple(_f32_norm(t) for t in out)


def _ffn(dims: Dims) -> list[tuple[MODEL_TENSOR, tuple[int, ...]]]:
    d, ff, T = dims.d_model, dims.n_ff, MODEL_TENSOR
    parts: list[tuple[MODEL_TENSOR, tuple[int, ...]]] = [(T.FFN_NORM, (d,))]
    if not dims.n_expert:  # the checkpoint's shared_mlp, as the dense MLP
        return parts + [(T.FFN_GATE, (d, ff)), (T.FFN_UP, (d, ff)), (T.FFN_DOWN, (ff, d))]
    e, fs = dims.n_expert, dims.n_ff_shexp
    parts += [(T.FFN_GATE_INP, (d, e)), (T.FFN_GATE_EXP, (d, ff, e)), (T.FFN_UP_EXP, (d, ff, e))]
    parts.append((T.FFN_DOWN_EXP, (ff, d, e)))
    if fs:
        parts += [(T.FFN_GATE_SHEXP, (d, fs)), (T.FFN_UP_SHEXP, (d, fs)), (T.FFN_DOWN_SHEXP, (fs, d))]
    return parts


def _f32_norm(t: TensorSpec) -> TensorSpec:
    """The grouped norm is 2-D (width per group x groups) but F32, as the converter keeps every "_norm.weight"."""
    return replace(t, type="F32") if t.name.endswith("_norm.weight") else t
