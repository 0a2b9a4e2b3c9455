"""Time a model's shape on this machine: the measurements roofline.timing predicts from.

One engine (the model itself, or its twin) on the engine's own backend, threads and settings:

- chunks of k tokens prefilled from an empty cache, for each k of the plan (up to n_ubatch), and every
  short size (plan.short_chunks: a short prompt's cost is not a line between a few sizes);
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

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from ondevice.core.cpuload import OtherCpu
from ondevice.core.errors import ProbeError
from ondevice.probing.pairs import medians, paired_differences, unsettled, unsteady
from ondevice.probing.plans import BATCH_STEPS, FULL, TimingPlan, plan_for_engine
from ondevice.roofline.attention import decode_kv_padding
from ondevice.roofline.timing import ShapeTiming

__all__ = ["time_engine", "time_pair", "probe_ids", "first_token_s"]  # what is timed, and how often: probing.plans

Progress = Callable[[str], None]


def probe_ids(n_vocab: int, n_tokens: int, salt: int = 0) -> list[int]:
    """A timing run's prompt: BOS, then ids spread over the vocabulary (specials and byte tokens skipped)."""
    span = max(1, n_vocab - 3)
    return [1] + [3 + (i * 97 + salt * 7919) % span for i in range(n_tokens - 1)]


def first_token_s(engine: Any, ids: list[int], reuse: bool, max_tokens: int = 1):
    """(seconds from a request to its first token, tokenizing left out; the generation): how every timed point is
    taken. reuse: keep the KV cache's common prefix with ids (a chunk on top of it), else prefill from empty."""
    g = engine.generate(ids, max_tokens=max_tokens, ignore_eos=True, seed=0, reuse_prefix=reuse)
    return g.timings.ttft_s - g.timings.tokenize_s, g


Measure = Callable[[Any, int], dict[tuple, float]]  # (engine, salt) -> {point: seconds}
_AFTER_CHUNK = 5  # decode steps after each timed chunk (the first left out): decode at many contexts and moments


def _decode_point(g: Any, n_prompt: int) -> dict[tuple, float]:
    """The decode point of a generation's steps after an n_prompt prompt: at the context of their middle."""
    return (
        {("decode", n_prompt + len(g.timings.itl_s) // 2): statistics.fmean(g.timings.itl_s)} if g.timings.itl_s else {}
    )


def _shared_points(
    plan: TimingPlan, vocab: int, batches: dict[int, dict[int, Any]], *, decode: bool = True, after: int = _AFTER_CHUNK
) -> list[tuple[tuple, Measure]]:
    """What a round times on an engine: decode after a short prompt, batched steps (batches: id(engine) ->
    {B: its batch context}), chunks from an empty cache (each of plan.chunks followed by `after` decode steps: decode
    at their context), the longest last (the chain goes on top of it). decode=False: neither the short-context decode
    point nor the steps after the chunks (time_pair's more-block twin: its decode comes from paired bursts)."""
    after = after if decode else 0

    def chunk(k: int) -> Measure:
        steps = after if k in plan.chunks else 0  # a short chunk: its prefill alone

        def measure(eng: Any, salt: int) -> dict[tuple, float]:
            t, g = first_token_s(eng, probe_ids(vocab, k, salt + k), reuse=False, max_tokens=1 + steps)
            return {("prefill", 0, k): t, **_decode_point(g, k)}

        return measure

    def short(eng: Any, salt: int) -> dict[tuple, float]:
        ids = probe_ids(vocab, plan.short_prompt, salt)
        return _decode_point(first_token_s(eng, ids, reuse=False, max_tokens=1 + plan.decode_steps)[1], len(ids))

    def batch(b: int) -> Measure:
        def step(eng: Any, salt: int) -> dict[tuple, float]:
            prompts = [probe_ids(vocab, plan.batch_prompt, salt + i) for i in range(b)]
            bg = batches[id(eng)][b].generate(prompts, max_tokens=1 + BATCH_STEPS, ignore_eos=True, seed=0)
            full = [s for s, n in zip(bg.step_s, bg.step_seqs) if n == b]
            return {("batch", b): statistics.fmean(full)} if full else {}

        return step

    points: list[tuple[tuple, Measure]] = [(("short",), short)] if decode else []
    points += [(("batch", b), batch(b)) for b in plan.batch]
    return points + [(("chunk", k), chunk(k)) for k in plan.prefill_chunks]  # the longest last: the chain's base


def _chain_points(
    engine: Any, plan: TimingPlan, salt: int, *, anchor_s: float, just_timed: bool = False, after: int = _AFTER_CHUNK
) -> tuple[dict[tuple, float], list]:
    """The chain of chunks on top of the longest, each but the last followed by a few decode steps -> ({point:
    seconds}, the chain's prompt; the decode after it is _long_decode's). The longest chunk is prefilled again from an
    empty cache right before the chain, and a link's figure is anchor_s (the round's figure of that chunk) plus
    what the link took beyond that prefill: what attention adds comes from the same moments as what it adds
    to, not from a chunk timed earlier on a machine whose speed drifts (the difference is never negative).
    just_timed: the engine's last request was that chunk (anchor_s its figure, its cache holding it): it is the
    prefill the links are measured against. A model with recurrent layers reuses a cache only where it holds just
    the prompt before (engine.kvcache): no steps after its links, and the longest chunk prefilled again."""
    vocab, out, recurrent = engine.n_vocab, {}, getattr(getattr(engine, "info", None), "recurrent", False)
    longest = max(plan.chunks)
    ids = probe_ids(vocab, longest, salt + longest)  # the chunk point's prompt (_shared_points)
    base_s = anchor_s if just_timed and not recurrent else first_token_s(engine, ids, reuse=False)[0]
    for link in range(plan.chain):
        ids += probe_ids(vocab, longest + 1, salt + 1 + link)[1:]
        steps = 0 if link == plan.chain - 1 or recurrent else after
        t, g = first_token_s(engine, ids, reuse=True, max_tokens=1 + steps)
        out[("prefill", len(ids) - longest, longest)] = anchor_s + max(t - base_s, 0.0)
        out.update(_decode_point(g, len(ids)))  # (the next link reuses ids, not the tokens decoded after them)
    return out, ids


_BURST = 1  # _decode_bursts: decode steps of one engine before switching to the other (switching every step
# follows a drifting machine closest: benchmarks/data/twin_speed/*-burst-size.txt)
_PAIRED_STEPS = 1  # time_pair's decode bursts run this many times plan.decode_steps a round (what they measure is a
# difference, multiplied by the model's blocks over the twin's: the rounds' median of them counts)
# time_pair's attention (the fewer twin's long-context step minus its short one) is the median of as many pairs of
# bursts as fit this many seconds, at most _ATTENTION_BURSTS: one pair of a small twin's bursts takes a fraction of a
# second and between timings it scattered up to 2.6x (Qwen2.5 3B's twins: 0.30-0.78 ms a block), where the median of
# five scattered 1.04x over four timings (benchmarks/data/twin_speed/*-attention-per-block.txt); a large model's
# twin (an 8B's: 0.8 s a pair) still times one pair, its rounds settled by pairs.unsettled as before
_ATTENTION_BUDGET_S = 1.0
_ATTENTION_BURSTS = 5


def _decode_bursts(
    long_engine: Any, long_ids: list, short_engine: Any, short_ids: list, steps: int
) -> tuple[float, float]:
    """(mean step of the first engine, of the second): two engines decoding in alternating bursts of _BURST steps,
    so that what one adds beyond the other (a longer context, more blocks) is measured in the same moments as what
    it adds to (a drifting machine moves both alike)."""
    streams = [
        eng.stream(ids, max_tokens=1 + steps, ignore_eos=True, seed=0, reuse_prefix=True)
        for eng, ids in ((long_engine, long_ids), (short_engine, short_ids))
    ]
    times: tuple[list[float], list[float]] = ([], [])
    try:
        for stream in streams:
            next(stream)  # the prompt (the long one is in the cache but its last token) and the first token
        for _burst in range(max(1, steps // _BURST)):
            for stream, taken in zip(streams, times):
                for _ in range(_BURST):
                    t = time.perf_counter()
                    next(stream)
                    taken.append(time.perf_counter() - t)
    finally:
        for stream in streams:
            stream.close()
    return statistics.fmean(times[0]), statistics.fmean(times[1])


@contextlib.contextmanager
def _timing_session(
    engines: list[Any], plan: TimingPlan, *, decode_only: tuple[Any, ...] = (), long_passes: tuple[Any, ...] = ()
) -> Iterator[dict[int, dict[int, Any]]]:
    """Engines warmed up, the batch contexts of those that do more than decode (not in decode_only) open, their
    requests kept off the callers' seeds. A plan of several rounds warms each of those up with its longest chunk:
    the first pass of that size is the first to use all of the engine's compute buffers, and where fresh memory is
    slow to touch (a VM's), it would make the first round alone slower and the rounds disagree. Not the engines in
    long_passes (a dense model's more-block twin): their longest chunk takes so long that touching the buffers is
    lost in it, and a pass of it to warm up would cost as much as the point it protects."""
    with contextlib.ExitStack() as stack:
        batches: dict[int, dict[int, Any]] = {}
        for eng in engines:
            stack.enter_context(eng.side_requests())
            prefills = all(eng is not d for d in decode_only)
            touches = prefills and plan.rounds > 1 and all(eng is not e for e in long_passes)
            warm = max(plan.chunks) if touches else 8
            eng.generate(probe_ids(eng.n_vocab, warm), max_tokens=2, ignore_eos=True, seed=0, reuse_prefix=False)
            seq = plan.batch_prompt + BATCH_STEPS + 8
            batches[id(eng)] = {
                b: stack.enter_context(contextlib.closing(eng.batched(b, seq_tokens=seq)))
                for b in (plan.batch if prefills else ())
            }
        yield batches


def time_engine(engine: Any, plan: TimingPlan = FULL, *, progress: Progress | None = None) -> ShapeTiming:
    """Time the engine's model (plan cut to its context) -> ShapeTiming. With plan.min_rounds, the rounds after that
    many time only the points the rounds so far disagree on (pairs.unsteady), and none once they agree. The requests
    made here do not move the seeds of the engine's later requests. ProbeError when the model produced no decode
    steps."""
    say = progress or (lambda _msg: None)
    info = engine.info
    plan = plan_for_engine(plan, info.n_ctx, info.n_ubatch)
    other, t0 = OtherCpu(), time.perf_counter()
    rounds: list[dict[tuple, float]] = []
    # the short context the decode after the chain is paired with (_long_decode)
    partner = engine.sibling(plan.short_prompt + 2 * _PAIRED_STEPS * plan.decode_steps)
    with contextlib.closing(partner), _timing_session([engine, partner], plan, decode_only=(partner,)) as batches:
        points = _shared_points(plan, engine.n_vocab, batches)
        figures = _own_figures(plan, [key for key, _m in points])
        say(f"timing {_name(info)} on this machine, once (cached for its shape and these settings)")
        for r in range(plan.rounds):
            again = None if plan.min_rounds is None or r < plan.min_rounds else unsteady(rounds, figures)
            if again == set():
                break
            if plan.rounds > 1:
                what = ", what the rounds disagree on" if again else ""
                say(f"timing {_name(info)}: round {r + 1} of {plan.rounds}{what}")
            out = {}
            for key, measure in points:
                if plan.times(key, r) and (again is None or key in again):
                    out.update(measure(engine, r * 131))
            if again is None or ("chain",) in again:  # on the longest chunk, when it was the last point timed
                just_timed = again is None or ("chunk", max(plan.chunks)) in again
                short_ids = probe_ids(engine.n_vocab, plan.short_prompt, r * 131 + 7)
                known = {**medians(rounds), **out}
                out.update(_long_decode(engine, partner, plan, known, short_ids, r, {}, just_timed=just_timed))
            rounds.append(out)
    return _timing(rounds, plan, info, other.cores(), time.perf_counter() - t0)


def _own_figures(plan: TimingPlan, points: list[tuple]) -> dict[tuple, set[tuple]]:
    """The keys of a round's figures each point of time_engine times (pairs.unsteady): a chunk's prefill, the
    short-context decode, a batch step, and ("chain",), the chain's links and the decode after them."""
    longest, half = max(plan.chunks), plan.decode_steps // 2

    def own(point: tuple) -> tuple:
        if point[0] == "chunk":
            return ("prefill", 0, point[1])
        return ("decode", plan.short_prompt + half) if point == ("short",) else point  # a batch point is its figure

    chain: set[tuple] = {("prefill", i * longest, longest) for i in range(1, plan.chain + 1)}
    chain.add(("decode", longest * (1 + plan.chain) + half))
    return {point: {own(point)} for point in points} | {("chain",): chain}


def time_pair(
    few: Any, many: Any, plan: TimingPlan, *, progress: Progress | None = None
) -> tuple[ShapeTiming, ShapeTiming]:
    """Time two twins of one model, of fewer and more blocks, point by point in turn (which goes first alternates),
    so that a machine whose speed drifts moves both alike: the many-block figure of a point is the fewer one's
    plus the paired differences (pairs.paired_differences). The chain and the decode after it are timed on the
    fewer alone (roofline.extrapolate_layers scales them: attention is the same in every block), on top of its
    prefill of the longest chunk, the round's last point (the fewer twin times it second, every round, so that the
    links are measured against a prefill made right before them and none is made again), that decode in bursts
    alternating with the short-context decode of another engine on the fewer twin's model (few_again, its sibling):
    the difference, which extrapolation multiplies by the model's blocks over the twin's, comes from the same
    moments. The more-block twin decodes only in bursts alternating with few_again's (its decode level at a short
    context); what a longer context adds to it is the fewer twin's attention per cell times its blocks
    (roofline.extrapolate_layers).
    With plan.min_rounds, the rounds after that many time only what the rounds so far disagree on (pairs.unsettled),
    and none once they agree."""
    say = progress or (lambda _msg: None)
    plan = plan_for_engine(plan, min(few.info.n_ctx, many.info.n_ctx), few.info.n_ubatch)
    other, t0 = OtherCpu(), time.perf_counter()
    rounds_few: list[dict[tuple, float]] = []
    diffs: dict[tuple, list[float]] = {}
    # a mixture of experts' more-block twin is warmed with its longest chunk all the same: that pass is also what first
    # reads most experts' weights (a few tokens route through a few), which its first round's chunks would pay for
    long_passes = () if many.info.spec.n_expert else (many,)
    few_again = few.sibling(plan.short_prompt + 2 * _PAIRED_STEPS * plan.decode_steps)
    with (
        contextlib.closing(few_again),
        _timing_session([few, many, few_again], plan, decode_only=(few_again,), long_passes=long_passes) as batches,
    ):
        # no decode steps after the chunks and links: extrapolation puts the fewer twin's decode at every context
        # on the line through its short-context point and the bursts after the chain (roofline.extrapolate_layers)
        points = _shared_points(plan, few.n_vocab, batches, after=0)
        on_many = dict(_shared_points(plan, few.n_vocab, batches, decode=False))
        longest = ("chunk", max(plan.chunks))
        for r in range(plan.rounds):
            again = None if plan.min_rounds is None or r < plan.min_rounds else unsettled(diffs, plan.prefill_chunks)
            if again == set():
                break
            what = ", what the rounds disagree on" if again else ""
            say(f"timing the twins: round {r + 1} of {plan.rounds}{what}")
            out: dict[tuple, float] = {}
            for i, (key, measure) in enumerate(points):
                if plan.times(key, r) and (again is None or key in again):
                    order = 1 if key == longest else r + i  # the longest: the fewer twin last, the chain's base
                    out.update(_in_turn(key, measure, on_many.get(key), (few, many), r, order, diffs))
            short_ids = probe_ids(few.n_vocab, plan.short_prompt, r * 131 + 7)
            if again is None or ("attention",) in again:
                known = {**medians(rounds_few), **out}
                just_timed = again is None or longest in again
                out.update(
                    _long_decode(
                        few,
                        few_again,
                        plan,
                        known,
                        short_ids,
                        r,
                        diffs,
                        just_timed=just_timed,
                        budget_s=_ATTENTION_BUDGET_S,
                        after=0,
                    )
                )
            if again is None or ("blocks",) in again:
                steps = _PAIRED_STEPS * plan.decode_steps
                many_s, few_s = _decode_bursts(many, short_ids, few_again, short_ids, steps)
                diffs.setdefault(("blocks", plan.short_prompt + steps // 2), []).append(many_s - few_s)
            rounds_few.append(out)
    elapsed = time.perf_counter() - t0
    few_timing = _timing(rounds_few, plan, few.info, other.cores(), elapsed)
    shared = paired_differences(diffs)
    many_rounds = [{key: r[key] + shared[key] for key in shared if key in r} for r in rounds_few]
    return few_timing, _timing(many_rounds, replace(plan, chain=0), many.info, other.cores(), 0.0)


def _in_turn(
    key: tuple, measure: Measure, on_many: Measure | None, twins: tuple[Any, Any], r: int, order: int, diffs: dict
) -> dict[tuple, float]:
    """One point of a round of time_pair: the fewer twin's figures (-> returned) and, where the more-block twin times
    it too (on_many), the two in turn, the fewer first when order is even, their differences appended to diffs."""
    few, many = twins
    if on_many is None:
        return measure(few, r * 131)
    if order % 2 == 0:
        mine, theirs = measure(few, r * 131), on_many(many, r * 131)
    else:
        theirs, mine = on_many(many, r * 131), measure(few, r * 131)
    for point in mine.keys() & theirs.keys():
        diffs.setdefault(point, []).append(theirs[point] - mine[point])
    return mine


def _long_decode(
    engine: Any,
    partner: Any,
    plan: TimingPlan,
    known: dict,
    short_ids: list,
    r: int,
    diffs: dict,
    *,
    just_timed: bool = False,
    budget_s: float = 0.0,
    after: int = _AFTER_CHUNK,
) -> dict[tuple, float]:
    """The chain on `engine` and the decode after it: the short-context decode point plus what the long context added
    in bursts alternating with partner's decode at a short context (another engine on the same model: the difference
    comes from the same moments, whatever the machine's speed then; it is appended to diffs under ("attention",
    context): time_pair's pairs.unsettled weighs it). The chain's links are measured against a prefill of the longest
    chunk made right before them (just_timed: the engine's last request was that chunk), not an earlier figure of it
    (another twin's chunk between them): what they add is attention, which a twin's timing multiplies by the model's
    blocks over the twin's. known: the round's figures, or, in a round that times only what the earlier ones disagree
    on, their medians. budget_s: the difference is the median over as many pairs of bursts as the short-context step
    (known) says fit these seconds, from one to _ATTENTION_BURSTS. after: decode steps after each link but the last."""
    anchor_s = known[("prefill", 0, max(plan.chunks))]
    chain, ids = _chain_points(engine, plan, salt=r * 131, anchor_s=anchor_s, just_timed=just_timed, after=after)
    short = ("decode", plan.short_prompt + plan.decode_steps // 2)
    steps = _PAIRED_STEPS * plan.decode_steps
    pairs = _attention_pairs(budget_s, 2 * steps * known[short])
    # a longer context never makes a step faster: below zero is noise (on a tiny model it can outweigh the short step)
    added = [
        long_s - short_s
        for long_s, short_s in (_decode_bursts(engine, ids, partner, short_ids, steps) for _ in range(pairs))
    ]
    added_s = max(0.0, statistics.median(added))
    diffs.setdefault(("attention", len(ids)), []).append(added_s)
    chain[("decode", len(ids) + plan.decode_steps // 2)] = known[short] + added_s
    return chain


def _attention_pairs(budget_s: float, pair_s: float) -> int:
    """How many pairs of decode bursts of pair_s seconds each the attention is the median of: as many as fit budget_s,
    from one to _ATTENTION_BURSTS."""
    if not pair_s > 0:
        return 1
    return max(1, min(_ATTENTION_BURSTS, int(budget_s / pair_s)))


def _name(info: Any) -> str:
    return str(info.model_path).rsplit("/", 1)[-1]


def _timing(rounds: list[dict[tuple, float]], plan: TimingPlan, info: Any, other: float, elapsed: float) -> ShapeTiming:
    """The median round of each point, and the spread of the rounds."""
    points = {key: [r[key] for r in rounds if key in r and math.isfinite(r[key])] for key in rounds[0]}
    points = {key: ts for key, ts in points.items() if ts}  # a batch that never ran every sequence: no point
    if not any(key[0] == "decode" for key in points):
        raise ProbeError(f"timing {_name(info)}: no decode steps were measured")
    best = {key: statistics.median(ts) for key, ts in points.items()}
    kv_pad, kv_pad_from = decode_kv_padding(info.backend, info.flash_attn_used, info.cache_type_k, info.cache_type_v)
    spreads = [max(ts) / min(ts) - 1 for ts in points.values() if len(ts) > 1]
    spread = statistics.median(spreads) if spreads else 0.0
    return ShapeTiming(
        decode=tuple(sorted((key[1], t) for key, t in best.items() if key[0] == "decode")),
        prefill=tuple(sorted((key[1], key[2], t) for key, t in best.items() if key[0] == "prefill")),
        batch=tuple(sorted((key[1], t) for key, t in best.items() if key[0] == "batch")),
        batch_ctx=plan.batch_prompt + BATCH_STEPS // 2 if plan.batch else 0,
        n_ubatch=int(info.n_ubatch),
        kv_pad=kv_pad,
        kv_pad_from=kv_pad_from,
        plan=plan.name,
        spread=spread,
        other_cpu_cores=other,
        elapsed_s=elapsed,
        created_unix_s=time.time(),
    )
