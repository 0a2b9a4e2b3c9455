"""One measured request per scenario, as a plain consumer of Engine.stream.

Nothing here runs inside the engine's decode loop: a request is iterated to its end with
no work per token, and the engine's own timings (one timing path)
are what gets recorded. A time-out sets the stream's cancel event from a timer thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ondevice.bench.oscache import PeakRss
from ondevice.bench.runs import COLD_START, NO_KV_CACHE, PREFIX_HIT, RESIDENT, RunRecord, RunStatus
from ondevice.core.metrics import timings_from_marks
from ondevice.core.results import Generation

__all__ = [
    "RequestContext",
    "resident_run",
    "prefix_hit_run",
    "no_kv_cache_run",
    "cold_start_run",
    "request",
    "record",
    "suffix_tokens",
]


@dataclass(frozen=True)
class RequestContext:
    """What every request of one model and repeat shares."""

    engine: Any  # the Engine (or anything with its stream() contract)
    model: str  # model label
    repeat: int  # 0-based repeat index
    sampling: Mapping[str, Any]  # temperature, top_k, top_p, min_p, repeat_penalty
    timeout_s: float | None  # per request; None = no limit
    rss: PeakRss  # peak-RSS meter


class _Outcome:
    """Result of one stream: the Generation (possibly partial) and a status."""

    def __init__(self) -> None:
        self.generation: Generation | None = None
        self.status: RunStatus = "ok"
        self.reason = ""


def request(
    ctx: RequestContext, ids: str | Sequence[int], max_tokens: int, seed: int, *, reuse_prefix: bool, **stream_kw: Any
) -> _Outcome:
    """Run one stream to its end; never raises except KeyboardInterrupt (after closing it).
    ids: token ids, or text (tokenized by the engine, inside the request's timing);
    stream_kw: more stream() arguments (speculative=...)."""
    out = _Outcome()
    cancel = threading.Event()
    timer = threading.Timer(ctx.timeout_s, cancel.set) if ctx.timeout_s else None
    stream = None
    try:
        stream = ctx.engine.stream(
            ids if isinstance(ids, str) else list(ids),
            max_tokens=max_tokens,
            seed=seed,
            ignore_eos=True,
            cancel=cancel,
            reuse_prefix=reuse_prefix,
            **dict(ctx.sampling),
            **stream_kw,
        )
        if timer:
            timer.daemon = True
            timer.start()
        for _ in stream:
            pass
        out.generation = stream.generation
    except KeyboardInterrupt:
        if stream is not None:
            stream.close()
        raise
    except Exception as exc:  # an engine error is a failed run, kept with its reason
        out.status, out.reason = "failed", f"{type(exc).__name__}: {exc}"
        return out
    finally:
        if timer:
            timer.cancel()
    g = out.generation
    if g is None:
        out.status, out.reason = "failed", "the stream ended without a result"
    elif cancel.is_set():
        out.status, out.reason = (
            "timeout",
            f"timeout after {ctx.timeout_s:g} s ({len(g.token_ids)} of {max_tokens} tokens)",
        )
    elif len(g.token_ids) < max_tokens:
        out.status, out.reason = (
            "failed",
            f"stopped after {len(g.token_ids)} of {max_tokens} tokens ({g.finish_reason})",
        )
    return out


def record(
    ctx: RequestContext, scenario: str, workload: str, n_out: int, seed: int, out: _Outcome, **extra
) -> RunRecord:
    """The RunRecord of one request's outcome (extra: more RunRecord fields)."""
    g = out.generation
    return RunRecord(
        model=ctx.model,
        scenario=scenario,
        workload=workload,
        repeat=ctx.repeat,
        status=out.status,
        reason=out.reason,
        prompt_tokens=g.prompt_tokens if g else extra.pop("prompt_tokens", 0),
        output_tokens_requested=n_out,
        cached_prompt_tokens=g.cached_prompt_tokens if g else 0,
        finish_reason=g.finish_reason if g else None,
        timings=g.timings if g else None,
        peak_rss_bytes=ctx.rss.read_bytes(),
        seed=seed,
        attribution=g.attribution.to_dict() if g and g.attribution else None,
        other_cpu_cores=g.other_cpu_cores if g else None,
        **{k: v for k, v in extra.items() if k != "prompt_tokens"},
    )


def resident_run(ctx: RequestContext, workload: str, ids: Sequence[int], n_out: int, seed: int) -> RunRecord:
    """The model in memory, the KV cache cleared first: no prefix hit."""
    ctx.rss.reset()
    out = request(ctx, ids, n_out, seed, reuse_prefix=False)
    rec = record(ctx, RESIDENT, workload, n_out, seed, out, prompt_tokens=len(ids))
    if rec.cached_prompt_tokens:
        rec = replace(rec, notes=rec.notes + (f"unexpected cache hit of {rec.cached_prompt_tokens} tokens",))
    return rec


def suffix_tokens(prompt_tokens: int) -> int:
    """New tokens after the shared prefix in the prefix-hit scenario: P/8, 1..256."""
    return max(1, min(256, prompt_tokens // 8))


def prefix_hit_run(
    ctx: RequestContext,
    workload: str,
    prefix: Sequence[int],
    suffix_a: Sequence[int],
    suffix_b: Sequence[int],
    n_out: int,
    seed: int,
) -> RunRecord:
    """Prime the cache with prefix+suffix_a (one token, nothing cached: the baseline TTFT),
    then measure prefix+suffix_b with prefix reuse on."""
    ctx.rss.reset()
    prime = request(ctx, list(prefix) + list(suffix_a), 1, seed, reuse_prefix=False)
    p = len(prefix) + len(suffix_b)
    if prime.status != "ok" or prime.generation is None:
        return record(ctx, PREFIX_HIT, workload, n_out, seed, prime, prompt_tokens=p)
    baseline = prime.generation.timings.ttft_s
    out = request(ctx, list(prefix) + list(suffix_b), n_out, seed, reuse_prefix=True)
    rec = record(ctx, PREFIX_HIT, workload, n_out, seed, out, prompt_tokens=p, baseline_ttft_s=baseline)
    if out.status == "ok" and rec.cached_prompt_tokens < len(prefix):
        recurrent = getattr(getattr(ctx.engine, "info", None), "recurrent", False)
        why = " (a recurrent state is not cut back to a prefix)" if recurrent else ""
        note = f"only {rec.cached_prompt_tokens} of {len(prefix)} prefix tokens were cached{why}"
        rec = replace(rec, notes=rec.notes + (note,))
    return rec


def no_kv_cache_run(ctx: RequestContext, workload: str, ids: Sequence[int], n_out: int, seed: int) -> RunRecord:
    """The ablation: every output token recomputes the whole context (prompt + outputs so far),
    as a runtime without a KV cache would. Token i is available when its one-token request
    samples it; ITLs are the gaps between those moments."""
    ctx.rss.reset()
    context = list(ids)
    marks: list[int] = []
    prefill_s = 0.0
    deadline = time.perf_counter() + ctx.timeout_s if ctx.timeout_s else None
    start_ns = time.perf_counter_ns()
    status: RunStatus = "ok"
    reason = ""
    for i in range(n_out):
        call_ns = time.perf_counter_ns()
        left_s = deadline - time.perf_counter() if deadline else None
        step_ctx = replace(ctx, timeout_s=left_s)
        if left_s is not None and left_s <= 0:
            status, reason = "timeout", f"timeout after {ctx.timeout_s:g} s ({i} of {n_out} tokens)"
            break
        out = request(step_ctx, context, 1, seed + i, reuse_prefix=False)
        g = out.generation
        if out.status != "ok" or g is None or not g.token_ids:
            status = "timeout" if out.status == "timeout" else "failed"
            reason = out.reason if status == "failed" else f"timeout after {ctx.timeout_s:g} s ({i} of {n_out} tokens)"
            break
        if i == 0:
            prefill_s = g.timings.prefill_s
        marks.append(call_ns + round(g.timings.ttft_s * 1e9))
        context.append(g.token_ids[0])
    timings = timings_from_marks(start_ns, start_ns, start_ns, start_ns + round(prefill_s * 1e9), marks, len(ids))
    return RunRecord(
        model=ctx.model,
        scenario=NO_KV_CACHE,
        workload=workload,
        repeat=ctx.repeat,
        status=status,
        reason=reason,
        prompt_tokens=len(ids),
        output_tokens_requested=n_out,
        finish_reason="length" if status == "ok" else None,
        timings=timings,
        peak_rss_bytes=ctx.rss.read_bytes(),
        seed=seed,
    )


def cold_start_run(
    ctx: RequestContext,
    workload: str,
    path: Any,
    load: Callable[[], Any],
    prompt: str | Sequence[int],
    n_prompt: int,
    seed: int,
    *,
    notes: Sequence[str] = (),
    clock: Callable[[], int] = time.perf_counter_ns,
) -> tuple[RunRecord, Any]:
    """The cold start (ondevice.bench.coldstart): drop `path` (every file of it) from the page cache, call load(),
    then one request for one token; (record, the loaded engine or None). ctx.engine is unused
    (the engine is the one loaded here); n_prompt: the prompt's length in tokens. A page cache
    that cannot be dropped skips the run. clock: nanoseconds (tests pass their own)."""
    from ondevice.core.pagecache import evict_files
    from ondevice.gguf.reader import model_files

    def lost(status: RunStatus, reason: str, **extra: Any) -> RunRecord:
        return RunRecord(
            ctx.model,
            COLD_START,
            workload,
            ctx.repeat,
            status,
            reason=reason,
            prompt_tokens=n_prompt,
            output_tokens_requested=1,
            seed=seed,
            **extra,
        )

    ev = evict_files(model_files(path))  # a split model: every file
    if not ev.evicted:
        return lost("skipped", ev.note), None
    ctx.rss.reset()
    t0 = clock()
    try:
        engine = load()
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        return lost("failed", f"{type(exc).__name__}: {exc}", resident_before_load=ev.resident_after), None
    handed_ns = clock()
    out = request(replace(ctx, engine=engine), prompt, 1, seed, reuse_prefix=False)
    g = out.generation
    first = g is not None and g.timings.output_tokens > 0
    cold_s = (handed_ns - t0) * 1e-9 + g.timings.ttft_s if g is not None and first else None
    rec = record(
        ctx,
        COLD_START,
        workload,
        1,
        seed,
        out,
        prompt_tokens=n_prompt,
        load_s=float(engine.info.load_s),
        load_call_s=(handed_ns - t0) * 1e-9,
        resident_before_load=ev.resident_after,
        cold_start_s=cold_s,
        notes=tuple(n for n in (ev.note, *notes) if n),
    )
    return rec, engine
