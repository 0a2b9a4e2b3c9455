"""Semantic checks run before llama.cpp opens a file.

ondevice.gguf.reader.read_gguf guarantees the header is well-formed; this guarantees the
hyperparameters agree with the tensors, so that nonsense metadata (a layer count with no
layers behind it, a zero head count, token ids beyond the vocabulary) is refused with a
typed error instead of reaching llama.cpp's C++ code; what llama.cpp asserts rather than
checks (an abort, not an error) is checked in ondevice.gguf.loadcheck_asserts.
"""

from __future__ import annotations

from gguf import GGUFValueType, Keys

from ondevice.core.errors import GGUFFormatError
from ondevice.gguf.loadcheck_asserts import check_hparams, check_layout
from ondevice.gguf.reader import ArrayRef, GGUFFile
from ondevice.gguf.spec import ModelSpec, spec_from_gguf

__all__ = ["check_loadable", "inspect_for_load"]

_TOKEN_ID_KEYS = (
    ("bos", Keys.Tokenizer.BOS_ID),
    ("eos", Keys.Tokenizer.EOS_ID),
    ("unknown", Keys.Tokenizer.UNK_ID),
    ("padding", Keys.Tokenizer.PAD_ID),
    ("eot", Keys.Tokenizer.EOT_ID),
    ("sep", Keys.Tokenizer.SEP_ID),
)


def inspect_for_load(path) -> ModelSpec:
    """read_gguf + spec + check_loadable: what the engine runs before llama.cpp sees the file."""
    from ondevice.gguf.reader import read_gguf

    g = read_gguf(path)
    spec = spec_from_gguf(g)
    check_loadable(g, spec)
    return spec


def check_loadable(g: GGUFFile, spec: ModelSpec) -> None:
    where = str(g.path)
    if not g.tensors:
        raise GGUFFormatError(f"{where}: holds no weights (vocab-only GGUF); nothing to load")
    for part in g.files:  # each file of a split model laid out on its own
        check_layout(part, str(part.path))
    if not spec.arch:
        raise GGUFFormatError(f"{where}: no {Keys.General.ARCHITECTURE}; cannot load")
    check_hparams(g, spec.arch, where)
    n_layer, d_model, n_head, n_head_kv, n_vocab = (
        _required_size(spec, key, where) for key in ("n_layer", "d_model", "n_head", "n_head_kv", "n_vocab")
    )
    if n_head % n_head_kv:
        raise GGUFFormatError(f"{where}: head count {n_head} is not a multiple of KV head count {n_head_kv}")
    if spec.n_ctx_train is None or spec.n_ctx_train <= 0:
        raise GGUFFormatError(f"{where}: implausible context {spec.n_ctx_train}")
    by_name = {t.name: t for t in g.tensors}
    layers = {int(n.split(".")[1]) for n in by_name if n.startswith("blk.") and n.split(".")[1].isdigit()}
    if layers != set(range(n_layer)):
        raise GGUFFormatError(f"{where}: metadata says {n_layer} layers but the file has tensors for {len(layers)}")
    embd = by_name.get("token_embd.weight")
    if embd is None or len(embd.shape) != 2:
        raise GGUFFormatError(f"{where}: no 2-D token_embd.weight tensor")
    if embd.shape[0] != d_model or embd.shape[1] != n_vocab:
        raise GGUFFormatError(
            f"{where}: token_embd.weight is {embd.shape[0]}x{embd.shape[1]} but metadata says "
            f"d_model {d_model} and vocabulary {n_vocab}"
        )
    q = by_name.get("blk.0.attn_q.weight")
    # multi-head latent attention: key_length is the cache's width (the latent and the rope key), q's heads are
    # key_length_mla wide (llama.cpp's n_embd_head_k_mla)
    head_dim_q = g.get(Keys.Attention.KEY_LENGTH_MLA.format(arch=spec.arch)) if spec.kv_k_only else spec.head_dim_k
    if q is not None and head_dim_q and q.shape[-1] != n_head * head_dim_q:
        raise GGUFFormatError(
            f"{where}: blk.0.attn_q.weight has {q.shape[-1]} outputs, expected n_head x head_dim = "
            f"{n_head * head_dim_q}"
        )
    _check_vocab(g, where)
    for name, key in _TOKEN_ID_KEYS:
        token = g.get(key)
        if isinstance(token, int) and not 0 <= token < n_vocab:
            raise GGUFFormatError(f"{where}: {name} token id {token} is outside the vocabulary of {n_vocab}")


def _required_size(spec: ModelSpec, key: str, where: str) -> int:
    """A size the loader cannot do without (layers, heads, vocabulary...): a positive int, else GGUFFormatError."""
    value = getattr(spec, key)
    if not isinstance(value, int) or value <= 0:
        raise GGUFFormatError(
            f"{where}: missing, zero or implausible {key} for architecture {spec.arch!r}; cannot load"
        )
    return value


def _check_token_text(g: GGUFFile, tokens: list[str], where: str) -> None:
    """What llama.cpp's vocabulary loader aborts on rather than refuses: a tokenizer model of "none" with a token
    list, a list of nothing but empty strings, and token text that is not UTF-8 (the reader keeps invalid bytes
    as lone surrogates)."""
    if g.get(Keys.Tokenizer.MODEL) == "none" and tokens:
        raise GGUFFormatError(f"{where}: tokenizer model 'none' with a vocabulary of {len(tokens)} tokens")
    if tokens and not any(tokens):
        raise GGUFFormatError(f"{where}: every one of the {len(tokens)} token strings is empty")
    for i, token in enumerate(tokens):
        try:
            token.encode("utf-8")
        except UnicodeEncodeError:
            raise GGUFFormatError(f"{where}: token {i} is not valid UTF-8") from None


def _check_vocab(g: GGUFFile, where: str) -> None:
    """Token strings must be unique as llama.cpp reads them (it asserts it) and the per-token arrays agree in length."""
    tokens_ref = g.get(Keys.Tokenizer.LIST)
    if tokens_ref is None:
        raise GGUFFormatError(f"{where}: no {Keys.Tokenizer.LIST} vocabulary")
    tokens: list[str]
    if isinstance(tokens_ref, ArrayRef) and tokens_ref.item_type == GGUFValueType.STRING:
        tokens = g.read_strings(tokens_ref)
    elif isinstance(tokens_ref, list) and all(isinstance(t, str) for t in tokens_ref):
        tokens = tokens_ref
    else:
        raise GGUFFormatError(f"{where}: {Keys.Tokenizer.LIST} is not an array of strings")
    _check_token_text(g, tokens, where)
    for key in (Keys.Tokenizer.SCORES, Keys.Tokenizer.TOKEN_TYPE):
        arr = g.get(key)
        if arr is not None and (not isinstance(arr, (ArrayRef, list)) or len(arr) != len(tokens)):
            raise GGUFFormatError(
                f"{where}: {key} has {len(arr) if isinstance(arr, (ArrayRef, list)) else 'no'} entries for "
                f"{len(tokens)} tokens"
            )
    distinct = set(tokens)
    if len(distinct) == len(tokens) and "" not in distinct and "\x00" not in "".join(tokens):
        return  # each token is its own key to llama.cpp: the common case, checked at C speed
    seen: dict[str, int] = {}  # token text as llama.cpp keys it -> first id
    for i, token in enumerate(tokens):
        # llama.cpp reads each token as a C string (up to its first NUL) and renames empty ones
        word = token.split("\x00", 1)[0] or f"[EMPTY_{i}]"
        first = seen.setdefault(word, i)
        if first != i:
            raise GGUFFormatError(
                f"{where}: tokens {first} and {i} are both {word!r} to llama.cpp (token strings must be unique)"
            )
