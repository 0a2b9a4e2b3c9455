"""A server request's stream -> a RunRecord with docs/metrics.md's timings, seen from the client.

- Start: the client sends the request. TTFT: the first chunk carrying output text (reasoning
  text included: it is output). E2E: the last such chunk. Time to first *visible* token: the
  first chunk of text outside the reasoning (ondevice.core.reasoning; a server's reasoning deltas
  are never visible).
- Output tokens T, by the first source that has them: the server's usage
  (`stream_options.include_usage`), the server's own timings (llama-server, Ollama), the
  model's tokenizer (`--tokenizer`) over the streamed text, else one token per chunk, labelled
  "estimated".
- Tokens per chunk: one each when T equals the chunks; else T shared out over the chunks in
  proportion to their tokenizer counts (or their characters), every chunk at least one.
- ITL per token (`itl_s`): a chunk's k tokens are spread evenly over the gap since the previous
  chunk (the first chunk's tokens all arrive at TTFT), so the T-1 gaps add up to E2E - TTFT
  and TPOT = (E2E - TTFT)/(T - 1) = their mean, as in-process. ITL per chunk (`serve.itl_chunk_s`):
  the gaps between chunks, C - 1 of them, what a client really waits between updates.
- Prefill: only the server can time it; its reported prompt time fills prefill_s when it sends
  one (else 0 and no prefill rate). tokenize_s is 0: the client sends text.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ondevice.bench.runs import RunRecord
from ondevice.bench.serve.client import StreamLog
from ondevice.core.metrics import timings_from_marks
from ondevice.core.reasoning import ThinkMarkers, first_visible

__all__ = ["RequestSpec", "to_record", "shares", "token_marks", "count_output"]

Counter = Callable[[str], int]  # text -> tokens in the model's tokenizer
_NS = 1e-9


@dataclass(frozen=True)
class RequestSpec:
    """What was asked of one request."""

    model: str  # model label in the results
    scenario: str  # the load level, e.g. "closed_c2", "open_r0.5"
    workload: str  # workload name
    index: int  # 0-based request index within the level (the record's repeat)
    prompt_tokens: int  # P as built (exact with a tokenizer, else estimated)
    output_tokens: int  # N asked for
    seed: int  # sampling seed sent


def count_output(log: StreamLog, counter: Counter | None) -> tuple[int, str]:
    """(T, where T came from)."""
    completion = (log.usage or {}).get("completion_tokens")
    if isinstance(completion, int) and completion >= 0 and not isinstance(completion, bool):
        return completion, "usage"
    server_timings = log.server_timings or {}
    timed = server_timings.get("output_tokens")
    if isinstance(timed, int) and timed >= 0:
        return timed, server_timings.get("source", "server timings")
    if counter is not None:
        return counter("".join(c.reasoning + c.text for c in log.chunks)), "tokenizer"
    return len(log.chunks), "estimated (1 token per chunk)"


def shares(total: int, weights: Sequence[float]) -> list[int]:
    """`total` split over len(weights) parts in proportion to the weights (largest remainder),
    every part at least 1 when total allows; the parts add up to total."""
    n = len(weights)
    if n == 0:
        return []
    if total <= n:
        return [1 if i < total else 0 for i in range(n)]
    w = [max(float(x), 0.0) for x in weights]
    if sum(w) <= 0:
        w = [1.0] * n
    spare = total - n
    raw = [spare * x / sum(w) for x in w]
    out = [1 + int(r) for r in raw]
    order = sorted(range(n), key=lambda i: raw[i] - int(raw[i]), reverse=True)
    for i in order[: total - sum(out)]:
        out[i] += 1
    return out


def token_marks(chunk_ns: Sequence[int], counts: Sequence[int]) -> list[int]:
    """Token arrival times: chunk j's counts[j] tokens spread evenly over the gap since chunk j-1."""
    marks: list[int] = []
    for j, (t, k) in enumerate(zip(chunk_ns, counts)):
        if k <= 0:
            continue
        if j == 0 or not marks:
            marks += [t] * k
            continue
        prev = marks[-1]
        marks += [prev + round((t - prev) * (m + 1) / k) for m in range(k)]
    return marks


def _counts(log: StreamLog, total: int, counter: Counter | None) -> list[int]:
    n = len(log.chunks)
    if total == n:
        return [1] * n
    if total < n:  # fewer tokens than chunks: the tokens at evenly chosen chunks, first and last included
        picks = {round(j * (n - 1) / (total - 1)) for j in range(total)} if total > 1 else {0}
        return [1 if j in picks else 0 for j in range(n)]
    texts = [c.reasoning + c.text for c in log.chunks]
    weights = [counter(t) for t in texts] if counter is not None else [len(t) for t in texts]
    return shares(total, weights)


def to_record(
    log: StreamLog, spec: RequestSpec, *, counter: Counter | None, markers: ThinkMarkers | None, level_start_ns: int
) -> RunRecord:
    """The RunRecord of one request (ok, failed or timeout; a failure keeps what arrived)."""
    total, source = count_output(log, counter) if log.chunks else (0, "none")
    counts = _counts(log, total, counter) if log.chunks else []
    marks = token_marks([c.t_ns for c in log.chunks], counts)
    st = log.server_timings or {}
    prefill_ns = round(st["prompt_s"] * 1e9) if st.get("prompt_s") is not None else 0
    computed = (st.get("prompt_tokens") or 0) if prefill_ns else 0
    timings = None
    if marks:
        timings = timings_from_marks(
            log.start_ns, log.start_ns, log.start_ns, log.start_ns + prefill_ns, marks, computed
        )
        visible = first_visible([c.text for c in log.chunks], markers)
        timings = replace(
            timings, ttft_visible_s=(log.chunks[visible].t_ns - log.start_ns) * _NS if visible is not None else None
        )
    chunk_ns = [c.t_ns for c in log.chunks]
    status, reason, notes = log.status, log.reason, []
    if status == "ok" and not log.chunks:
        status, reason = "failed", f"no output text (finish_reason {log.finish_reason!r})"
    if status == "ok" and source != "estimated (1 token per chunk)" and total < spec.output_tokens:
        notes.append(f"stopped after {total} of {spec.output_tokens} tokens (finish_reason {log.finish_reason!r})")
    usage = log.usage or {}
    return RunRecord(
        model=spec.model,
        scenario=spec.scenario,
        workload=spec.workload,
        repeat=spec.index,
        status=status,
        reason=reason,
        prompt_tokens=int(usage.get("prompt_tokens") or spec.prompt_tokens),
        output_tokens_requested=spec.output_tokens,
        finish_reason=log.finish_reason,
        timings=timings,
        seed=spec.seed,
        notes=tuple(notes),
        serve={
            "sent_s": (log.start_ns - level_start_ns) * _NS,
            "done_s": (log.end_ns - level_start_ns) * _NS,
            "chunks": len(log.chunks),
            "itl_chunk_s": [(b - a) * _NS for a, b in zip(chunk_ns, chunk_ns[1:])],
            "tokens_per_chunk": counts if any(k != 1 for k in counts) else None,
            "token_count": source,
            "reasoning_chunks": sum(1 for c in log.chunks if c.reasoning),
            "usage": log.usage,
            "server_timings": log.server_timings,
            "http_status": log.http_status,
        },
    )
