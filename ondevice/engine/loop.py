"""The decode loop: prefill in n_batch chunks, then one llama_decode per token, every token timed.

Timing marks are `time.perf_counter_ns()` (docs/metrics.md): the request starts when
the caller handed in text, a token is "available" the moment the native sampler returns
it. Logits never leave llama.cpp: sampling is `llama_sampler_sample` on the context.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from time import perf_counter_ns
from typing import Any

from ondevice.core.errors import InvalidParameterError
from ondevice.core.metrics import timings_from_marks
from ondevice.core.reasoning import first_visible
from ondevice.core.results import Attribution, FinishReason, Generation, TokenEvent
from ondevice.engine.interface import Predictor, PredictsTTFT
from ondevice.engine.kvcache import KVCache
from ondevice.engine.sampling import SamplerChain, SamplingParams
from ondevice.engine.text import TextAssembler
from ondevice.llama.model import LlamaHandle

__all__ = [
    "KVCache",
    "Request",
    "run_request",
    "TokenStream",
    "OutputTokens",
    "DecodeState",
    "cancel_poll",
    "check_cancel",
]

_NS = 1e-9


@dataclass
class Request:
    """One generation, validated and tokenized (internal)."""

    ids: list[int]  # prompt token ids
    start_ns: int  # perf_counter_ns() when the request was made
    tokenized_ns: int  # perf_counter_ns() when the ids were ready
    params: SamplingParams
    seed: int  # draw seed (ignored when greedy)
    cancelled: Callable[[], bool]  # polled before each step
    reuse_prefix: bool  # keep the KV cache's common prefix
    think: Any = None  # (ThinkMarkers, {marker token id: marker text}) when the chat template has reasoning blocks
    spec: Any = None  # a Speculator (ondevice.engine.speculative) when the request asked for speculative decoding
    other_cpu: Any = None  # an ondevice.core.cpuload.OtherCpu started with the request (None: not measured)


def check_cancel(cancel: Any) -> None:
    """A caller's cancel: None or anything with is_set() (InvalidParameterError otherwise)."""
    if cancel is not None and not callable(getattr(cancel, "is_set", None)):
        raise InvalidParameterError("cancel must be a threading.Event (or have is_set())")


def cancel_poll(own: threading.Event, external: Any = None) -> Callable[[], bool]:
    """What a run polls before each step: its own event (set by cancel()) or the caller's (check_cancel)."""
    check_cancel(external)
    if external is None:
        return own.is_set
    return lambda: own.is_set() or external.is_set()


def _prefill(handle: LlamaHandle, kv: KVCache, ids: list[int], n_batch: int, cancelled: Callable[[], bool]) -> bool:
    """Decode ids into the cache in chunks of n_batch; False when cancelled between chunks."""
    lib = handle.lib
    arr = (ctypes.c_int32 * len(ids))(*ids)
    base = ctypes.addressof(arr)
    for lo in range(0, len(ids), n_batch):
        if lo and cancelled():
            return False
        n = min(n_batch, len(ids) - lo)
        ptr = ctypes.cast(base + 4 * lo, ctypes.POINTER(ctypes.c_int32))
        rc = lib.llama_decode(handle.ctx, lib.llama_batch_get_one(ptr, n))
        if rc != 0:
            raise kv.decode_failed(rc, f"on the prompt at token {lo} of {len(ids)}")
        kv.tokens.extend(ids[lo : lo + n])
    if ids:
        kv.keep_prompt_logits()
    return True


def run_request(
    handle: LlamaHandle,
    kv: KVCache,
    req: Request,
    n_batch: int,
    predictor: Predictor | None,
    token_info: Callable[[int], tuple[bytes, bool]],
) -> Generator[TokenEvent, None, Generation]:
    """Prefill, then sample/decode token by token, yielding a TokenEvent per output token."""
    p = req.params
    n_prompt = len(req.ids)
    n_cached = kv.reuse(req.ids, req.reuse_prefix)
    cancelled = req.cancelled
    prefill_start = perf_counter_ns()
    done = (not cancelled()) and _prefill(handle, kv, req.ids[n_cached:], n_batch, cancelled)
    prefill_end = perf_counter_ns()
    n_computed = len(kv.tokens) - n_cached
    out = OutputTokens(p, n_prompt, req.start_ns, predictor, token_info)
    spent = _Spent()
    finish: FinishReason = "cancelled"
    if done and p.max_tokens and not cancelled():
        decode = _decode if req.spec is None else req.spec.decode
        finish = yield from decode(DecodeState(handle, kv, req, out, spent))
    elif done:
        finish = "length" if not p.max_tokens else "cancelled"
    token_ns, steps = out.token_ns, out.steps
    timings = timings_from_marks(req.start_ns, req.tokenized_ns, prefill_start, prefill_end, token_ns, n_computed)
    if req.think is not None:
        timings = replace(timings, ttft_visible_s=_visible_s(req, out))
    ceiling, predicted = _rates(steps)
    chunk = min(n_batch, handle.n_ubatch)  # llama.cpp computes a prompt in passes of n_ubatch tokens
    predicted_ttft = predictor.ttft_s(n_prompt, n_cached, chunk) if isinstance(predictor, PredictsTTFT) else None
    predicted_e2e = predicted_ttft + sum(s[1] for s in steps[1:]) if predicted_ttft is not None and steps else None
    attribution = spent.attribution(timings, prefill_start, prefill_end, token_ns) if token_ns else None
    return Generation(
        text="".join(out.texts),
        token_ids=tuple(out.ids),
        finish_reason=finish,
        prompt_tokens=n_prompt,
        cached_prompt_tokens=n_cached,
        timings=timings,
        ceiling_tok_s=ceiling,
        predicted_tok_s=predicted,
        predicted_step_s=tuple(s[1] for s in steps),
        predicted_ttft_s=predicted_ttft,
        predicted_e2e_s=predicted_e2e,
        attribution=attribution,
        speculative=req.spec.stats() if req.spec is not None else None,
        other_cpu_cores=req.other_cpu.cores() if req.other_cpu is not None else None,
    )


class _Spent:
    """Nanoseconds the decode loop spent per kind of work, summed over output tokens 2..T."""

    __slots__ = ("decode_ns", "sample_ns", "detok_ns", "consumer_ns")

    def __init__(self) -> None:
        self.decode_ns = self.sample_ns = self.detok_ns = self.consumer_ns = 0

    def attribution(self, timings, prefill_start: int, prefill_end: int, token_ns: list[int]) -> Attribution:
        parts = dict(
            tokenize_s=timings.tokenize_s,
            prefill_s=timings.prefill_s,
            first_sample_s=(token_ns[0] - prefill_end) * _NS,
            decode_s=self.decode_ns * _NS,
            sample_s=self.sample_ns * _NS,
            detokenize_s=self.detok_ns * _NS,
            consumer_s=self.consumer_ns * _NS,
        )
        return Attribution(**parts, overhead_s=timings.e2e_s - sum(parts.values()), e2e_s=timings.e2e_s)


class OutputTokens:
    """What happens to each output token once it is sampled, in the plain, the speculative and the
    batched loops alike: its time mark, its text (stop strings, end-of-generation, max_tokens),
    its predicted step and its event. The caller reads the lists after the loop."""

    def __init__(
        self,
        params: SamplingParams,
        n_prompt: int,
        start_ns: int,
        predictor: Predictor | None,
        token_info: Callable[[int], tuple[bytes, bool]],
    ):
        self._text = TextAssembler(params.stop)
        self._step_s = predictor.step_s if predictor is not None else None
        self._check_eog, self._last_i = not params.ignore_eos, params.max_tokens - 1
        self._n_prompt, self._start = n_prompt, start_ns
        self._info = token_info
        self.token_ns: list[int] = []  # perf_counter_ns() when each token was available
        self.ids: list[int] = []  # output token ids
        self.texts: list[str] = []  # text released with each token
        self.steps: list[tuple[float, float]] = []  # (ceiling, calibrated) step s per token, with a predictor

    def commit(self, token: int, t_ns: int) -> tuple[TokenEvent, FinishReason | None]:
        """Record one output token, available at perf_counter_ns() t_ns: (its event, the finish
        reason when it is the last, else None)."""
        i = len(self.ids)
        self.token_ns.append(t_ns)
        self.ids.append(token)
        text = self._text
        piece, eog = self._info(token)
        eog = eog and self._check_eog
        out = "" if eog else text.push(piece)
        stopped = eog or text.stopped
        if stopped or i == self._last_i:
            out += text.flush()
        pred = None
        if self._step_s is not None:
            step = self._step_s(self._n_prompt + i)
            self.steps.append(step)
            pred = step[1]
        self.texts.append(out)
        finish: FinishReason | None = "stop" if stopped else ("length" if i == self._last_i else None)
        return TokenEvent(i, token, out, (t_ns - self._start) * _NS, self._n_prompt + i, pred), finish


@dataclass(slots=True)
class DecodeState:
    """One request's decoding, as the plain and the speculative loop share it: what they read (the
    engine's handle and KV cache, the request) and what they fill (its output tokens, the time spent
    per kind of work), which run_request reads after."""

    handle: LlamaHandle
    kv: KVCache
    req: Request
    output: OutputTokens
    spent: _Spent


def _decode(state: DecodeState) -> Generator[TokenEvent, None, FinishReason]:
    """The plain loop: one llama_decode and one sample per output token."""
    handle, kv, req, out, spent = state.handle, state.kv, state.req, state.output, state.spent
    lib, p = handle.lib, req.params
    ctx = handle.ctx
    decode, sample = lib.llama_decode, lib.llama_sampler_sample
    cancelled = req.cancelled
    one = (ctypes.c_int32 * 1)()
    batch = lib.llama_batch_get_one(one, 1)
    chain = SamplerChain(lib, p, req.seed, handle.n_vocab, history=req.ids)
    smpl = chain.ptr
    tokens = kv.tokens
    token = t_yield = t_decoded = 0  # set by each step, read by the next
    try:
        for i in range(p.max_tokens):
            if i:
                spent.consumer_ns += perf_counter_ns() - t_yield
                if cancelled():
                    return "cancelled"
                one[0] = token
                t_decode = perf_counter_ns()
                rc = decode(ctx, batch)
                t_decoded = perf_counter_ns()
                spent.decode_ns += t_decoded - t_decode
                if rc != 0:
                    raise kv.decode_failed(rc, f"at output token {i}")
                tokens.append(token)
            token = sample(smpl, ctx, -1)
            t = perf_counter_ns()
            if i:
                spent.sample_ns += t - t_decoded
            event, finish = out.commit(token, t)
            t_yield = perf_counter_ns()
            if finish is None:  # the last token's text comes after E2E's end
                spent.detok_ns += t_yield - t
            yield event
            if finish is not None:
                return finish
        return "length"
    finally:
        chain.close()


def _visible_s(req: Request, out: OutputTokens) -> float | None:
    """Seconds to the first token carrying visible text (ondevice.core.reasoning), read after the request.
    A marker that is a control token (rendered as no text) is put back by its id."""
    markers, by_id = req.think
    i = first_visible([by_id.get(t, s) for t, s in zip(out.ids, out.texts)], markers)
    return (out.token_ns[i] - req.start_ns) * _NS if i is not None else None


def _rates(steps: list[tuple[float, float]]) -> tuple[float | None, float | None]:
    """(ceiling tok/s, predicted tok/s) from the mean step over the decode steps (token 1 on)."""
    use = steps[1:] if len(steps) >= 2 else steps
    if not use:
        return None, None
    ceil = sum(s[0] for s in use) / len(use)
    cal = sum(s[1] for s in use) / len(use)
    return (1.0 / ceil if ceil > 0 else None), (1.0 / cal if cal > 0 else None)


class TokenStream:
    """Iterator of TokenEvent; `.generation` is the final Generation once the stream has ended.

    The engine is busy from the moment the stream is made until it ends: run to the end,
    closed (`close()`, the end of a `with` block), or left. Leaving a `for` loop over it early
    (break, an exception), closing or dropping an iterator of it, or dropping the stream
    itself stops the generation there (finish_reason "cancelled"), so the engine is free for
    the next request at once. `next(stream)` steps it without a loop.
    """

    def __init__(self, gen: Generator[TokenEvent, None, Generation], cancel: threading.Event, on_end: Callable):
        self._gen = gen
        self._cancel = cancel
        self._on_end = on_end  # on_end(generation or None) runs exactly once
        self._ended = False
        self.generation: Generation | None = None

    def __iter__(self) -> Iterator[TokenEvent]:
        """The events from here on. An iterator left before the end (a `for` loop's break or
        exception, its close(), or dropping it) closes the stream."""
        try:
            while not self._ended:
                try:
                    event = self.__next__()
                except StopIteration:
                    return
                yield event
        finally:
            self.close()

    def __next__(self) -> TokenEvent:
        if self._ended:
            raise StopIteration
        try:
            return next(self._gen)
        except StopIteration as stop:
            self.generation = stop.value
            self._end(stop.value)
            raise StopIteration from None
        except BaseException:
            self._end(None)
            raise

    def close(self) -> None:
        """Stop at the next step; the Generation (finish_reason "cancelled") stays available."""
        if self._ended:
            return
        self._cancel.set()
        while not self._ended:
            try:
                self.__next__()
            except StopIteration:
                break

    def _end(self, generation: Generation | None) -> None:
        if not self._ended:
            self._ended = True
            self._on_end(generation)

    def __enter__(self) -> TokenStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_ended", True):
            try:
                self.close()
            except Exception:
                pass
