"""A ModelSpec typed in by hand (a model not downloaded): `ondevice predict --params 8e9 --quant Q4_K_M ...`.

Bits per weight come from gguf.GGML_QUANT_SIZES. A file type that mixes tensor types is
approximated by the share of the block weights each type gets in llama.cpp's quantizer
(llama_tensor_get_type) for a llama-shaped block, where attn_v is ~2% of a block's
weights, attn_output ~7% and ffn_down ~27%; "use_more_bits" layers are about half of
them. The output head gets its own type (Q6_K for the K-quants and Q4_0/Q5_x; Q8_0 and
floats keep theirs). With --vocab and --d-model the embedding is known: it is a row gather
in decode (unless --tied), and the head is read whole. Without them every weight is
counted as read each step, at the block mix (slightly pessimistic).

Check against a real file: Llama 3.1 8B Q4_K_M (--params 8.03e9 --quant Q4_K_M --vocab 128256
--d-model 4096) comes to 4.91 GB; the file holds 4.92 GB of tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from ondevice.core.errors import SpecError
from ondevice.gguf.spec import KV_CACHE_ELEMENT_BYTES, ModelSpec
from ondevice.roofline.model import bits_per_weight

__all__ = ["QUANT_MIXES", "mix_for", "mix_bits_per_weight", "spec_from_flags", "positive_number", "parameter_count"]

_V, _O, _D = 0.02, 0.07, 0.27  # shares of a llama block: attn_v, attn_output, ffn_down
_QK = 0.10  # ... attn_q and attn_k together
_HALF = 0.5  # share of layers llama.cpp's use_more_bits() upgrades
_EIGHTH = 0.125  # share of layers (the first) whose ffn_down the lowest-bit types keep at more bits

# file type -> ({tensor type: share of block weights}, head type). Shares sum to 1. Each is what llama.cpp's quantizer
# gives a llama block (its dry run on Llama 3.1 8B's header: tests/test_quant_mixes.py holds every one to it).
QUANT_MIXES: dict[str, tuple[dict[str, float], str]] = {
    "F32": ({"F32": 1.0}, "F32"),
    "F16": ({"F16": 1.0}, "F16"),
    "BF16": ({"BF16": 1.0}, "BF16"),
    "Q8_0": ({"Q8_0": 1.0}, "Q8_0"),
    "Q4_0": ({"Q4_0": 1.0}, "Q6_K"),
    "Q4_1": ({"Q4_1": 1.0}, "Q6_K"),
    "Q5_0": ({"Q5_0": 1.0}, "Q6_K"),
    "Q5_1": ({"Q5_1": 1.0}, "Q6_K"),
    "Q2_K": ({"Q2_K": 1 - _V - _O - _D, "Q3_K": _O + _D, "Q4_K": _V}, "Q6_K"),
    "Q2_K_S": ({"Q2_K": 1 - _V - _D * _EIGHTH, "Q4_K": _V + _D * _EIGHTH}, "Q6_K"),
    "Q3_K_S": ({"Q3_K": 1.0}, "Q6_K"),
    "Q3_K_M": ({"Q3_K": 1 - _V - _O - _D, "Q4_K": _O + _D, "Q5_K": _V}, "Q6_K"),
    "Q3_K_L": ({"Q3_K": 1 - _V - _O - _D, "Q5_K": _V + _O + _D}, "Q6_K"),
    "Q4_K_S": ({"Q4_K": 1 - (_V + _D) * _HALF / 2, "Q5_K": (_V + _D) * _HALF / 2}, "Q6_K"),
    "Q4_K_M": ({"Q4_K": 1 - (_V + _D) * _HALF, "Q6_K": (_V + _D) * _HALF}, "Q6_K"),
    "Q5_K_S": ({"Q5_K": 1.0}, "Q6_K"),
    "Q5_K_M": ({"Q5_K": 1 - (_V + _D) * _HALF, "Q6_K": (_V + _D) * _HALF}, "Q6_K"),
    "Q6_K": ({"Q6_K": 1.0}, "Q6_K"),
    "IQ4_NL": ({"IQ4_NL": 1.0}, "Q6_K"),
    "IQ4_XS": ({"IQ4_XS": 1.0}, "Q6_K"),
    "MXFP4_MOE": ({"MXFP4": 1.0}, "Q8_0"),  # a mixture of experts' (its experts MXFP4; a dense block gets Q8_0)
    "IQ3_XXS": (
        {
            "IQ3_XXS": 1 - _V - _O - _D - _QK,
            "Q3_K": _D * (1 - _EIGHTH),
            "IQ2_S": _QK,
            "IQ3_S": _O,
            "Q4_K": _V + _D * _EIGHTH,
        },
        "Q5_K",
    ),
    "IQ3_XS": ({"IQ3_XXS": (1 - _V) / 2, "IQ3_S": (1 - _V) / 2, "Q4_K": _V}, "Q6_K"),
    "IQ3_S": ({"IQ3_S": 1 - _V, "Q4_K": _V}, "Q6_K"),
    "IQ3_M": ({"IQ3_S": 1 - _V - _O - _D * _EIGHTH, "Q4_K": _V + _O + _D * _EIGHTH}, "Q6_K"),
    "IQ2_XXS": ({"IQ2_XXS": 1 - _V - _D * _EIGHTH, "Q2_K": _D * _EIGHTH, "Q4_K": _V}, "Q5_K"),
    "IQ2_XS": ({"IQ2_XS": 1 - _V - _D * _EIGHTH, "Q2_K": _D * _EIGHTH, "Q4_K": _V}, "Q5_K"),
    "IQ2_S": ({"IQ2_XS": 1 - _V - _O - _D * _EIGHTH, "IQ3_S": _O + _D * _EIGHTH, "Q4_K": _V}, "Q5_K"),
    "IQ2_M": ({"IQ2_S": 1 - _V - _O - _D * _EIGHTH, "IQ3_S": _O + _D * _EIGHTH, "Q4_K": _V}, "Q5_K"),
    "IQ1_S": ({"IQ1_S": 1 - _V - _O - _D * _EIGHTH, "IQ2_XXS": _O, "Q2_K": _D * _EIGHTH, "Q4_K": _V}, "Q5_K"),
    "IQ1_M": ({"IQ1_M": 1 - _V - _O - _D * _EIGHTH, "IQ2_XXS": _O, "Q2_K": _D * _EIGHTH, "Q4_K": _V}, "Q5_K"),
    "TQ1_0": ({"TQ1_0": 1.0}, "Q6_K"),
    "TQ2_0": ({"TQ2_0": 1.0}, "Q6_K"),
    "Q1_0": ({"Q1_0": 1.0}, "Q6_K"),
}


def mix_for(quant: str) -> tuple[dict[str, float], str]:
    """({type: share of block weights}, head type) for a file-type name (case-insensitive)."""
    key = str(quant).strip().upper()
    if key in QUANT_MIXES:
        return QUANT_MIXES[key]
    try:  # a plain tensor type used for every weight
        bits_per_weight(key)
    except KeyError:
        raise SpecError(f"unknown quant {quant!r}; known: {', '.join(QUANT_MIXES)}") from None
    return {key: 1.0}, key


def mix_bits_per_weight(mix: Mapping[str, float]) -> float:
    return sum(share * bits_per_weight(t) for t, share in mix.items())


# Upper bounds for the spec numbers: far above any published model, low enough that the
# per-layer and per-token arrays the estimate builds stay small (an unbounded --layers
# allocated gigabytes)
SPEC_INT_LIMITS = {
    "--layers": 10_000,
    "--kv-heads": 100_000,
    "--head-dim": 100_000,
    "--d-model": 1_000_000,
    "--vocab": 100_000_000,
    "--heads": 100_000,
    "--ctx-train": 1 << 30,
}


def spec_from_flags(
    *,
    params: float | None,
    quant: str | None,
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    d_model: int | None = None,
    vocab: int | None = None,
    heads: int | None = None,
    ctx_train: int | None = None,
    tied: bool = False,
    active_params: float | None = None,
    name: str | None = None,
) -> ModelSpec:
    """A ModelSpec from numbers. Raises SpecError naming a missing or invalid field."""
    if params is None or quant is None or layers is None or kv_heads is None or head_dim is None:
        missing = [
            f
            for f, v in (
                ("--params", params),
                ("--quant", quant),
                ("--layers", layers),
                ("--kv-heads", kv_heads),
                ("--head-dim", head_dim),
            )
            if v is None
        ]
        raise SpecError(f"a spec needs {', '.join(missing)} (with --params, --quant, --layers, --kv-heads, --head-dim)")
    n_params = positive_number("--params", params)
    n_active = positive_number("--active-params", active_params) if active_params is not None else n_params
    if n_active > n_params:
        raise SpecError(f"--active-params ({n_active:g}) exceeds --params ({n_params:g})")
    for flag, v in (
        ("--layers", layers),
        ("--kv-heads", kv_heads),
        ("--head-dim", head_dim),
        ("--d-model", d_model),
        ("--vocab", vocab),
        ("--heads", heads),
        ("--ctx-train", ctx_train),
    ):
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or not 0 < v <= SPEC_INT_LIMITS[flag]):
            raise SpecError(f"{flag} must be a positive integer (at most {SPEC_INT_LIMITS[flag]}), not {v!r}")
    mix, head_type = mix_for(quant)
    embed = vocab * d_model if vocab and d_model else 0
    if 2 * embed >= n_params and not tied:
        raise SpecError(f"--vocab x --d-model ({embed:g}) leaves no block weights in --params ({n_params:g})")
    heads_elems = 0 if tied else embed  # output.weight elements
    block = n_params - embed - heads_elems
    active_block = block - (n_params - n_active)
    by_type: dict[str, float] = {}
    decode: dict[str, float] = {}
    for t, share in mix.items():
        _add(by_type, t, block * share * bits_per_weight(t) / 8)
        _add(decode, t, active_block * share * bits_per_weight(t) / 8)
    if vocab and d_model:  # the embedding is known (embed > 0)
        embed_type = head_type if tied else next(iter(mix))
        _add(by_type, embed_type, embed * bits_per_weight(embed_type) / 8)
        _add(decode, embed_type, (embed if tied else d_model) * bits_per_weight(embed_type) / 8)
        if not tied:
            _add(by_type, head_type, embed * bits_per_weight(head_type) / 8)
            _add(decode, head_type, embed * bits_per_weight(head_type) / 8)
    bytes_by_type = {t: int(round(b)) for t, b in sorted(by_type.items(), key=lambda kv: -kv[1])}
    decode_by_type = {t: int(round(b)) for t, b in sorted(decode.items(), key=lambda kv: -kv[1])}
    weight_bytes = sum(bytes_by_type.values())
    return ModelSpec(
        path=None,
        name=name or f"{n_params / 1e9:g}B {quant}",
        arch=None,
        quant=str(quant).upper(),
        n_params=int(n_params),
        n_params_active=int(n_active),
        n_params_matmul=int(n_active - (embed if not tied else 0)),
        n_layer=layers,
        d_model=d_model,
        n_head=heads,
        n_head_kv=kv_heads,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_ctx_train=ctx_train,
        n_vocab=vocab,
        sliding_window=None,
        swa_layers=(),
        n_expert=0,
        n_expert_used=0,
        tied_output=tied,
        file_bytes=weight_bytes,
        weight_bytes=weight_bytes,
        decode_weight_bytes=sum(decode_by_type.values()),
        bytes_by_type=bytes_by_type,
        decode_bytes_by_type=decode_by_type,
        kv_bytes_per_token_by_layer=(2 * KV_CACHE_ELEMENT_BYTES * kv_heads * head_dim,) * layers,
        warnings=()
        if embed
        else ("embedding size unknown (no --vocab/--d-model): every weight counted as read per step",),
        head_type=head_type if embed else None,
        head_bytes=int(round(embed * bits_per_weight(head_type) / 8)) if embed else 0,
    )


def positive_number(
    what: str, v, error: type[Exception] = SpecError, unit: str = "", most: float | None = None
) -> float:
    """float(v) when it is a finite number above zero (and at most `most`); else `error` naming `what` (and its
    unit)."""
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise error(f"{what} must be a number{f' of {unit}' if unit else ''}, not {v!r}") from None
    if not math.isfinite(x) or x <= 0:
        raise error(f"{what} must be positive{f' ({unit})' if unit else ''}, not {v!r}")
    if most is not None and x > most:
        raise error(f"{what} of {x:g}{f' {unit}' if unit else ''} is beyond any machine (at most {most:g})")
    return x


_SCALE = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parameter_count(text) -> float:
    """'8B', '1.5b', '500M', '8.03e9', '8000000000' -> parameters; SpecError otherwise."""
    t = str(text).strip().upper()
    scale = _SCALE.get(t[-1:], 1.0) if t else 1.0
    number = t[:-1] if t[-1:] in _SCALE else t
    try:
        return positive_number("--params", float(number) * scale)
    except (ValueError, SpecError):
        raise SpecError(f"--params takes a count such as 8B, 1.5B, 500M or 8.03e9, not {text!r}") from None


def _add(d: dict[str, float], key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + value
