"""Small synthetic llama-architecture GGUF models, deterministic by seed.

Used by the tests (tiny models that load and generate through llama.cpp) and by the
kernel-level bandwidth probe (models of a chosen byte size). Weights are random normal
(std `init_std`), norms are ones. The tokenizer is a SentencePiece-style ("llama")
vocabulary with all 256 byte-fallback tokens, so any text tokenizes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

from ondevice.core import paths

__all__ = ["SynthConfig", "build_synthetic_model", "synthetic_vocab", "tensor_shapes"]

_SPACE = "\u2581"  # SentencePiece's word-boundary marker
_WORDS = (
    "the of and to in is was for on that with as by at from it this be are or an "
    "which has had not but were his her they their one all there would can will more "
    "about time people year way day man thing woman life child world school state family "
    "story city tower paris france capital located eiffel hello user assistant you i"
).split()


@dataclass(frozen=True)
class SynthConfig:
    d_model: int = 64  # embedding width
    n_layer: int = 2  # transformer blocks
    n_head: int = 4  # query heads
    n_head_kv: int = 2  # key/value heads (GQA when < n_head)
    d_ff: int = 128  # feed-forward width
    n_ctx_train: int = 512  # trained context length, tokens
    n_vocab: int = 512  # vocabulary size (>= 259: specials + 256 bytes)
    dtype: str = "F16"  # weight type of the matrices: "F32" or "F16"
    tied_output: bool = False  # no output.weight: the head reuses token_embd
    seed: int = 0  # RNG seed: same seed, same bytes
    init_std: float = 0.02  # std of the random weights
    chat_template: str | None = None  # optional tokenizer.chat_template
    name: str = "synthetic-llama"  # general.name
    tokenizer_from: str | None = None  # a GGUF whose tokenizer is copied (tokens, scores, types, special ids and
    # flags): a model that shares its vocabulary (a draft model for it); n_vocab then follows that file

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def validate(self) -> None:
        if self.d_model % self.n_head or self.n_head % self.n_head_kv:
            raise ValueError("d_model must divide by n_head, and n_head by n_head_kv")
        if self.n_vocab < 259:
            raise ValueError("n_vocab must be at least 259 (3 specials + 256 byte tokens)")
        if self.dtype not in ("F32", "F16"):
            raise ValueError(f"dtype must be F32 or F16, not {self.dtype!r}")


def synthetic_vocab(n_vocab: int) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: <unk>, <s>, </s>, 256 byte tokens, then word pieces."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [TokenType.UNKNOWN, TokenType.CONTROL, TokenType.CONTROL] + [TokenType.BYTE] * 256
    pieces: list[str] = []
    seen = set(tokens)
    singles = (
        [_SPACE] + [chr(c) for c in range(ord("a"), ord("z") + 1)] + list(".,!?:'\n") + [str(d) for d in range(10)]
    )
    candidates = singles + [_SPACE + w[: i + 1] for w in _WORDS for i in range(len(w))]
    candidates += [w[: i + 1] for w in _WORDS for i in range(1, len(w))]
    for piece in candidates:
        if piece not in seen:
            seen.add(piece)
            pieces.append(piece)
    i = 0
    while len(tokens) + len(pieces) < n_vocab:
        pieces.append(f"<extra_{i}>")
        i += 1
    pieces = pieces[: n_vocab - len(tokens)]
    tokens += pieces
    types += [TokenType.UNUSED if p.startswith("<extra_") else TokenType.NORMAL for p in pieces]
    # Longer pieces score higher so the SPM merge prefers them.
    scores = [0.0] * 259 + [float(len(p)) for p in pieces]
    return tokens, scores, [int(t) for t in types]


def tensor_shapes(cfg: SynthConfig) -> list[tuple[str, tuple[int, ...]]]:
    """(name, numpy shape) of every tensor, in file order. numpy order: (rows, row length)."""
    d, hd = cfg.d_model, cfg.head_dim
    shapes: list[tuple[str, tuple[int, ...]]] = [("token_embd.weight", (cfg.n_vocab, d))]
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        shapes += [
            (p + "attn_norm.weight", (d,)),
            (p + "attn_q.weight", (cfg.n_head * hd, d)),
            (p + "attn_k.weight", (cfg.n_head_kv * hd, d)),
            (p + "attn_v.weight", (cfg.n_head_kv * hd, d)),
            (p + "attn_output.weight", (d, cfg.n_head * hd)),
            (p + "ffn_norm.weight", (d,)),
            (p + "ffn_gate.weight", (cfg.d_ff, d)),
            (p + "ffn_up.weight", (cfg.d_ff, d)),
            (p + "ffn_down.weight", (d, cfg.d_ff)),
        ]
    shapes.append(("output_norm.weight", (d,)))
    if not cfg.tied_output:
        shapes.append(("output.weight", (cfg.n_vocab, d)))
    return shapes


def build_synthetic_model(cfg: SynthConfig, path: str | Path) -> Path:
    """Write a GGUF for `cfg` to `path` (atomically). Same config and seed, same bytes."""
    tokenizer = _read_tokenizer(cfg.tokenizer_from) if cfg.tokenizer_from else None
    if tokenizer is not None:
        cfg = replace(cfg, n_vocab=len(tokenizer["tokenizer.ggml.tokens"]))
    cfg.validate()
    path = Path(path)
    matrix_dtype = np.float16 if cfg.dtype == "F16" else np.float32
    shapes = tensor_shapes(cfg)
    with paths.atomic_path(path) as tmp:
        writer = GGUFWriter(path=tmp, arch="llama")
        _add_metadata(writer, cfg, tokenizer)
        for name, shape in shapes:
            dtype = np.float32 if len(shape) == 1 else matrix_dtype
            raw = GGMLQuantizationType.F32 if dtype == np.float32 else GGMLQuantizationType.F16
            nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
            writer.add_tensor_info(name, shape, np.dtype(dtype), nbytes, raw_dtype=raw)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        rng = np.random.default_rng(cfg.seed)
        for _name, shape in shapes:
            if len(shape) == 1:
                data = np.ones(shape, dtype=np.float32)
            else:
                data = (rng.standard_normal(shape, dtype=np.float32) * cfg.init_std).astype(matrix_dtype)
            writer.write_tensor_data(data)
        writer.close()
    return path


_SPECIAL_IDS = (
    "bos",
    "eos",
    "unknown",
    "padding",
    "seperator",
)  # tokenizer.ggml.<name>_token_id keys (gguf's spelling)
_FLAGS = ("add_bos_token", "add_eos_token", "add_sep_token", "add_space_prefix")


def _read_tokenizer(path: str) -> dict:
    """The tokenizer fields of a GGUF (tokenizer.* keys -> values), chat template excluded."""
    from ondevice.gguf.reader import ArrayRef, read_gguf

    g = read_gguf(path)
    out = {}
    for key, value in g.metadata.items():
        if key.startswith("tokenizer.") and key != "tokenizer.chat_template":
            value = g.read_array(value) if isinstance(value, ArrayRef) else value
            out[key] = value.tolist() if hasattr(value, "tolist") else value
    return out


def _add_tokenizer(writer: GGUFWriter, tok: dict) -> None:
    writer.add_tokenizer_model(tok["tokenizer.ggml.model"])
    if "tokenizer.ggml.pre" in tok:
        writer.add_tokenizer_pre(tok["tokenizer.ggml.pre"])
    writer.add_token_list(tok["tokenizer.ggml.tokens"])
    if "tokenizer.ggml.scores" in tok:
        writer.add_token_scores(tok["tokenizer.ggml.scores"])
    if "tokenizer.ggml.token_type" in tok:
        writer.add_token_types(tok["tokenizer.ggml.token_type"])
    if "tokenizer.ggml.merges" in tok:
        writer.add_token_merges(tok["tokenizer.ggml.merges"])
    for name in _SPECIAL_IDS:
        key = f"tokenizer.ggml.{name}_token_id"
        if key in tok:
            writer.add_uint32(key, int(tok[key]))
    for name in _FLAGS:
        key = f"tokenizer.ggml.{name}"
        if key in tok:
            writer.add_bool(key, bool(tok[key]))


def _add_metadata(writer: GGUFWriter, cfg: SynthConfig, tokenizer: dict | None = None) -> None:
    writer.add_name(cfg.name)
    writer.add_context_length(cfg.n_ctx_train)
    writer.add_embedding_length(cfg.d_model)
    writer.add_block_count(cfg.n_layer)
    writer.add_feed_forward_length(cfg.d_ff)
    writer.add_head_count(cfg.n_head)
    writer.add_head_count_kv(cfg.n_head_kv)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(cfg.head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(cfg.n_vocab)
    writer.add_file_type(LlamaFileType.MOSTLY_F16 if cfg.dtype == "F16" else LlamaFileType.ALL_F32)
    if cfg.chat_template:
        writer.add_chat_template(cfg.chat_template)
    if tokenizer is not None:
        _add_tokenizer(writer, tokenizer)
        return
    tokens, scores, types = synthetic_vocab(cfg.n_vocab)
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_unk_token_id(0)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(False)  # text round-trips exactly through tokenize/detokenize
