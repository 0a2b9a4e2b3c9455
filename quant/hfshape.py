"""A Hugging Face config's shape as llama.cpp's converter reads it (Params, Dims: the fields, checked, with the
name of the one missing or wrong in the SpecError), and the tensors llama.cpp's loader takes for that shape
in each architecture (tensor_list). ondevice.quant.hfconfig writes the header from them."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gguf import MODEL_ARCH, MODEL_ARCH_NAMES, MODEL_TENSOR, MODEL_TENSORS, TENSOR_NAMES
from ondevice.quant.header import TensorSpec

from ondevice.core.errors import SpecError

__all__ = ["Params", "Dims", "Mla", "with_experts", "tensor_list", "tensor_spec", "layer_kinds", "kinds_from_indices"]

# Every Gemma 3 shares one tokenizer of 262144 tokens; the converter cuts the embedding to it where a
# config's vocab_size is larger (262208 in the 4B-27B configs: rows no token reaches)
_GEMMA3_TOKENIZER_SIZE = 262144
_MISSING = object()


class Params:
    """The config's fields, read with the name of the one that is missing or wrong in the error."""

    def __init__(self, values: Mapping[str, Any]):
        self.values = dict(values)

    def get(self, key: str, default: Any = None) -> Any:
        value = self.values.get(key)
        return default if value is None else value

    def integer(self, key: str, default: Any = _MISSING) -> int:
        value = self.values.get(key)
        if value is None:
            if default is _MISSING:
                raise SpecError(f"config.json: {key!r} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise SpecError(f"config.json: {key!r} must be a positive integer, not {value!r}")
        return value

    def number(self, key: str, default: Any = _MISSING) -> float:
        value = self.values.get(key)
        if value is None:
            if default is _MISSING:
                raise SpecError(f"config.json: {key!r} is missing")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:
            raise SpecError(f"config.json: {key!r} must be a number, not {value!r}")
        return float(value)

    def rope(self) -> Mapping[str, Any]:
        """Rope parameters of the full-attention layers: transformers' rope_parameters, or the older
        rope_scaling ({} for none)."""
        rope = self.values.get("rope_parameters") or self.values.get("rope_scaling") or {}
        if isinstance(rope, Mapping) and isinstance(rope.get("full_attention"), Mapping):
            rope = rope["full_attention"]
        if not isinstance(rope, Mapping):
            raise SpecError(f"config.json: 'rope_scaling' must be an object or null, not {rope!r}")
        return rope

    def rope_theta(self) -> float | None:
        theta = self.rope().get("rope_theta", self.values.get("rope_theta"))
        return None if theta is None else self._number("rope_theta", theta)

    def rope_theta_or(self, default: float | None) -> float:
        """rope_theta, else `default`; SpecError when both are missing."""
        theta = self.rope_theta()
        if theta is None and default is None:
            raise SpecError("config.json: 'rope_theta' is missing")
        return theta if theta is not None else float(default or 0)

    def _number(self, key: str, value: Any) -> float:
        return Params({key: value}).number(key)


# llama.cpp's deepseek2 loader takes a model with no q_lora_rank key (q projected directly, as DeepSeek-V2-Lite's) only
# at these block counts: its "lite" test reads the depth (and, for 48 blocks, a 128,256-token vocabulary), not the key
LITE_BLOCKS = (26, 27)


@dataclass(frozen=True)
class Mla:
    """Multi-head latent attention's widths (DeepSeek-V2): keys and values come from one latent of kv_lora_rank
    per token (its norm, then per head a no-rope key part and a value part), beside a rope part of qk_rope shared by
    the heads; q straight from the input (q_lora_rank 0) or through a latent of its own."""

    q_lora_rank: int  # 0: q projected directly
    kv_lora_rank: int
    qk_nope: int  # per head: the key's part without rope
    qk_rope: int  # the key's rope part, one for all heads
    v_head: int

    @classmethod
    def read(cls, hp: Params, dims: Dims) -> Mla:
        q_lora = 0 if hp.get("q_lora_rank") is None else hp.integer("q_lora_rank")
        lite = dims.n_layer in LITE_BLOCKS or (dims.n_layer == 48 and dims.n_vocab == 128256)
        if not q_lora and not lite:
            raise SpecError(
                f"config.json: 'q_lora_rank' is null; llama.cpp loads a DeepSeek-V2 without one (q projected directly) "
                f"only at {' or '.join(map(str, LITE_BLOCKS))} blocks, not {dims.n_layer}"
            )
        kv_lora = hp.integer("kv_lora_rank", 512)  # the converter's default
        return cls(
            q_lora, kv_lora, hp.integer("qk_nope_head_dim"), hp.integer("qk_rope_head_dim"), hp.integer("v_head_dim")
        )


def _dense_lead(hp: Params, n_layer: int) -> int:
    """first_k_dense_replace (the converter's default: 0), checked; llama.cpp makes every later block a MoE block."""
    lead = hp.get("first_k_dense_replace", 0)
    if isinstance(lead, bool) or not isinstance(lead, int) or not 0 <= lead <= n_layer:
        raise SpecError(f"config.json: 'first_k_dense_replace' must be 0..{n_layer} (num_hidden_layers), not {lead!r}")
    if hp.get("moe_layer_freq", 1) != 1:
        raise SpecError(
            f"config.json: 'moe_layer_freq' is {hp.get('moe_layer_freq')!r}; llama.cpp's deepseek2 makes every block "
            "after the leading dense ones a mixture of experts"
        )
    return lead


@dataclass(frozen=True)
class Dims:
    """The numbers that decide the tensors' shapes."""

    n_vocab: int
    d_model: int
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_ff: int
    tied: bool
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0
    n_ff_shexp: int = 0  # the shared expert's width (0: none)
    n_dense_lead: int = 0  # leading blocks of a mixture of experts with a dense feed-forward (first_k_dense_replace)
    mla: Mla | None = None  # multi-head latent attention's widths (DeepSeek-V2), in place of q/k/v

    @classmethod
    def read(cls, hp: Params, arch: MODEL_ARCH, hf_arch: str) -> Dims:
        d, n_head = (
            hp.integer("hidden_size"),
            hp.integer("num_attention_heads", 8 if arch == MODEL_ARCH.GEMMA3 else _MISSING),
        )
        n_kv = hp.integer("num_key_value_heads", 4 if arch == MODEL_ARCH.GEMMA3 else n_head)
        default_hd = 256 if arch == MODEL_ARCH.GEMMA3 else (d // n_head if d % n_head == 0 else _MISSING)
        head_dim = hp.integer("head_dim", default_hd)
        if n_head % n_kv:
            raise SpecError(
                f"config.json: num_attention_heads {n_head} is not a multiple of num_key_value_heads {n_kv}"
            )
        n_vocab = hp.integer("vocab_size")
        if arch == MODEL_ARCH.GEMMA3:
            n_vocab = min(n_vocab, _GEMMA3_TOKENIZER_SIZE)
        if n_vocab < 259:
            raise SpecError(f"config.json: 'vocab_size' {n_vocab} is too small (at least 259)")
        tied = arch in (MODEL_ARCH.GEMMA2, MODEL_ARCH.GEMMA3) or bool(hp.get("tie_word_embeddings", False))
        dims = cls(
            n_vocab, d, hp.integer("num_hidden_layers"), n_head, n_kv, head_dim, hp.integer("intermediate_size"), tied
        )
        return with_experts(dims, hp, hf_arch)


def with_experts(dims: Dims, hp: Params, hf_arch: str) -> Dims:
    if hf_arch == "MixtralForCausalLM":
        n_exp, n_ff_exp = hp.integer("num_local_experts"), dims.n_ff
    elif hf_arch in ("Qwen3MoeForCausalLM", "Qwen2MoeForCausalLM"):
        n_exp, n_ff_exp = hp.integer("num_experts"), hp.integer("moe_intermediate_size")
        model = "Qwen3-MoE" if hf_arch == "Qwen3MoeForCausalLM" else "Qwen2-MoE"
        if hp.get("mlp_only_layers") or hp.integer("decoder_sparse_step", 1) != 1:
            raise SpecError(
                f"config.json: 'mlp_only_layers' / 'decoder_sparse_step': dense layers in a {model} are not supported"
            )
        if hf_arch == "Qwen2MoeForCausalLM":  # every block's shared expert, behind its own gate
            dims = replace(dims, n_ff_shexp=hp.integer("shared_expert_intermediate_size"))
    elif hf_arch == "DeepseekV2ForCausalLM":  # after the leading dense blocks, routed experts and shared ones
        n_exp, n_ff_exp = hp.integer("n_routed_experts"), hp.integer("moe_intermediate_size", dims.n_ff)
        dims = replace(dims, n_ff_shexp=n_ff_exp * hp.integer("n_shared_experts"), mla=Mla.read(hp, dims))
        dims = replace(dims, n_dense_lead=_dense_lead(hp, dims.n_layer))
    elif hf_arch == "OlmoeForCausalLM":  # every block's experts, each as wide as intermediate_size
        n_exp, n_ff_exp = hp.integer("num_experts"), dims.n_ff
        if dims.n_head_kv != dims.n_head:  # the converter writes k's norm n_head_kv x head_dim wide
            raise SpecError(
                f"config.json: 'num_key_value_heads' {dims.n_head_kv} is not num_attention_heads {dims.n_head}; "
                "llama.cpp loads no OLMoE with grouped queries (its k norm must be as wide as hidden_size)"
            )
    elif hf_arch == "GptOssForCausalLM":  # every block's experts, each as wide as intermediate_size
        n_exp, n_ff_exp = hp.integer("num_local_experts"), dims.n_ff
        _check_gptoss(hp, dims)
    else:
        return dims
    used = hp.integer("num_experts_per_tok")
    if used > n_exp:
        raise SpecError(f"config.json: 'num_experts_per_tok' {used} is more than the {n_exp} experts")
    return replace(dims, n_expert=n_exp, n_expert_used=used, n_ff_exp=n_ff_exp)


def _check_gptoss(hp: Params, dims: Dims) -> None:
    """What llama.cpp's gpt-oss takes as given: attention biases, a head_dim (GptOssConfig's default is 64, not the
    hidden_size / heads a missing one gives here), a window on every other layer from the first (its fixed pattern:
    the converter writes no key that says which)."""
    if hp.get("attention_bias", True) is not True:  # GptOssConfig's default; llama.cpp requires every bias
        raise SpecError(
            f"config.json: 'attention_bias' is {hp.get('attention_bias')!r}; llama.cpp loads no gpt-oss without biases"
        )
    hp.integer("head_dim")
    pattern = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(dims.n_layer)]
    if hp.get("layer_types", pattern) != pattern:
        raise SpecError(
            "config.json: 'layer_types' is not sliding and full attention in turn from the first layer; llama.cpp's "
            "gpt-oss windows every other layer from the first, whatever the config says"
        )


def layer_kinds(hp: Params, kinds: object, allowed: tuple[str, str], arch: str) -> list[str]:
    """A hybrid's layer_types, checked: a list naming each of num_hidden_layers blocks one of `allowed` (its
    recurrent kind, then attention)."""
    n_layer = hp.integer("num_hidden_layers")
    if not isinstance(kinds, list):
        raise SpecError(f"config.json: 'layer_types' must be a list, not {kinds!r}")
    if len(kinds) != n_layer:
        raise SpecError(f"config.json: 'layer_types' names {len(kinds)} blocks, not the {n_layer} of num_hidden_layers")
    for kind in kinds:
        if kind not in allowed:
            raise SpecError(
                f"config.json: 'layer_types' has {kind!r}; {arch} block is {allowed[0]!r} or {allowed[1]!r}"
            )
    return kinds


def kinds_from_indices(hp: Params, key: str, allowed: tuple[str, str]) -> list[str]:
    """A hybrid's layer kinds from a config's list of its attention blocks (`key`), checked: allowed[1] (attention)
    at those indices, allowed[0] elsewhere."""
    n_layer, idxs = hp.integer("num_hidden_layers"), hp.get(key)
    if not isinstance(idxs, list) or not all(type(i) is int and 0 <= i < n_layer for i in idxs):
        raise SpecError(f"config.json: {key!r} must list block indices 0..{n_layer - 1}, not {idxs!r}")
    return [allowed[1] if i in idxs else allowed[0] for i in range(n_layer)]


# ---------- tensors, as llama.cpp's loader takes them for each architecture ----------


def tensor_list(arch: MODEL_ARCH, dims: Dims) -> tuple[TensorSpec, ...]:
    d, v = dims.d_model, dims.n_vocab
    out = [tensor_spec(arch, MODEL_TENSOR.TOKEN_EMBD, (d, v))]
    for bid in range(dims.n_layer):
        out += _block(arch, dims, bid)
    out.append(tensor_spec(arch, MODEL_TENSOR.OUTPUT_NORM, (d,)))
    if arch == MODEL_ARCH.STARCODER2:  # LayerNorm: a bias beside every norm's weight
        out.append(tensor_spec(arch, MODEL_TENSOR.OUTPUT_NORM, (d,), suffix="bias"))
    if not dims.tied:
        out.append(tensor_spec(arch, MODEL_TENSOR.OUTPUT, (d, v)))
    return tuple(out)


def _block(arch: MODEL_ARCH, dims: Dims, bid: int) -> list[TensorSpec]:
    if arch == MODEL_ARCH.STARCODER2:
        return _starcoder2_block(dims, bid)
    if arch == MODEL_ARCH.GPT_OSS:
        return _gptoss_block(dims, bid)
    if dims.mla is not None:
        return _mla_block(arch, dims, dims.mla, bid)
    d, hd = dims.d_model, dims.head_dim
    q, kv = dims.n_head * hd, dims.n_head_kv * hd
    gemma, T = arch in (MODEL_ARCH.GEMMA2, MODEL_ARCH.GEMMA3), MODEL_TENSOR
    olmo2 = arch == MODEL_ARCH.OLMO2  # norms after attention and the feed-forward only, none before them
    post_norms = gemma or olmo2
    parts: list[tuple[MODEL_TENSOR, tuple[int, ...], str]] = [] if olmo2 else [(T.ATTN_NORM, (d,), "weight")]
    if arch == MODEL_ARCH.PHI3:
        parts.append((T.ATTN_QKV, (d, q + 2 * kv), "weight"))
    else:
        parts += [(T.ATTN_Q, (d, q), "weight"), (T.ATTN_K, (d, kv), "weight"), (T.ATTN_V, (d, kv), "weight")]
    if arch in (MODEL_ARCH.QWEN2, MODEL_ARCH.QWEN2MOE):
        parts += [(T.ATTN_Q, (q,), "bias"), (T.ATTN_K, (kv,), "bias"), (T.ATTN_V, (kv,), "bias")]
    if arch in (MODEL_ARCH.QWEN3, MODEL_ARCH.QWEN3MOE, MODEL_ARCH.GEMMA3):
        parts += [(T.ATTN_Q_NORM, (hd,), "weight"), (T.ATTN_K_NORM, (hd,), "weight")]
    if arch in (MODEL_ARCH.OLMO2, MODEL_ARCH.OLMOE):  # q and k normed over all their heads at once
        parts += [(T.ATTN_Q_NORM, (q,), "weight"), (T.ATTN_K_NORM, (kv,), "weight")]
    parts.append((T.ATTN_OUT, (q, d), "weight"))
    if post_norms:
        parts.append((T.ATTN_POST_NORM, (d,), "weight"))
    if not olmo2:
        parts.append((T.FFN_PRE_NORM if gemma else T.FFN_NORM, (d,), "weight"))  # one name, two roles in gguf
    parts += _ffn(arch, dims)
    if post_norms:
        parts.append((T.FFN_POST_NORM, (d,), "weight"))
    return [tensor_spec(arch, kind, shape, bid, suffix) for kind, shape, suffix in parts]


def _starcoder2_block(dims: Dims, bid: int) -> list[TensorSpec]:
    """LayerNorms (weight and bias) before attention and the feed-forward, q/k/v/output with biases, and a
    non-gated feed-forward (up, down) with biases."""
    d, ff, T = dims.d_model, dims.n_ff, MODEL_TENSOR
    q, kv = dims.n_head * dims.head_dim, dims.n_head_kv * dims.head_dim
    parts: list[tuple[MODEL_TENSOR, tuple[int, ...], str]] = [
        (T.ATTN_NORM, (d,), "weight"),
        (T.ATTN_NORM, (d,), "bias"),
    ]
    for kind, width in ((T.ATTN_Q, q), (T.ATTN_K, kv), (T.ATTN_V, kv)):
        parts += [(kind, (d, width), "weight"), (kind, (width,), "bias")]
    parts += [(T.ATTN_OUT, (q, d), "weight"), (T.ATTN_OUT, (d,), "bias")]
    parts += [(T.FFN_NORM, (d,), "weight"), (T.FFN_NORM, (d,), "bias")]
    parts += [(T.FFN_UP, (d, ff), "weight"), (T.FFN_UP, (ff,), "bias")]
    parts += [(T.FFN_DOWN, (ff, d), "weight"), (T.FFN_DOWN, (d,), "bias")]
    return [tensor_spec(MODEL_ARCH.STARCODER2, kind, shape, bid, suffix) for kind, shape, suffix in parts]


def _gptoss_block(dims: Dims, bid: int) -> list[TensorSpec]:
    """RMS norms before attention and before the experts (the second named post_attention_norm), q/k/v/output
    with biases, one sink logit per head, a router with a bias and merged experts (gate, up, down) with biases."""
    d, T, e, fe = dims.d_model, MODEL_TENSOR, dims.n_expert, dims.n_ff_exp
    q, kv = dims.n_head * dims.head_dim, dims.n_head_kv * dims.head_dim
    attention: list[tuple[MODEL_TENSOR, tuple[int, ...]]] = [(T.ATTN_Q, (d, q)), (T.ATTN_K, (d, kv))]
    attention += [(T.ATTN_V, (d, kv)), (T.ATTN_OUT, (q, d))]
    experts: list[tuple[MODEL_TENSOR, tuple[int, ...]]] = [(T.FFN_GATE_INP, (d, e)), (T.FFN_GATE_EXP, (d, fe, e))]
    experts += [(T.FFN_UP_EXP, (d, fe, e)), (T.FFN_DOWN_EXP, (fe, d, e))]
    parts: list[tuple[MODEL_TENSOR, tuple[int, ...], str]] = [(T.ATTN_NORM, (d,), "weight")]
    for kind, shape in attention:
        parts += [(kind, shape, "weight"), (kind, shape[1:], "bias")]
    parts += [(T.ATTN_SINKS, (dims.n_head,), "weight"), (T.ATTN_POST_NORM, (d,), "weight")]
    for kind, shape in experts:  # a bias as wide as its matrix's output; the experts' one per expert
        parts += [(kind, shape, "weight"), (kind, shape[1:], "bias")]
    return [tensor_spec(MODEL_ARCH.GPT_OSS, kind, shape, bid, suffix) for kind, shape, suffix in parts]


def _mla_block(arch: MODEL_ARCH, dims: Dims, mla: Mla, bid: int) -> list[TensorSpec]:
    """DeepSeek-V2's block as llama.cpp loads it: q (directly, or through its latent and that latent's norm); the
    key-value latent with the shared rope key (kv_a_mqa) and the latent's norm; kv_b as the converter splits it for
    MLA, attn_k_b (per head: no-rope key x latent) and attn_v_b (per head: latent x value); the output; then a dense
    feed-forward in the leading blocks, after them a router, the routed experts merged and the shared experts as one."""
    d, n_head, T = dims.d_model, dims.n_head, MODEL_TENSOR
    q_width = n_head * (mla.qk_nope + mla.qk_rope)
    parts: list[tuple[MODEL_TENSOR, tuple[int, ...]]] = [(T.ATTN_NORM, (d,))]
    if mla.q_lora_rank:
        parts += [(T.ATTN_Q_A_NORM, (mla.q_lora_rank,)), (T.ATTN_Q_A, (d, mla.q_lora_rank))]
        parts.append((T.ATTN_Q_B, (mla.q_lora_rank, q_width)))
    else:
        parts.append((T.ATTN_Q, (d, q_width)))
    parts += [(T.ATTN_KV_A_NORM, (mla.kv_lora_rank,)), (T.ATTN_KV_A_MQA, (d, mla.kv_lora_rank + mla.qk_rope))]
    parts += [
        (T.ATTN_K_B, (mla.qk_nope, mla.kv_lora_rank, n_head)),
        (T.ATTN_V_B, (mla.kv_lora_rank, mla.v_head, n_head)),
    ]
    parts += [(T.ATTN_OUT, (n_head * mla.v_head, d)), (T.FFN_NORM, (d,))]
    if bid < dims.n_dense_lead:
        parts += [(T.FFN_GATE, (d, dims.n_ff)), (T.FFN_UP, (d, dims.n_ff)), (T.FFN_DOWN, (dims.n_ff, d))]
    else:
        e, fe, fs = dims.n_expert, dims.n_ff_exp, dims.n_ff_shexp
        parts += [(T.FFN_GATE_INP, (d, e)), (T.FFN_GATE_EXP, (d, fe, e)), (T.FFN_UP_EXP, (d, fe, e))]
        parts += [(T.FFN_DOWN_EXP, (fe, d, e)), (T.FFN_GATE_SHEXP, (d, fs)), (T.FFN_UP_SHEXP, (d, fs))]
        parts.append((T.FFN_DOWN_SHEXP, (fs, d)))
    return [tensor_spec(arch, kind, shape, bid) for kind, shape in parts]


def _ffn(arch: MODEL_ARCH, dims: Dims) -> list[tuple[MODEL_TENSOR, tuple[int, ...], str]]:
    d, ff, T = dims.d_model, dims.n_ff, MODEL_TENSOR
    if dims.n_expert:
        e, fe = dims.n_expert, dims.n_ff_exp
        routed = [
            (T.FFN_GATE_INP, (d, e), "weight"),
            (T.FFN_GATE_EXP, (d, fe, e), "weight"),
            (T.FFN_UP_EXP, (d, fe, e), "weight"),
            (T.FFN_DOWN_EXP, (fe, d, e), "weight"),
        ]
        if not dims.n_ff_shexp:
            return routed
        # the shared expert; its gate is (1, d) in the checkpoint and the converter keeps both dims
        fs = dims.n_ff_shexp
        return routed + [
            (T.FFN_GATE_INP_SHEXP, (d, 1), "weight"),
            (T.FFN_GATE_SHEXP, (d, fs), "weight"),
            (T.FFN_UP_SHEXP, (d, fs), "weight"),
            (T.FFN_DOWN_SHEXP, (fs, d), "weight"),
        ]
    if arch == MODEL_ARCH.PHI3:  # gate and up fused into one matrix of twice the width
        return [(T.FFN_UP, (d, 2 * ff), "weight"), (T.FFN_DOWN, (ff, d), "weight")]
    return [(T.FFN_GATE, (d, ff), "weight"), (T.FFN_UP, (d, ff), "weight"), (T.FFN_DOWN, (ff, d), "weight")]


def tensor_spec(arch: MODEL_ARCH, kind: MODEL_TENSOR, shape: tuple[int, ...], bid: int = 0, suffix: str = "weight"):
    """A tensor as the converter writes it in F16: matrices F16; vectors, biases (gpt-oss's experts' are matrices)
    and the expert routers (the shared expert's gate too) F32."""
    if kind not in MODEL_TENSORS[arch]:  # gguf's table of what each architecture holds
        raise SpecError(f"{MODEL_ARCH_NAMES[arch]} has no {TENSOR_NAMES[kind]} tensor")
    f32 = len(shape) == 1 or suffix != "weight" or kind in (MODEL_TENSOR.FFN_GATE_INP, MODEL_TENSOR.FFN_GATE_INP_SHEXP)
    return TensorSpec(f"{TENSOR_NAMES[kind].format(bid=bid)}.{suffix}", shape, "F32" if f32 else "F16")
