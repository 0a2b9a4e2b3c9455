"""Time a model's shape on this machine: the measurements roofline.timing predicts from.

One engine (the model itself, or its twin) on the engine's own backend, threads and settings:

- chunks of k tokens prefilled from an empty cache, for each k of the plan (up to n_ubatch);
- after the longest, `chain` more chunks as long, each on top of the last (what attention over the
  cached tokens adds as a prompt grows), then decode steps there (the long-context decode point);
- decode steps after a short prompt (the short-context decode point);
- with plan.batch, one decode step of B sequences for each B (speculative verify and batched decoding).

A decode point is the mean of its steps (what TPOT, the mean inter-token latency, measures). Each point
is timed in plan.rounds rounds, the points of a round one after another, and the median round's figure
kept: one round's burst from another process is not the model's speed, and the median of three is no
faster than a typical run either (the timing says how much CPU other processes took meanwhile, and how
far the rounds spread).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from ondevice.core.cpuload import OtherCpu
from ondevice.core.errors import ProbeError
from ondevice.roofline.timing import ShapeTiming

__all__ = ["TimingPlan", "FULL", "QUICK", "time_engine", "probe_ids", "plan_for_engine"]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class TimingPlan:
    """What to time, and how often."""

    name: str = "full"  # "full" or "quick" (ShapeTiming.plan)
    chunks: tuple[int, ...] = (1, 4, 16, 64, 128, 512)  # chunk sizes prefilled from an empty cache (<= n_ubatch)
    chain: int = (
        3  # chunks as long as the longest prefilled on top of it, one after another: attention as a prompt grows
    )
    short_prompt: int = 16  # prompt tokens before the short-context decode steps
    decode_steps: int = 16  # decode steps timed at each context (their mean counts)
    batch: tuple[int, ...] = (2, 4, 8, 16)  # sequences per batched decode step
    rounds: int = 3  # every point is timed this many times; the fastest round counts

    @property
    def tokens(self) -> int:
        """Tokens one round computes (the chunk on top reuses the longest chunk's cache): what its cost grows with."""
        on_top = self.chain * max(self.chunks) + self.decode_steps
        batch = sum(b * (self.short_prompt + self.decode_steps) for b in self.batch)
        return sum(self.chunks) + on_top + self.short_prompt + self.decode_steps + batch


FULL = TimingPlan()  # `ondevice probe`, `ondevice predict`, `ondevice bench`
# a first run: a second or two on a small model (chunks up to 256, one on top, fewer decode steps, one round)
QUICK = TimingPlan(name="quick", chunks=(1, 16, 128, 256), chain=1, decode_steps=8, batch=(), rounds=1)


def plan_for_engine(plan: TimingPlan, n_ctx: int, n_ubatch: int) -> TimingPlan:
    """The plan cut to what an engine's context holds: chunks of at most n_ubatch tokens (a longer one is
    several passes) and, with the chain on top and the decode steps, within n_ctx; the longest that fits
    replaces the chunks that do not."""
    room = (n_ctx - plan.decode_steps - 8) // (1 + plan.chain)
    longest = min(n_ubatch, room)
    chunks = tuple(sorted(k for k in plan.chunks if k <= longest))  # the longest last: the chunk on top reuses it
    if len(chunks) < len(plan.chunks):  # the longest chunk the engine holds stands in for those it does not
        chunks = (*chunks, max(1, longest))
    return replace(plan, chunks=chunks)


def probe_ids(n_vocab: int, n_tokens: int, salt: int = 0) -> list[int]:
    """A timing run's prompt: BOS, then ids spread over the vocabulary (specials and byte tokens skipped)."""
    span = max(1, n_vocab - 3)
    return [1] + [3 + (i * 97 + salt * 7919) % span for i in range(n_tokens - 1)]


def _first_token_s(engine: Any, ids: list[int], reuse: bool, max_tokens: int = 1):
    g = engine.generate(ids, max_tokens=max_tokens, ignore_eos=True, seed=0, reuse_prefix=reuse)
    return g.timings.ttft_s - g.timings.tokenize_s, g


def _round(engine: Any, plan: TimingPlan, salt: int) -> dict[tuple, float]:
    """One round: every point of the plan once -> {point: seconds}."""
    vocab, out = engine.n_vocab, {}
    for k in plan.chunks:
        out[("prefill", 0, k)], _ = _first_token_s(engine, probe_ids(vocab, k, salt + k), reuse=False)
    longest = max(plan.chunks)
    ids = probe_ids(vocab, longest, salt + longest)  # the longest chunk's prompt: the cache holds it now
    for link in range(plan.chain):
        ids += probe_ids(vocab, longest + 1, salt + 1 + link)[1:]
        steps = plan.decode_steps if link == plan.chain - 1 else 0
        t, g = _first_token_s(engine, ids, reuse=True, max_tokens=1 + steps)
        out[("prefill", len(ids) - longest, longest)] = t
    if plan.chain:
        out[("decode", len(ids) + plan.decode_steps // 2)] = statistics.fmean(g.timings.itl_s)
    _t, g = _first_token_s(
        engine, probe_ids(vocab, plan.short_prompt, salt), reuse=False, max_tokens=1 + plan.decode_steps
    )
    out[("decode", plan.short_prompt + plan.decode_steps // 2)] = statistics.fmean(g.timings.itl_s)
    return out


def _batch_round(batches: dict[int, Any], plan: TimingPlan, vocab: int, salt: int) -> dict[tuple, float]:
    out = {}
    for b, ctx in batches.items():
        prompts = [probe_ids(vocab, plan.short_prompt, salt + i) for i in range(b)]
        bg = ctx.generate(prompts, max_tokens=1 + plan.decode_steps, ignore_eos=True, seed=0)
        full = [s for s, n in zip(bg.step_s, bg.step_seqs) if n == b]
        if full:
            out[("batch", b)] = statistics.fmean(full)
    return out


def time_engine(engine: Any, plan: TimingPlan = FULL, *, progress: Progress | None = None) -> ShapeTiming:
    """Time the engine's model (plan cut to its context) -> ShapeTiming. The requests made here do not
    move the seeds of the engine's later requests. ProbeError when the model produced no decode steps."""
    say = progress or (lambda _msg: None)
    info = engine.info
    plan = plan_for_engine(plan, info.n_ctx, info.n_ubatch)
    other, t0 = OtherCpu(), time.perf_counter()
    rounds: list[dict[tuple, float]] = []
    batches = {}
    with engine.side_requests():
        try:
            engine.generate(probe_ids(engine.n_vocab, 8), max_tokens=2, ignore_eos=True, seed=0, reuse_prefix=False)
            batches = {b: engine.batched(b, seq_tokens=plan.short_prompt + plan.decode_steps + 8) for b in plan.batch}
            say(f"timing {_name(info)} on this machine, once (cached for its shape and these settings)")
            for r in range(plan.rounds):
                if plan.rounds > 1:
                    say(f"timing {_name(info)}: round {r + 1} of {plan.rounds}")
                points = _round(engine, plan, salt=r * 131)
                points.update(_batch_round(batches, plan, engine.n_vocab, salt=r * 131))
                rounds.append(points)
        finally:
            for ctx in batches.values():
                ctx.close()
    return _timing(rounds, plan, info, other.cores(), time.perf_counter() - t0)


def _name(info: Any) -> str:
    return str(info.model_path).rsplit("/", 1)[-1]


def _timing(rounds: list[dict[tuple, float]], plan: TimingPlan, info: Any, other: float, elapsed: float) -> ShapeTiming:
    """The median round of each point, and the spread of the rounds."""
    points = {key: [r[key] for r in rounds if key in r] for key in rounds[0]}
    if not any(key[0] == "decode" for key in points):
        raise ProbeError(f"timing {_name(info)}: no decode steps were measured")
    best = {key: statistics.median(ts) for key, ts in points.items()}
    spread = statistics.median([max(ts) / min(ts) - 1 for ts in points.values()]) if len(rounds) > 1 else 0.0
    return ShapeTiming(
        decode=tuple(sorted((key[1], t) for key, t in best.items() if key[0] == "decode")),
        prefill=tuple(sorted((key[1], key[2], t) for key, t in best.items() if key[0] == "prefill")),
        batch=tuple(sorted((key[1], t) for key, t in best.items() if key[0] == "batch")),
        batch_ctx=plan.short_prompt + plan.decode_steps // 2 if plan.batch else 0,
        n_ubatch=int(info.n_ubatch),
        plan=plan.name,
        spread=spread,
        other_cpu_cores=other,
        elapsed_s=elapsed,
        created_unix_s=time.time(),
    )
