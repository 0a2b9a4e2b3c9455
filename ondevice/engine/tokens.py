"""Text <-> token ids through llama.cpp's vocabulary: the ctypes calls the engine's tokenize, detokenize
and decode loop make, and the check of token ids a caller passes in."""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

from ondevice.core.errors import EngineError, InvalidParameterError
from ondevice.llama.model import LlamaHandle

__all__ = ["tokenize_bytes", "detokenize_ids", "check_ids", "token_reader"]


def tokenize_bytes(h: LlamaHandle, raw: bytes, add_bos: bool, special: bool) -> list[int]:
    """UTF-8 bytes -> token ids (llama_tokenize, retried once with the size it asks for)."""
    lib = h.lib
    cap = len(raw) + 8
    buf = (ctypes.c_int32 * cap)()
    n = lib.llama_tokenize(h.vocab, raw, len(raw), buf, cap, add_bos, special)
    if n < 0:
        cap = -n
        buf = (ctypes.c_int32 * cap)()
        n = lib.llama_tokenize(h.vocab, raw, len(raw), buf, cap, add_bos, special)
    if n < 0:
        raise EngineError(f"llama_tokenize failed (code {n})")
    return list(buf[:n])


def detokenize_ids(h: LlamaHandle, ids: list[int], special: bool) -> str:
    """Token ids -> text (llama_detokenize; invalid UTF-8 becomes U+FFFD)."""
    lib = h.lib
    arr = (ctypes.c_int32 * len(ids))(*ids)
    cap = 8 * len(ids) + 16
    for _ in range(2):
        buf = ctypes.create_string_buffer(cap)
        n = lib.llama_detokenize(h.vocab, arr, len(ids), buf, cap, False, special)
        if n >= 0:
            return buf.raw[:n].decode("utf-8", "replace")
        cap = -n
    raise EngineError(f"llama_detokenize failed (code {n})")


def check_ids(ids: Any, n_vocab: int, *, allow_empty: bool = False) -> list[int]:
    """Caller-given token ids as a list of ints inside the vocabulary; InvalidParameterError otherwise."""
    try:
        out = [int(t) for t in ids]
        bad = any(isinstance(t, bool) or int(t) != t for t in ids)
    except (TypeError, ValueError):
        raise InvalidParameterError("prompt token ids must be a sequence of integers") from None
    if bad:
        raise InvalidParameterError("prompt token ids must be a sequence of integers")
    if not out and not allow_empty:
        raise InvalidParameterError("prompt is empty: no tokens to process")
    for t in out:
        if not 0 <= t < n_vocab:
            raise InvalidParameterError(f"token id {t} is outside the vocabulary [0, {n_vocab})")
    return out


def token_reader(handle: LlamaHandle) -> Callable[[int], tuple[bytes, bool]]:
    """token id -> (its bytes, is it end-of-generation), cached per id: one ctypes call per new id."""
    lib, vocab = handle.lib, handle.vocab
    cache: dict[int, tuple[bytes, bool]] = {}
    buf = ctypes.create_string_buffer(64)

    def read(token: int) -> tuple[bytes, bool]:
        out = cache.get(token)
        if out is None:
            n = lib.llama_token_to_piece(vocab, token, buf, len(buf), 0, False)
            if n < 0:
                big = ctypes.create_string_buffer(-n)
                n = lib.llama_token_to_piece(vocab, token, big, len(big), 0, False)
                piece = big.raw[:n]
            else:
                piece = buf.raw[:n]
            out = cache[token] = (piece, bool(lib.llama_vocab_is_eog(vocab, token)))
        return out

    return read
