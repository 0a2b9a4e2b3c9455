"""Several sequences decoded together: a second llama.cpp context, n_seq_max = B, on the engine's model.

`Engine.batched(B, seq_tokens)` makes a BatchContext; `BatchContext.generate(prompts, max_tokens)`
prefills the prompts one after another in chunks of n_batch tokens (each token tagged with its
sequence id and position; a chunk never mixes sequences, see _prefill), samples each sequence's
first token right after the chunk that holds its last prompt token, then runs decode steps of one
token per live sequence in one
llama_decode until each sequence ends (max_tokens, end-of-generation, a stop string); a finished
sequence drops out of the following steps. Each sequence has its own sampler chain, stop
handling and KV stream (llama.cpp's per-sequence streams, kv_unified off), and its prompt is
computed exactly as its own single-sequence request computes it. Its greedy output is that
request's as long as the decode steps' kernels are too: on llama.cpp's CPU backend a step of 4 or
more rows may take another code path (the repacked Q4_K GEMM) than a step of one, whose
results differ in the last bits, so a near-tie between two tokens can go the other way
(benchmarks/README.md has the batch sizes where it did).

Timing (docs/metrics.md): every token is stamped with perf_counter_ns() when it is
sampled; each sequence gets its own Generation, whose TTFT includes the shared prefill up to
its first token. A decode step lasts from the start of its llama_decode to its last sample.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from ondevice.core.errors import ContextOverflowError, EngineBusyError, EngineError, InvalidParameterError
from ondevice.core.metrics import timings_from_marks
from ondevice.core.results import FinishReason, Generation
from ondevice.engine.interface import PredictsBatchCeiling, PredictsBatchStep
from ondevice.engine.loader import context_settings
from ondevice.engine.loop import OutputTokens, cancel_poll
from ondevice.engine.sampling import SamplerChain, SamplingParams, make_params
from ondevice.llama.model import LlamaHandle, fill_batch_entries, new_context

__all__ = ["BatchContext", "BatchGeneration", "MAX_SEQS"]

MAX_SEQS = 256  # llama.cpp's LLAMA_MAX_SEQ: sequences one context can hold
_NS = 1e-9
_SEED_MOD = 2**32


@dataclass(frozen=True)
class BatchGeneration:
    """One batched generation: a Generation per sequence and the steps they shared."""

    generations: tuple[Generation, ...]  # one per prompt, in the prompts' order
    wall_s: float  # generate() called -> the last token of any sequence, seconds
    # start of the first prefill llama_decode -> end of the last, seconds (first tokens sampled between chunks included)
    prefill_s: float
    step_s: tuple[float, ...]  # each decode step: llama_decode start -> its last sample, seconds
    step_seqs: tuple[int, ...]  # sequences decoded (tokens produced) in each step
    predicted_step_s: float | None = (
        None  # calibrated roofline: one step of all sequences at the mid-decode context, seconds
    )
    ceiling_step_s: float | None = None  # bandwidth bound of that step, seconds

    @property
    def n_seqs(self) -> int:
        return len(self.generations)

    @property
    def output_tokens(self) -> int:
        """Output tokens of every sequence."""
        return sum(g.timings.output_tokens for g in self.generations)

    @property
    def output_tok_s(self) -> float | None:
        """Aggregate output throughput: every sequence's output tokens / wall_s (prefill included)."""
        return self.output_tokens / self.wall_s if self.wall_s > 0 else None

    @property
    def decode_tok_s(self) -> float | None:
        """Aggregate decode throughput: tokens produced by the decode steps / their time."""
        total = sum(self.step_s)
        return sum(self.step_seqs) / total if total > 0 else None

    @property
    def predicted_decode_tok_s(self) -> float | None:
        """The roofline's aggregate decode tok/s: B tokens per predicted step."""
        return self.n_seqs / self.predicted_step_s if self.predicted_step_s else None

    @property
    def ceiling_decode_tok_s(self) -> float | None:
        return self.n_seqs / self.ceiling_step_s if self.ceiling_step_s else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_seqs": self.n_seqs,
            "wall_s": self.wall_s,
            "prefill_s": self.prefill_s,
            "step_s": list(self.step_s),
            "step_seqs": list(self.step_seqs),
            "output_tokens": self.output_tokens,
            "output_tok_s": self.output_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "predicted_step_s": self.predicted_step_s,
            "ceiling_step_s": self.ceiling_step_s,
            "predicted_decode_tok_s": self.predicted_decode_tok_s,
            "ceiling_decode_tok_s": self.ceiling_decode_tok_s,
            "generations": [g.to_dict() for g in self.generations],
        }


class _Seq:
    """One sequence's state while a batch runs (internal)."""

    def __init__(self, index: int, ids: list[int], chain: SamplerChain, output: OutputTokens):
        self.index = index  # its sequence id in the context
        self.ids = ids  # prompt token ids
        self.chain = chain
        self.output = output  # its output tokens, their texts and time marks
        self.prefill_end_ns = 0  # end of the prefill chunk that held its last prompt token (0: not prefilled)
        self.finish: FinishReason | None = None  # set when it has ended

    def take(self, token: int, t_ns: int) -> None:
        _event, self.finish = self.output.commit(token, t_ns)


class BatchContext:
    """A context of n_seqs sequences of n_ctx_seq tokens each, on an engine's model (Engine.batched).
    One generation at a time, and never while the engine generates: both hold the engine's lock."""

    def __init__(
        self,
        engine: Any,
        handle: LlamaHandle,
        n_seqs: int,
        lock: threading.Lock,
        token_info: Callable[[int], tuple[bytes, bool]],
    ):
        self._engine = engine  # tokenize, id checks, info (seed), predictor
        self._h = handle  # the context (the model belongs to the engine)
        self._lock = lock  # the engine's busy lock
        self._token_info = token_info
        self._cancel: threading.Event | None = None  # set by cancel() while a generation runs
        self.n_seqs = n_seqs  # sequences the context holds
        lib, ctx = handle.lib, handle.ctx
        per = int(lib.llama_n_ctx_seq(ctx)) if hasattr(lib, "llama_n_ctx_seq") else handle.n_ctx // n_seqs
        self.n_ctx_seq = per  # tokens each sequence may hold (prompt + output)

    @classmethod
    def open(
        cls,
        engine: Any,
        handle: LlamaHandle,
        lock: threading.Lock,
        token_info: Callable[[int], tuple[bytes, bool]],
        n_seqs: Any,
        seq_tokens: Any = None,
    ) -> BatchContext:
        """A context of n_seqs sequences on the model of `handle` (the engine's), each holding
        seq_tokens (None: the engine's n_ctx) rounded up to 256, with the engine's settings
        (loader.context_settings). InvalidParameterError before any work for n_seqs outside
        1..256 or seq_tokens past the trained context; ModelLoadError when llama.cpp cannot allocate it."""
        ok = isinstance(n_seqs, int) and not isinstance(n_seqs, bool) and 1 <= n_seqs <= MAX_SEQS
        if not ok:
            raise InvalidParameterError(
                f"n_seqs must be an integer from 1 to {MAX_SEQS} (llama.cpp's limit), not {n_seqs!r}"
            )
        info = engine.info
        seq_tokens = info.n_ctx if seq_tokens is None else seq_tokens
        if isinstance(seq_tokens, bool) or not isinstance(seq_tokens, int) or seq_tokens < 1:
            raise InvalidParameterError(f"seq_tokens must be a positive integer, not {seq_tokens!r}")
        trained = info.spec.n_ctx_train
        if trained and seq_tokens > trained:
            raise InvalidParameterError(
                f"seq_tokens {seq_tokens}: each sequence would run past the model's trained context of {trained} tokens"
            )
        per = -(-seq_tokens // 256) * 256  # llama.cpp gives each sequence n_ctx / n_seq_max, rounded up to 256
        lib = handle.lib
        settings = context_settings(info, lib)
        settings["n_batch"] = max(settings["n_batch"], n_seqs)  # one decode step holds a token of every sequence
        ctx, _ = new_context(handle.model, n_ctx=n_seqs * per, n_seq_max=n_seqs, lib=lib, **settings)
        return cls(engine, LlamaHandle(lib, handle.model, ctx, owns_model=False), n_seqs, lock, token_info)

    @property
    def closed(self) -> bool:
        return not self._h.ctx

    def close(self) -> None:
        """Free the context (the engine's model stays). The engine closes its batch contexts first."""
        self._h.free()

    def __enter__(self) -> BatchContext:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None and self._h.ctx:  # nothing runs on it: no one holds it
            try:
                self.close()
            except Exception:
                pass

    def generate(
        self,
        prompts: Sequence[Sequence[int]] | Sequence[str],
        max_tokens: int,
        *,
        seed: int | None = None,
        ignore_eos: bool = False,
        cancel: threading.Event | None = None,
        **sampling: Any,
    ) -> BatchGeneration:
        """Generate for every prompt (token ids, or text tokenized with BOS) at once; sequence i
        samples with seed + i (seed None: the engine's base seed). sampling: make_params' other
        settings (temperature, top_k, top_p, min_p, repeat_penalty, stop). cancel (or cancel(),
        or the engine's cancel()) stops it between prefill chunks or decode steps: the sequences
        still running end with finish_reason "cancelled" and what they produced. Raises
        InvalidParameterError / ContextOverflowError before any work, EngineBusyError while
        the engine generates."""
        start_ns = perf_counter_ns()
        try:
            params = make_params(max_tokens=max_tokens, seed=seed, ignore_eos=ignore_eos, **sampling)
        except TypeError as exc:
            raise InvalidParameterError(f"unknown sampling setting: {exc}") from None
        if self.closed:
            raise EngineError("this batch context is closed")
        own = threading.Event()
        cancelled = cancel_poll(own, cancel)
        ids = self._prompt_ids(prompts, params.max_tokens)
        if not self._lock.acquire(blocking=False):
            raise EngineBusyError("the engine is already generating; wait for it, cancel it, or use another engine")
        self._cancel = own
        try:
            return self._run(ids, params, start_ns, perf_counter_ns(), cancelled)
        finally:
            self._cancel = None
            self._lock.release()

    def cancel(self) -> None:
        """Stop the running generate() at its next chunk or step; thread-safe, no-op when idle."""
        ev = self._cancel
        if ev is not None:
            ev.set()

    def _prompt_ids(self, prompts: Any, max_tokens: int) -> list[list[int]]:
        if isinstance(prompts, (str, bytes)) or not isinstance(prompts, Sequence) or not prompts:
            raise InvalidParameterError("prompts must be a non-empty list of prompts (texts or token id lists)")
        if len(prompts) > self.n_seqs:
            raise InvalidParameterError(f"{len(prompts)} prompts: this batch context holds {self.n_seqs} sequences")
        out = []
        for i, p in enumerate(prompts):
            ids = self._engine.tokenize(p) if isinstance(p, str) else self._engine._check_ids(p, allow_empty=True)
            if not ids:
                raise InvalidParameterError(f"prompt {i} is empty: no tokens to process")
            if len(ids) + max_tokens > self.n_ctx_seq:
                raise ContextOverflowError(
                    f"prompt {i}: {len(ids)} tokens + max_tokens {max_tokens} = {len(ids) + max_tokens} tokens "
                    f"exceeds the {self.n_ctx_seq} tokens each sequence of this batch context holds"
                )
            out.append(ids)
        return out

    def _run(
        self,
        prompts: list[list[int]],
        p: SamplingParams,
        start_ns: int,
        tokenized_ns: int,
        cancelled: Callable[[], bool],
    ) -> BatchGeneration:
        h, lib = self._h, self._h.lib
        lib.llama_memory_clear(h.memory, False)
        base = p.seed if p.seed is not None else self._engine.info.seed
        seqs: list[_Seq] = []
        batch = lib.llama_batch_init(max(h.n_batch, len(prompts)), 0, 1)
        try:
            for i, ids in enumerate(prompts):
                chain = SamplerChain(lib, p, (base + i) % _SEED_MOD, h.n_vocab, history=ids)
                seqs.append(_Seq(i, ids, chain, OutputTokens(p, len(ids), start_ns, None, self._token_info)))
            prefill_start = perf_counter_ns()
            self._prefill(batch, seqs, p, cancelled)
            prefill_end = perf_counter_ns()
            step_s, step_seqs = self._decode(batch, seqs, p, cancelled)
        finally:
            lib.llama_batch_free(batch)
            for s in seqs:
                s.chain.close()
        gens = []
        pred, ceil = self._predicted(prompts, p.max_tokens)
        for s in seqs:
            o = s.output
            computed = len(s.ids) if s.prefill_end_ns else 0
            timings = timings_from_marks(
                start_ns, tokenized_ns, prefill_start, s.prefill_end_ns or prefill_end, o.token_ns, computed
            )
            gens.append(
                Generation(
                    text="".join(o.texts),
                    token_ids=tuple(o.ids),
                    finish_reason=s.finish or "length",
                    prompt_tokens=len(s.ids),
                    cached_prompt_tokens=0,
                    timings=timings,
                    ceiling_tok_s=1.0 / ceil if ceil else None,
                    predicted_tok_s=1.0 / pred if pred else None,
                )
            )
        last_ns = max((s.output.token_ns[-1] for s in seqs if s.output.token_ns), default=prefill_end)
        return BatchGeneration(
            tuple(gens),
            (last_ns - start_ns) * _NS,
            (prefill_end - prefill_start) * _NS,
            tuple(step_s),
            tuple(step_seqs),
            pred,
            ceil,
        )

    def _prefill(self, batch: Any, seqs: list[_Seq], p: SamplingParams, cancelled: Callable[[], bool]) -> None:
        """Each prompt in chunks of n_batch tokens (tagged with its sequence id and positions), logits
        only at its last token, whose first output token is sampled right after that chunk.

        A chunk never mixes sequences: llama.cpp's CPU kernels pick their code path by the rows in
        a pass (the repacked Q4_K GEMM takes rows in fours, the rest go through GEMV), so a token
        computed beside another prompt's tokens gets keys and values that differ in the last bits
        from its single-request ones, and greedy output drifts. Chunked as a single request is,
        each sequence's cache is bit for bit that request's. Cancelled between chunks, the
        sequences not yet prefilled end "cancelled" with no output."""
        h, lib = self._h, self._h.lib
        for s in seqs:
            last = len(s.ids) - 1
            for lo in range(0, len(s.ids), h.n_batch):
                if cancelled():
                    for rest in seqs:
                        rest.finish = rest.finish or "cancelled"
                    return
                hi = min(lo + h.n_batch, len(s.ids))
                fill_batch_entries(batch, ((s.ids[pos], pos, s.index, pos == last) for pos in range(lo, hi)))
                rc = lib.llama_decode(h.ctx, batch)
                if rc != 0:
                    lib.llama_memory_clear(h.memory, False)
                    raise EngineError(
                        f"llama_decode failed on prompt {s.index} (code {rc}) at token {lo} of {len(s.ids)}"
                    )
            s.prefill_end_ns = perf_counter_ns()
            if p.max_tokens:
                s.take(lib.llama_sampler_sample(s.chain.ptr, h.ctx, hi - lo - 1), perf_counter_ns())
            else:
                s.finish = "length"

    def _decode(
        self, batch: Any, seqs: list[_Seq], p: SamplingParams, cancelled: Callable[[], bool]
    ) -> tuple[list[float], list[int]]:
        """Steps of one token per live sequence until every sequence has ended (or it is cancelled)."""
        h, lib = self._h, self._h.lib
        decode, sample = lib.llama_decode, lib.llama_sampler_sample
        step_s: list[float] = []
        step_seqs: list[int] = []
        while True:
            live = [s for s in seqs if s.finish is None]
            if live and cancelled():
                for s in live:
                    s.finish = "cancelled"
                live = []
            if not live:
                return step_s, step_seqs
            fill_batch_entries(
                batch, ((s.output.ids[-1], len(s.ids) + len(s.output.ids) - 1, s.index, True) for s in live)
            )
            t0 = perf_counter_ns()
            rc = decode(h.ctx, batch)
            if rc != 0:
                lib.llama_memory_clear(h.memory, False)
                raise EngineError(f"llama_decode failed (code {rc}) at decode step {len(step_s) + 1}")
            t = t0
            for k, s in enumerate(live):
                token = sample(s.chain.ptr, h.ctx, k)
                t = perf_counter_ns()
                s.take(token, t)
            step_s.append((t - t0) * _NS)
            step_seqs.append(len(live))

    def _predicted(self, prompts: list[list[int]], max_tokens: int) -> tuple[float | None, float | None]:
        """(calibrated, ceiling) seconds of one step of every sequence at the mean mid-decode context,
        when the engine's predictor has the batched step model (PredictsBatchStep)."""
        pred = self._engine.predictor
        if not isinstance(pred, PredictsBatchStep) or max_tokens < 2:
            return None, None
        mid = round(sum(len(i) for i in prompts) / len(prompts) + max_tokens / 2)
        try:
            calibrated = float(pred.tokens_step_s(mid, 1, len(prompts)))
            ceiling = (
                float(pred.ceiling_tokens_step_s(mid, 1, len(prompts)))
                if isinstance(pred, PredictsBatchCeiling)
                else None
            )
        except Exception:  # a predictor that cannot answer leaves the prediction empty
            return None, None
        return (calibrated if calibrated > 0 else None), (ceiling if ceiling and ceiling > 0 else None)
