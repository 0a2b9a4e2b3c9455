"""The engine's KV cache bookkeeping: which tokens sequence 0 of the context holds, the prompt logits kept
for a repeated prompt, and how much of a new prompt the cache can reuse.

A model with recurrent layers (llama.cpp's recurrent or hybrid memory: Mamba, RWKV, LFM2's short convolutions)
keeps a state that has taken in every token so far; llama.cpp cannot cut it back to a shorter prefix
(llama_memory_seq_rm refuses a partial removal). Its cache is reused only where all it holds is a prefix of the
new prompt (a chat's next turn, a prompt that extends the last); any other request starts from an empty cache."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

from ondevice.core.errors import EngineError
from ondevice.llama.model import LlamaHandle

__all__ = ["KVCache"]


class KVCache:
    """What sequence 0 of the context holds: token ids at positions 0..n-1."""

    def __init__(self, handle: LlamaHandle):
        self._h = handle
        self.tokens: list[int] = []  # ids whose K/V are in the cache, in position order
        # The logits a prompt's prefill produced at its last position, and that prompt's length. A request
        # for the same prompt samples its first token from these instead of recomputing the last prompt
        # token alone: a one-token batch rounds differently from the same token inside the prompt's batch,
        # so the repeated greedy request would drift from the first one.
        self.prompt_logits: Any = None  # ctypes float array of n_vocab, or None
        self.prompt_logits_len = 0

    def clear(self) -> None:
        self._h.lib.llama_memory_clear(self._h.memory, False)  # cells emptied; buffers need no zeroing
        self.tokens.clear()
        self.drop_prompt_logits()

    def drop_prompt_logits(self) -> None:
        self.prompt_logits, self.prompt_logits_len = None, 0

    def keep_prompt_logits(self) -> None:
        """Copy the logits of the last decoded position (a prompt's last token) beside the cache."""
        h = self._h
        src = h.lib.llama_get_logits_ith(h.ctx, -1)
        if not src:
            self.drop_prompt_logits()
            return
        buf = self.prompt_logits
        if buf is None or len(buf) != h.n_vocab:
            buf = (ctypes.c_float * h.n_vocab)()
        ctypes.memmove(buf, src, 4 * h.n_vocab)
        self.prompt_logits, self.prompt_logits_len = buf, len(self.tokens)

    def restore_prompt_logits(self) -> bool:
        """Write the kept logits back as the context's last output row (what sampling with index -1 reads)."""
        h = self._h
        dst = h.lib.llama_get_logits_ith(h.ctx, -1) if self.prompt_logits is not None else None
        if not dst:
            return False
        ctypes.memmove(dst, self.prompt_logits, 4 * h.n_vocab)
        return True

    def whole_prompt_held(self, ids: Sequence[int]) -> bool:
        """The cache holds all of `ids` and the logits its prefill produced after them."""
        n = len(ids)
        return (
            self.prompt_logits is not None
            and n == self.prompt_logits_len
            and len(self.tokens) >= n
            and (len(self.tokens) == n or not self._h.recurrent)  # a recurrent state cannot drop what follows
            and self.tokens[:n] == list(ids)
        )

    def decode_failed(self, rc: int, where: str) -> EngineError:
        """After a failed llama_decode nothing says what the cache holds: clear it, and return the error to raise."""
        self.clear()
        return EngineError(f"llama_decode failed (code {rc}) {where}")

    def common_prefix(self, ids: Sequence[int]) -> int:
        """Leading tokens of `ids` the cache holds and can keep, at most len(ids) - 1 (one token is always
        computed); with recurrent layers, all the cache holds or none."""
        cached, n = self.tokens, 0
        limit = min(len(cached), len(ids) - 1)
        while n < limit and cached[n] == ids[n]:
            n += 1
        return 0 if self._h.recurrent and n < len(cached) else n

    def reuse(self, ids: Sequence[int], allow: bool) -> int:
        """Keep the longest common prefix with `ids`; return its length. All of `ids` only when the logits after
        them are kept too (whole_prompt_held), else at least one token is left to compute."""
        if not allow:
            self.clear()
            return 0
        whole = self.whole_prompt_held(ids) and self.restore_prompt_logits()
        n = len(ids) if whole else self.common_prefix(ids)
        if n < self.prompt_logits_len:
            self.drop_prompt_logits()  # positions the logits depend on are about to be trimmed
        cached = self.tokens
        lib, mem = self._h.lib, self._h.memory
        if n and self._h.recurrent and int(lib.llama_memory_seq_pos_max(mem, 0)) != n - 1:
            self.clear()  # the state took in a token not recorded (decoded, then an exception): it cannot go back
            return 0
        # Always trim from n on: also drops a cell decoded but not recorded (an exception between the two).
        if not lib.llama_memory_seq_rm(mem, 0, n, -1):
            self.clear()
            return 0
        del cached[n:]
        if n and self._h.n_swa > 0:
            # A sliding-window cache that already dropped old positions cannot resume at n.
            pos_min = int(lib.llama_memory_seq_pos_min(mem, 0))
            if pos_min > max(0, n - self._h.n_swa):
                self.clear()
                return 0
        return n
