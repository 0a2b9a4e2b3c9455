"""A Llama config.json for a model given by its numbers (`ondevice predict --params 8B --d-model 4096 ...`), which
ondevice.quant.hfconfig turns into a header like any published config."""

from __future__ import annotations

from typing import Any

from ondevice.core.errors import SpecError

__all__ = ["llama_config"]


def llama_config(
    *,
    params: float,
    layers: int,
    d_model: int,
    vocab: int,
    kv_heads: int,
    head_dim: int,
    heads: int | None = None,
    ctx_train: int | None = None,
    tied: bool = False,
) -> dict[str, Any]:
    """A Llama config.json for a model given by its numbers (`ondevice predict --params 8B --d-model 4096 ...`):
    the feed-forward width is what the parameter count leaves per block after attention and norms (rounded
    to 256, as the published shapes are). SpecError when the numbers leave no room for one."""
    heads = heads or d_model // head_dim
    embed = vocab * d_model * (1 if tied else 2)
    attention = d_model * heads * head_dim * 2 + d_model * kv_heads * head_dim * 2
    per_block = (params - embed - d_model) / layers - attention - 2 * d_model
    d_ff = int(round(per_block / (3 * d_model) / 256)) * 256
    if d_ff <= 0:
        raise SpecError(f"--params {params:g} leaves no feed-forward weights for {layers} blocks of width {d_model}")
    return {
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": d_model,
        "intermediate_size": d_ff,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": ctx_train or 8192,
        "rms_norm_eps": 1e-5,
        "rope_theta": 500000.0,
        "tie_word_embeddings": tied,
    }
