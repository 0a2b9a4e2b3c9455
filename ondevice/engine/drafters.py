"""Where drafted tokens come from, for speculative decoding (ondevice.engine.speculative).

A drafter sees every committed token (prompt first, then each output token as it is
committed) and, when asked, proposes the next k tokens. It never decides what is output:
the target model verifies every draft.

- `PromptLookup` (no second model; llama.cpp's lookup, mlx-lm's prompt lookup): the last
  n-gram of prompt + output (n from 3 down to 1) is looked up in the earlier text and the
  tokens that followed its most recent earlier occurrence are the draft. An index updated
  per committed token makes the lookup O(1).
- `DraftModel` / `ModelDrafter`: a second, smaller GGUF with the same vocabulary, loaded
  through the one open path (ondevice.llama.model), its own context and KV cache; it drafts
  greedily, one token per decode.
"""

from __future__ import annotations

import ctypes
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any, Protocol

from ondevice.core.errors import InvalidParameterError
from ondevice.engine.loop import KVCache, _prefill
from ondevice.llama.model import LlamaHandle, load_model, new_context

__all__ = ["Drafter", "PromptLookup", "DraftModel", "ModelDrafter", "NGRAM_MAX", "NGRAM_MIN", "check_same_vocab"]

NGRAM_MAX, NGRAM_MIN = 3, 1  # the n-gram lengths prompt lookup tries, longest first (llama.cpp's lookup: 3..1)
_VOCAB_SAMPLE = 512  # token ids compared by text when checking that two vocabularies are the same
_SYNC_AHEAD = 8  # a draft model catches up in candidate() when it is this many tokens behind (the prompt)


class Drafter(Protocol):
    def extend(self, tokens: Sequence[int]) -> None:
        """Committed tokens, in order (the prompt first)."""

    def candidate(self) -> Hashable | None:
        """What kind of draft is available now (acceptance is kept per kind), or None: nothing to draft."""

    def draft(self, k: int) -> list[int]:
        """Up to k drafted tokens following the committed ones (called after candidate())."""

    def close(self) -> None: ...


class PromptLookup:
    """Draft by prompt lookup: the tokens that followed the most recent earlier occurrence of the
    longest matching tail n-gram. Its kind is the n-gram length matched (3, 2 or 1)."""

    def __init__(self, n_max: int = NGRAM_MAX, n_min: int = NGRAM_MIN):
        self._n = range(n_max, n_min - 1, -1)
        self._hist: list[int] = []  # committed tokens
        # n -> {n-gram: index of its last token, for the latest occurrence that has a token after it}
        self._index: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self._n}
        self._end = -1  # where the current match ends (set by candidate())

    def extend(self, tokens: Sequence[int]) -> None:
        h, index = self._hist, self._index
        for t in tokens:
            j = len(h)  # the new token's index: every n-gram ending at j - 1 now has a follower
            for n, table in index.items():
                if j >= n:
                    table[tuple(h[j - n : j])] = j - 1
            h.append(int(t))

    def candidate(self) -> int | None:
        h = self._hist
        for n in self._n:
            if len(h) > n:
                end = self._index[n].get(tuple(h[-n:]))
                if end is not None:
                    self._end = end
                    return n
        return None

    def draft(self, k: int) -> list[int]:
        """What followed the match; past the end of the text the draft repeats itself (a loop)."""
        h, start, n_hist = self._hist, self._end + 1, len(self._hist)
        out: list[int] = []
        for i in range(k):
            src = start + i
            out.append(h[src] if src < n_hist else out[src - n_hist])
        return out

    def close(self) -> None:
        pass


def _piece(lib: Any, vocab: Any, token: int) -> bytes:
    buf = ctypes.create_string_buffer(256)
    n = lib.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = lib.llama_token_to_piece(vocab, token, buf, len(buf), 0, True)
    return buf.raw[: max(n, 0)]


def check_same_vocab(target: LlamaHandle, draft: LlamaHandle, label: str) -> None:
    """InvalidParameterError unless the draft's vocabulary is the target's: the same size, the same
    BOS/EOS ids, and the same text for a spread of token ids."""
    if draft.n_vocab != target.n_vocab:
        raise InvalidParameterError(
            f"draft model {label}: its vocabulary has {draft.n_vocab} tokens, the target's {target.n_vocab}: "
            "a draft model must share the target's vocabulary"
        )
    lib = target.lib
    step = max(1, target.n_vocab // _VOCAB_SAMPLE)
    ids = sorted(set(range(0, target.n_vocab, step)) | {target.n_vocab - 1})
    for name in ("llama_vocab_bos", "llama_vocab_eos"):
        a, b = int(getattr(lib, name)(target.vocab)), int(getattr(lib, name)(draft.vocab))
        if a != b:
            raise InvalidParameterError(f"draft model {label}: its {name[12:].upper()} token is {b}, the target's {a}")
    for t in ids:
        if _piece(lib, target.vocab, t) != _piece(lib, draft.vocab, t):
            raise InvalidParameterError(
                f"draft model {label}: token {t} is {_piece(lib, draft.vocab, t)!r} there but "
                f"{_piece(lib, target.vocab, t)!r} in the target: a draft model must share the target's vocabulary"
            )


class DraftModel:
    """A draft GGUF loaded beside a target engine (kept by the engine, reused across requests)."""

    def __init__(self, path: Path, target: LlamaHandle, *, n_threads: int, n_gpu_layers: int):
        from ondevice.gguf.loadcheck import inspect_for_load

        inspect_for_load(path)  # GGUFFormatError for a malformed file, before llama.cpp sees it
        lib = target.lib
        model, _ = load_model(path, n_gpu_layers=n_gpu_layers, lib=lib)
        try:
            ctx, _ = new_context(model, n_ctx=target.n_ctx, n_threads=n_threads, lib=lib)
        except BaseException:
            lib.llama_model_free(model)
            raise
        self.path = path
        self.handle = LlamaHandle(lib, model, ctx)
        try:
            check_same_vocab(target, self.handle, path.name)
        except BaseException:
            self.handle.free()
            raise
        self.kv = KVCache(self.handle)  # what the draft context holds, kept across requests

    def drafter(self) -> ModelDrafter:
        return ModelDrafter(self)

    def close(self) -> None:
        self.handle.free()


class ModelDrafter:
    """One request's drafts from a DraftModel: greedy, one decode per drafted token. Its kind is "draft"."""

    def __init__(self, model: DraftModel):
        self._m = model
        h = model.handle
        self._lib, self._ctx = h.lib, h.ctx
        self._greedy = None  # llama.cpp's greedy sampler, made on first use (freed by close())
        self._hist: list[int] = []
        self._one = (ctypes.c_int32 * 1)()
        self._batch = h.lib.llama_batch_get_one(self._one, 1)

    def extend(self, tokens: Sequence[int]) -> None:
        self._hist.extend(int(t) for t in tokens)

    def candidate(self) -> str | None:
        if len(self._hist) - len(self._m.kv.tokens) > _SYNC_AHEAD:
            self._sync()  # the prompt: catch up now, so drafting costs only what drafting costs
        return "draft" if self._hist else None

    def _sync(self) -> None:
        """Put the committed tokens into the draft's cache (its common prefix kept); the last one's logits are ready."""
        kv, hist = self._m.kv, self._hist
        n = kv.reuse(hist, True)
        _prefill(self._m.handle, kv, hist[n:], self._m.handle.n_batch, lambda: False)

    def draft(self, k: int) -> list[int]:
        if k <= 0:
            return []
        lib, ctx, kv = self._lib, self._ctx, self._m.kv
        self._sync()
        if self._greedy is None:
            self._greedy = lib.llama_sampler_init_greedy()
        out: list[int] = []
        for j in range(k):
            if j:
                self._one[0] = out[-1]
                rc = lib.llama_decode(ctx, self._batch)
                if rc != 0:
                    raise kv.decode_failed(rc, "in the draft model")
                kv.tokens.append(out[-1])
            out.append(int(lib.llama_sampler_sample(self._greedy, ctx, -1)))
        return out

    def close(self) -> None:
        if self._greedy:
            self._lib.llama_sampler_free(self._greedy)
            self._greedy = None
