"""DeepSeek-V2's keys as llama.cpp's converter writes them (its DeepseekV2Model, "deepseek2"), and the expert-routing
keys its base class writes for any config that has the fields (n_group, topk_group, scoring_func). The header
builder (ondevice.quant.hfconfig) calls these; the tensors come from ondevice.quant.hfshape (Dims.mla).

The converter reads a config through transformers' AutoConfig, whose DeepseekV2Config sets head_dim to
qk_rope_head_dim: the base class writes it as key_length and value_length, which DeepseekV2Model then overwrites with
MLA's cache widths (kv_lora_rank + qk_rope_head_dim for keys, kv_lora_rank for values; the keys keep the base's place,
as gguf's writer keeps a key's first place). It also sets one KV head (MLA as multi-query attention over the latent)
and an RMS epsilon of 1e-6 where a config has none.
"""

from __future__ import annotations

from typing import Protocol

from gguf import ExpertGatingFuncType, Keys
from ondevice.quant.header import Field
from ondevice.quant.hfshape import Dims, Params

from ondevice.core.errors import SpecError

__all__ = ["deepseek2_params", "deepseek2_keys", "routing_keys"]

# scoring_func -> the gating function the converter's base class writes (any other value: it refuses the config)
_GATING = {"softmax": ExpertGatingFuncType.SOFTMAX, "sigmoid": ExpertGatingFuncType.SIGMOID}


class _Writer(Protocol):  # hfconfig's key writer
    def put(self, template: str, value: Field) -> None: ...

    def u32(self, template: str, value: int) -> None: ...

    def f32(self, template: str, value: float) -> None: ...


def deepseek2_params(hp: Params) -> Params:
    """The config as the converter's DeepseekV2Model reads it: AutoConfig's head_dim (qk_rope_head_dim), one KV
    head whatever the config says, the RMS epsilon's default."""
    extra = {"head_dim": hp.get("qk_rope_head_dim"), "num_key_value_heads": 1}
    return Params({"rms_norm_eps": 1e-6, **hp.values, **extra})


def routing_keys(kv: _Writer, hp: Params) -> None:
    """The base class's expert-group counts and gating function, where the config has them."""
    if hp.get("n_group") is not None:
        kv.u32(Keys.LLM.EXPERT_GROUP_COUNT, hp.integer("n_group"))
    if hp.get("topk_group") is not None:
        kv.u32(Keys.LLM.EXPERT_GROUP_USED_COUNT, hp.integer("topk_group"))
    score = hp.get("scoring_func")
    if score is not None:
        if score not in _GATING:
            raise SpecError(f"config.json: 'scoring_func' {score!r} is not one of {', '.join(map(repr, _GATING))}")
        kv.u32(Keys.LLM.EXPERT_GATING_FUNC, _GATING[score].value)


def deepseek2_keys(kv: _Writer, hp: Params, dims: Dims) -> None:
    """DeepseekV2Model's keys after the base's: the leading dense blocks, the vocabulary, the latents' ranks (q's
    only where it has one), MLA's cache widths and per-head widths, the experts (routed width and count, the shared
    count, the routed weights' scale, their normalisation only when on), rope's width and YaRN's log multiplier
    (0.1 x mscale_all_dim, which llama.cpp divides by 0.1 again)."""
    mla = dims.mla
    assert mla is not None  # Dims.read gives a DeepSeek-V2 config its MLA widths
    kv.u32(Keys.LLM.LEADING_DENSE_BLOCK_COUNT, dims.n_dense_lead)
    kv.u32(Keys.LLM.VOCAB_SIZE, dims.n_vocab)
    if mla.q_lora_rank:
        kv.u32(Keys.Attention.Q_LORA_RANK, mla.q_lora_rank)
    kv.u32(Keys.Attention.KV_LORA_RANK, mla.kv_lora_rank)
    kv.u32(Keys.Attention.KEY_LENGTH, mla.kv_lora_rank + mla.qk_rope)
    kv.u32(Keys.Attention.VALUE_LENGTH, mla.kv_lora_rank)
    kv.u32(Keys.Attention.KEY_LENGTH_MLA, mla.qk_nope + mla.qk_rope)
    kv.u32(Keys.Attention.VALUE_LENGTH_MLA, mla.v_head)
    kv.u32(Keys.LLM.EXPERT_FEED_FORWARD_LENGTH, dims.n_ff_exp)
    kv.u32(Keys.LLM.EXPERT_COUNT, dims.n_expert)
    kv.u32(Keys.LLM.EXPERT_SHARED_COUNT, dims.n_ff_shexp // dims.n_ff_exp)
    if hp.get("routed_scaling_factor") is not None:
        kv.f32(Keys.LLM.EXPERT_WEIGHTS_SCALE, hp.number("routed_scaling_factor"))
    if hp.get("norm_topk_prob") is True:
        kv.put(Keys.LLM.EXPERT_WEIGHTS_NORM, Field.boolean(True))
    kv.u32(Keys.Rope.DIMENSION_COUNT, mla.qk_rope)
    mscale_all = hp.rope().get("mscale_all_dim")
    if mscale_all is not None:
        kv.f32(Keys.Rope.SCALING_YARN_LOG_MUL, 0.1 * hp._number("rope_scaling.mscale_all_dim", mscale_all))
