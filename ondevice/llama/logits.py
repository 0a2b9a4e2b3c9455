"""`LogitsModel`: a model + context that scores token windows and returns their logits (quant's
quality evaluation; copying logits is fine here, this is not the decode hot path).

llama_cpp is imported inside functions: importing this module stays cheap.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ondevice.core.errors import QuantError
from ondevice.llama.devices import gpu_layers
from ondevice.llama.model import LlamaHandle, fill_batch, load_model, new_context

__all__ = ["LogitsModel"]


class LogitsModel:
    """A model and one context of `n_ctx` tokens; evaluates windows from an empty cache."""

    def __init__(
        self, path: str | Path, *, n_ctx: int, n_threads: int | None = None, n_gpu_layers: int | str | None = "auto"
    ):
        import llama_cpp

        self._ll = llama_cpp
        self.path = Path(path)
        self.n_ctx = int(n_ctx)
        model, _ = load_model(
            self.path, n_gpu_layers=gpu_layers(llama_cpp, n_gpu_layers or "auto", None)[0], lib=llama_cpp
        )
        try:
            ctx, _ = new_context(
                model,
                n_ctx=self.n_ctx,
                n_threads=int(n_threads or os.cpu_count() or 1),
                n_batch=self.n_ctx,  # one llama_decode call per window
                n_ubatch=min(self.n_ctx, 512),
                lib=llama_cpp,
            )
        except BaseException:
            llama_cpp.llama_model_free(model)
            raise
        self._h = LlamaHandle(llama_cpp, model, ctx)
        self._vocab, self._ctx, self.n_vocab = self._h.vocab, ctx, self._h.n_vocab

    def tokenize(self, text: str, *, add_bos: bool = False) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 16
        buf = (self._ll.llama_token * cap)()
        n = self._ll.llama_tokenize(self._vocab, data, len(data), buf, cap, add_bos, False)
        if n < 0:
            raise QuantError(f"{self.path}: tokenizing the text failed ({n})")
        return list(buf[:n])

    @property
    def bos(self) -> int | None:
        """The BOS token when the model wants one at the start of a sequence, else None."""
        if not self._ll.llama_vocab_get_add_bos(self._vocab):
            return None
        tok = int(self._ll.llama_vocab_bos(self._vocab))
        return tok if tok >= 0 else None

    def window_logits(self, tokens: Sequence[int], first_scored: int) -> np.ndarray:
        """Evaluate `tokens` from an empty cache; return float32 logits (n_scored, n_vocab) where
        row k predicts tokens[first_scored + k]."""
        ll, n = self._ll, len(tokens)
        if not 1 <= first_scored < n <= self.n_ctx:
            raise QuantError(
                f"window of {n} tokens, scoring from {first_scored}: does not fit a context of {self.n_ctx}"
            )
        ll.llama_memory_clear(self._h.memory, True)
        batch = ll.llama_batch_init(n, 0, 1)
        try:
            fill_batch(batch, tokens, 0, lambda i: first_scored - 1 <= i < n - 1)
            rc = ll.llama_decode(self._ctx, batch)
            if rc != 0:
                raise QuantError(f"{self.path}: llama_decode failed with code {rc}")
            out = np.empty((n - first_scored, self.n_vocab), dtype=np.float32)
            for k in range(n - first_scored):
                ptr = ll.llama_get_logits_ith(self._ctx, first_scored - 1 + k)
                out[k] = np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))
            return out
        finally:
            ll.llama_batch_free(batch)

    def close(self) -> None:
        self._h.free()

    def __enter__(self) -> LogitsModel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
