"""GGUF file -> ModelSpec: the shape and byte arithmetic of a model, without loading it.

docs/roofline.md: one decode step reads every weight that takes part in the step.
The input embedding is a row gather unless the output head is tied to it (no
`output.weight`), in which case the head reads it whole; for MoE only the experts used
count. KV bytes per token are for an f16 cache unless `with_kv_cache` names other types; with multi-head latent
attention (DeepSeek-V2: key_length_mla and value_length_mla set) llama.cpp caches K alone, the latent and the rope
key (key_length wide), and reads V as a view of it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from gguf import Keys, LlamaFileType

from ondevice.gguf.reader import ArrayRef, GGUFFile, TensorInfo, read_gguf

__all__ = ["ModelSpec", "inspect", "spec_from_gguf", "SWA_PATTERNS", "WINDOW_IGNORED", "MAX_LAYERS"]

KV_CACHE_ELEMENT_BYTES = 2  # f16 K and V cache
# A block_count above this is taken for damage, not a model (per-layer fields would be that long)
MAX_LAYERS = 4096
# Architectures whose sliding-window layers follow a fixed pattern (as llama.cpp sets it):
# layer i uses the window when i % n < n - 1; every n-th layer is global (gpt-oss: its loader's default period,
# which no converter writes; the window on the even layers, as the checkpoints' layer_types have it).
SWA_PATTERNS = {"gemma2": 2, "gemma3": 6, "cohere2": 4, "llama4": 4, "gpt-oss": 2}
# Architectures whose sliding-window key llama.cpp reads and then turns off: every layer attends the whole
# context (its phi3 loader: "Phi SWA is currently disabled"). A test holds this against llama_model_n_swa.
WINDOW_IGNORED = frozenset({"phi3"})
_EMBED = "token_embd.weight"
_HEAD = "output.weight"


@dataclass(frozen=True)
class ModelSpec:
    """What the roofline needs to know about a model. Unknown fields are None."""

    path: str | None  # file path, None for a spec typed in by hand
    name: str | None  # general.name
    arch: str | None  # general.architecture
    quant: str | None  # file type label, e.g. "Q4_K_M"
    n_params: int  # all weight elements in the file
    n_params_active: int  # elements used per token (MoE: only the experts used)
    n_params_matmul: int  # elements in per-token matrix products (prefill FLOPs); excludes the embedding gather
    n_layer: int | None  # transformer blocks
    d_model: int | None  # embedding width
    n_head: int | None  # query heads
    n_head_kv: int | None  # key/value heads (max over layers where it varies)
    head_dim_k: int | None  # key head dimension
    head_dim_v: int | None  # value head dimension
    n_ctx_train: int | None  # trained context length, tokens
    n_vocab: int | None  # vocabulary size
    sliding_window: int | None  # window of sliding-window layers, tokens
    swa_layers: tuple[int, ...]  # indices of sliding-window layers
    n_expert: int  # experts per MoE layer (0 = dense)
    n_expert_used: int  # experts used per token
    tied_output: bool  # output head reads token_embd (no output.weight)
    file_bytes: int  # size of the file (of a split model, of all its files)
    weight_bytes: int  # bytes of all tensor data
    decode_weight_bytes: int  # bytes one decode step reads
    bytes_by_type: dict[str, int]  # tensor type -> bytes, all tensors
    decode_bytes_by_type: dict[str, int]  # tensor type -> bytes one decode step reads
    kv_bytes_per_token_by_layer: tuple[int, ...]  # f16 K+V bytes per cached token, per layer
    n_tensors: int = 0  # tensors in the file
    header_bytes: int = 0  # bytes before the tensor data (metadata + tensor table + alignment)
    padding_bytes: int = 0  # alignment padding between/after tensors
    has_chat_template: bool = False  # tokenizer.chat_template present
    tokenizer_model: str | None = None  # tokenizer.ggml.model
    warnings: tuple[str, ...] = field(default=())  # what could not be worked out
    head_type: str | None = None  # tensor type of the output head (output.weight, or token_embd when tied)
    head_bytes: int = 0  # bytes of the output head, read whole for every token whose logits are kept
    kv_cache_types: tuple[str, str] = ("f16", "f16")  # K and V cache element types kv_bytes_per_token_by_layer counts
    kv_k_only: bool = False  # the cache holds K alone, V a view of it (llama.cpp's multi-head latent attention)
    state_bytes: int = 0  # f32 recurrent state one sequence keeps over the layers without a KV cache, read every step
    decode_rows_by_type: dict[str, int] = field(default_factory=dict)  # tensor type -> rows (output features) of the
    # matrix-vector products one decode step computes in weights of that type (routed experts: the used ones; the head's
    # n_vocab included): each is one dot product with its own set-up, whatever its length

    @property
    def kv_bytes_per_token(self) -> int:
        """f16 K+V bytes that one more token of context adds, all layers."""
        return sum(self.kv_bytes_per_token_by_layer)

    @property
    def attention_layers(self) -> tuple[int, ...]:
        """The layers that attend, each with a KV cache: every layer but a hybrid's recurrent ones (KV heads 0 in
        the header: LFM2's short convolutions hold a small state instead, and no cells of the context)."""
        per_layer = self.kv_bytes_per_token_by_layer
        if len(per_layer) != (self.n_layer or 0):  # the KV cache's size unknown: every layer counts
            return tuple(range(self.n_layer or 0))
        return tuple(i for i, per_token in enumerate(per_layer) if per_token)

    @property
    def bits_per_weight(self) -> float:
        return 8.0 * self.weight_bytes / self.n_params if self.n_params else 0.0

    @property
    def has_weights(self) -> bool:
        return self.n_params > 0

    def kv_read_bytes(self, n_ctx_tokens: int) -> int:
        """KV bytes one decode step reads at a context of n tokens (windowed layers capped)."""
        total = 0
        for layer, per_token in enumerate(self.kv_bytes_per_token_by_layer):
            span = n_ctx_tokens
            if self.sliding_window and layer in self.swa_layers:
                span = min(span, self.sliding_window)
            total += span * per_token
        return total

    def with_kv_cache(self, type_k: str, type_v: str) -> ModelSpec:
        """This spec with a K/V cache of the given element types ("f16", "q8_0", "q4_0", ...):
        KV bytes per token, and so the roofline and the memory verdict, follow them."""
        from ondevice.core.kvtypes import kv_bytes_per_element

        old_k, old_v = (kv_bytes_per_element(t) for t in self.kv_cache_types)
        new_k, new_v = kv_bytes_per_element(type_k), kv_bytes_per_element(type_v)
        dim_k, dim_v = self.head_dim_k or 0, 0 if self.kv_k_only else self.head_dim_v or 0
        if not dim_k + dim_v:
            return replace(self, kv_cache_types=(type_k.lower(), type_v.lower()))
        heads = [b / (dim_k * old_k + dim_v * old_v) for b in self.kv_bytes_per_token_by_layer]  # KV heads per layer
        per_layer = tuple(round(h * (dim_k * new_k + dim_v * new_v)) for h in heads)
        return replace(self, kv_bytes_per_token_by_layer=per_layer, kv_cache_types=(type_k.lower(), type_v.lower()))

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            kv_bytes_per_token=self.kv_bytes_per_token,
            bits_per_weight=round(self.bits_per_weight, 4),
            head_dim=self.head_dim_k,
            swa_layers=list(self.swa_layers),
            kv_bytes_per_token_by_layer=list(self.kv_bytes_per_token_by_layer),
            warnings=list(self.warnings),
            kv_cache_types=list(self.kv_cache_types),
        )
        return d


def inspect(path: str | Path) -> ModelSpec:
    """Read a GGUF file's header and work out its ModelSpec. Raises GGUFFormatError."""
    return spec_from_gguf(read_gguf(path))


def spec_from_gguf(g: GGUFFile) -> ModelSpec:
    arch = g.get(Keys.General.ARCHITECTURE)
    hp = _Hyper(g, arch)
    warnings: list[str] = []
    shape = _shape(g, arch, hp, warnings)
    n_layer, n_head_kv_layers = shape["n_layer"], shape.pop("n_head_kv_layers")
    n_expert = hp.positive_int(Keys.LLM.EXPERT_COUNT) or 0
    n_expert_used = hp.positive_int(Keys.LLM.EXPERT_USED_COUNT) or (0 if not n_expert else n_expert)
    window = hp.positive_int(Keys.Attention.SLIDING_WINDOW)
    swa_layers = _swa_layers(g, arch, n_layer, window)
    names = {t.name for t in g.tensors}
    tied = bool(g.tensors) and _HEAD not in names and _EMBED in names
    n_vocab = _vocab_size(g, hp)
    counts = _count_tensors(g.tensors, tied=tied, n_vocab=n_vocab, n_expert=n_expert, n_expert_used=n_expert_used)
    weight_bytes = sum(t.n_bytes for t in g.tensors)
    head = next((t for t in g.tensors if t.name == (_EMBED if tied else _HEAD)), None)
    return ModelSpec(
        path=str(g.path),
        name=g.get(Keys.General.NAME),
        arch=arch,
        quant=_quant_label(g),
        n_params=counts["n_params"],
        n_params_active=counts["n_params_active"],
        n_params_matmul=counts["n_params_matmul"],
        **shape,
        n_head_kv=max(n_head_kv_layers) if n_head_kv_layers else None,
        n_ctx_train=hp.positive_int(Keys.LLM.CONTEXT_LENGTH),
        n_vocab=n_vocab,
        sliding_window=window if swa_layers else None,
        swa_layers=swa_layers,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        tied_output=tied,
        file_bytes=g.model_file_bytes,
        weight_bytes=weight_bytes,
        decode_weight_bytes=sum(counts["decode_bytes_by_type"].values()),
        bytes_by_type=counts["bytes_by_type"],
        decode_bytes_by_type=counts["decode_bytes_by_type"],
        decode_rows_by_type=counts["decode_rows_by_type"],
        kv_bytes_per_token_by_layer=_kv_by_layer(g, shape, n_head_kv_layers, warnings, k_only=_mla(hp)),
        kv_k_only=_mla(hp),
        state_bytes=_state_bytes(hp, shape["d_model"] or 0, n_layer or 0, n_head_kv_layers),
        n_tensors=len(g.tensors),
        header_bytes=g.header_bytes,
        padding_bytes=g.tensor_data_bytes - weight_bytes,
        has_chat_template=isinstance(g.get(Keys.Tokenizer.CHAT_TEMPLATE), str),
        tokenizer_model=g.get(Keys.Tokenizer.MODEL),
        warnings=tuple(warnings),
        head_type=head.type_name if head is not None else None,
        head_bytes=head.n_bytes if head is not None else 0,
    )


def _shape(g: GGUFFile, arch: str | None, hp: _Hyper, warnings: list[str]) -> dict[str, Any]:
    """Layers, width, heads and head dimensions from the header (None where unknown), and the
    KV heads of every layer (n_head_kv_layers)."""
    n_layer = hp.positive_int(Keys.LLM.BLOCK_COUNT)
    if n_layer and n_layer > MAX_LAYERS:
        warnings.append(
            f"{Keys.LLM.BLOCK_COUNT.format(arch=arch)} {n_layer} is implausible (more than {MAX_LAYERS}); "
            "shape fields unknown"
        )
        n_layer = None
    if arch is None and g.tensors:
        warnings.append(f"no {Keys.General.ARCHITECTURE} key")
    elif g.tensors and hp.positive_int(Keys.LLM.BLOCK_COUNT) is None:
        warnings.append(f"architecture {arch!r}: no {Keys.LLM.BLOCK_COUNT.format(arch=arch)} key; shape fields unknown")
    d_model = hp.positive_int(Keys.LLM.EMBEDDING_LENGTH)
    n_head = hp.int_or_max(Keys.Attention.HEAD_COUNT)
    head_dim_k = hp.positive_int(Keys.Attention.KEY_LENGTH) or (d_model // n_head if d_model and n_head else None)
    return {
        "n_layer": n_layer,
        "d_model": d_model,
        "n_head": n_head,
        "head_dim_k": head_dim_k,
        "head_dim_v": hp.positive_int(Keys.Attention.VALUE_LENGTH) or head_dim_k,
        "n_head_kv_layers": hp.per_layer(Keys.Attention.HEAD_COUNT_KV, n_layer, default=n_head),
    }


def _mla(hp: _Hyper) -> bool:
    """Multi-head latent attention, as llama.cpp's hparams.is_mla(): both MLA head widths set. Its KV cache then has
    no V (llama-kv-cache.cpp: has_v = !is_mla): attention reads V as the first value_length elements of each K row."""
    return bool(hp.positive_int(Keys.Attention.KEY_LENGTH_MLA) and hp.positive_int(Keys.Attention.VALUE_LENGTH_MLA))


def _state_bytes(hp: _Hyper, d_model: int, n_layer: int, n_head_kv_layers: tuple[int, ...]) -> int:
    """f32 bytes of the recurrent state one sequence keeps (llama.cpp's R and S caches, n_embd_r + n_embd_s per
    recurrent layer): a Mamba layer's convolution state, (d_conv - 1) x (d_inner + 2 x groups x d_state), and SSM
    state, d_state x d_inner; LFM2's short convolution's, d_model x (l_cache - 1). The recurrent layers are those with
    no KV heads (a hybrid's), or every layer of a model without attention. 0 for a model with no such state."""
    d_inner, d_state = hp.positive_int(Keys.SSM.INNER_SIZE) or 0, hp.positive_int(Keys.SSM.STATE_SIZE) or 0
    l_cache = hp.positive_int(Keys.ShortConv.L_CACHE) or 0
    if l_cache:
        per_layer = d_model * (l_cache - 1)
    elif d_inner:
        d_conv, groups = hp.positive_int(Keys.SSM.CONV_KERNEL) or 1, hp.positive_int(Keys.SSM.GROUP_COUNT) or 0
        per_layer = (d_conv - 1) * (d_inner + 2 * groups * d_state) + d_state * d_inner
    else:
        return 0
    recurrent = sum(1 for h in n_head_kv_layers if h == 0) if any(n_head_kv_layers) else n_layer
    return 4 * per_layer * recurrent


def _kv_by_layer(
    g: GGUFFile, shape: dict[str, Any], n_head_kv_layers, warnings: list[str], k_only: bool = False
) -> tuple[int, ...]:
    """f16 K+V bytes per cached token, per layer: 2 bytes x KV heads x (key + value head dims; the key's alone where
    the cache holds K only)."""
    dims = (shape["head_dim_k"] or 0) + (0 if k_only else shape["head_dim_v"] or 0)
    if shape["n_layer"] and n_head_kv_layers and shape["head_dim_k"] and shape["head_dim_v"]:
        return tuple(KV_CACHE_ELEMENT_BYTES * h * dims for h in n_head_kv_layers)
    if g.tensors:
        warnings.append("KV-cache size unknown: missing layer/head metadata")
    return ()


class _Hyper:
    """Typed access to `{arch}.*` hyperparameters, by gguf.Keys templates (e.g. Keys.LLM.BLOCK_COUNT)."""

    def __init__(self, g: GGUFFile, arch: str | None):
        self.g, self.arch = g, arch

    def raw(self, key: str) -> Any:
        return self.g.get(key.format(arch=self.arch)) if self.arch else None

    def positive_int(self, key: str) -> int | None:
        v = self.raw(key)
        return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0 else None

    def int_or_max(self, key: str) -> int | None:
        v = self.raw(key)
        if isinstance(v, list) and v and all(isinstance(x, int) for x in v):
            return max(v) or None
        return self.positive_int(key)

    def per_layer(self, key: str, n_layer: int | None, default: int | None) -> tuple[int, ...]:
        """A per-layer value that GGUF stores either as one int or as an array per layer."""
        if not n_layer:
            return ()
        v = self.raw(key)
        if isinstance(v, list) and len(v) == n_layer and all(isinstance(x, int) for x in v):
            return tuple(v)
        value = self.positive_int(key) or default
        return (value,) * n_layer if value else ()


def _swa_layers(g: GGUFFile, arch: str | None, n_layer: int | None, window: int | None) -> tuple[int, ...]:
    if not window or not n_layer or arch in WINDOW_IGNORED:
        return ()
    explicit = g.get(Keys.Attention.SLIDING_WINDOW_PATTERN.format(arch=arch))
    if isinstance(explicit, list) and len(explicit) == n_layer:
        return tuple(i for i, is_swa in enumerate(explicit) if is_swa)
    period = explicit if isinstance(explicit, int) and explicit > 0 else SWA_PATTERNS.get(arch or "", 0)
    if period <= 1:
        return tuple(range(n_layer))
    return tuple(i for i in range(n_layer) if i % period < period - 1)


def _vocab_size(g: GGUFFile, hp: _Hyper) -> int | None:
    tokens = g.get(Keys.Tokenizer.LIST)
    if isinstance(tokens, (ArrayRef, list)):
        return len(tokens)
    return hp.positive_int(Keys.LLM.VOCAB_SIZE)


def _quant_label(g: GGUFFile) -> str | None:
    ftype = g.get(Keys.General.FILE_TYPE)
    if isinstance(ftype, int):
        try:
            name = LlamaFileType(ftype).name
        except ValueError:
            return None
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return None


def _count_tensors(tensors, *, tied: bool, n_vocab: int | None, n_expert: int, n_expert_used: int) -> dict[str, Any]:
    n_params = n_active = n_matmul = 0
    bytes_by_type: dict[str, int] = {}
    decode_by_type: dict[str, int] = {}
    rows_by_type: dict[str, int] = {}
    for t in tensors:
        n = t.n_elements
        bytes_by_type[t.type_name] = bytes_by_type.get(t.type_name, 0) + t.n_bytes
        fraction = _used_fraction(t, n_expert, n_expert_used)
        n_params += n
        n_active += round(n * fraction)
        read = round(t.n_bytes * fraction)
        if t.name == _EMBED and not tied:
            rows = t.shape[-1] if len(t.shape) > 1 else (n_vocab or 1)
            read = t.n_bytes // rows  # one row gathered per token
        elif len(t.shape) >= 2 and not t.name.endswith(".bias"):  # gpt-oss's experts' biases: (width, experts)
            n_matmul += round(n * fraction)
            experts = t.shape[2] if len(t.shape) > 2 else 1
            rows_by_type[t.type_name] = rows_by_type.get(t.type_name, 0) + round(t.shape[1] * experts * fraction)
        decode_by_type[t.type_name] = decode_by_type.get(t.type_name, 0) + read
    return {
        "n_params": n_params,
        "n_params_active": n_active,
        "n_params_matmul": n_matmul,
        "bytes_by_type": dict(sorted(bytes_by_type.items(), key=lambda kv: -kv[1])),
        "decode_bytes_by_type": dict(sorted(decode_by_type.items(), key=lambda kv: -kv[1])),
        "decode_rows_by_type": rows_by_type,
    }


def _used_fraction(t: TensorInfo, n_expert: int, n_expert_used: int) -> float:
    """Share of a tensor one token touches: n_expert_used/n_expert for routed-expert tensors."""
    if n_expert and "_exps" in t.name and t.shape and t.shape[-1] == n_expert:
        return n_expert_used / n_expert
    return 1.0
