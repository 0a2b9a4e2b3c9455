"""What timing rounds say (probing.timing): whether two twins' paired rounds so far agree on each difference that
extrapolation multiplies (unsettled), the more-block twin's figures from the paired differences (paired_differences),
and which of a whole model's points its rounds so far disagree on (unsteady). Arithmetic only: the engines are
timing.py's."""

from __future__ import annotations

import statistics

from ondevice.roofline.timing import robust_line

__all__ = ["medians", "paired_differences", "unsettled", "unsteady"]


def medians(rounds: list[dict[tuple, float]]) -> dict[tuple, float]:
    """The median over rounds of each point they timed."""
    keys = {key for r in rounds for key in r}
    return {key: statistics.median(r[key] for r in rounds if key in r) for key in keys}


_SETTLED = 0.10  # time_pair's rounds agree when their multiplied differences lie within this of each other
# ... and their attention differences within this: a long-context step minus a short one, a small difference of two
# means of a few steps each, whose rounds scatter more than the chunks' (a quarter holds most quiet pairs of rounds)
_SETTLED_ATTENTION = 0.25


def unsettled(diffs: dict[tuple, list[float]], chunks: tuple[int, ...]) -> set[tuple]:
    """The points of time_pair whose rounds so far disagree on a difference extrapolation multiplies: ("blocks",), the
    twins' decode level, ("attention",), what the fewer twin's long context adds to its decode step, and
    ("chunk", k), their prefill of a chunk of k tokens, for each k (they agree when all are positive and max over
    min lies within 1 + _SETTLED, 1 + _SETTLED_ATTENTION for attention; not measured yet: they do not). Every
    point counts: with two rounds a point's figure is their mean, and a moment that slowed one of them (a
    machine's noise only ever slows) would be multiplied by the model's blocks over the twins' into the decode or
    TTFT of prompts of that length."""

    def of(kind: str) -> list[float]:
        return [d for key, ds in diffs.items() if key[0] == kind for d in ds]

    points: list[tuple[tuple, list[float], float]] = [
        (("blocks",), of("blocks"), _SETTLED),
        (("attention",), of("attention"), _SETTLED_ATTENTION),
    ]
    points += [(("chunk", k), diffs.get(("prefill", 0, k), []), _SETTLED) for k in chunks]
    return {point for point, ds, within in points if not _agree(ds, within)}


def unsteady(rounds: list[dict[tuple, float]], figures: dict[tuple, set[tuple]]) -> set[tuple]:
    """The points of a whole model's timing (probing.timing.time_engine) whose rounds so far disagree: figures maps a
    point to the keys of its figures in a round; a point disagrees when any of them, over the rounds that timed it,
    spreads more than _SETTLED (max over min), or none was timed. A whole model's figures are not multiplied, but the
    median of two rounds is their mean, and a busy moment (noise only ever slows) would be half of it."""

    def steady(keys: set[tuple]) -> bool:
        return all(_agree([r[key] for r in rounds if key in r]) for key in keys)

    return {point for point, keys in figures.items() if not steady(keys)}


def _agree(values: list[float], within: float = _SETTLED) -> bool:
    """Whether rounds' figures of one point agree: some were measured, all positive, max over min within 1 + within."""
    return bool(values) and min(values) > 0 and max(values) / min(values) - 1 <= within


def paired_differences(diffs: dict[tuple, list[float]]) -> dict[tuple, float]:
    """What the more-block twin took beyond the fewer at each point: the median of its paired differences. The
    decode differences lie on a line over their contexts: its slope (what more blocks' attention adds as the
    context grows) a robust line through the ("decode", context) differences (each point's few steps alone are
    noisy; none: no slope), its level the median of the ("blocks", context) differences, long decode bursts of
    both twins alternating (without those, the robust line's own level). The line gives a decode difference at
    every context either kind was timed at."""
    shared = {key: statistics.median(d) for key, d in diffs.items() if key[0] not in ("decode", "blocks", "attention")}
    decode = [(float(key[1]), d) for key, ds in diffs.items() if key[0] == "decode" for d in ds]
    blocks = [(float(key[1]), d) for key, ds in diffs.items() if key[0] == "blocks" for d in ds]
    if not decode and not blocks:
        return shared
    b = robust_line(decode)[1] if len({ctx for ctx, _d in decode}) > 1 else 0.0
    a = statistics.median(d - b * ctx for ctx, d in (blocks or decode))
    contexts = {int(ctx) for ctx, _d in decode + blocks}
    shared.update({("decode", ctx): a + b * ctx for ctx in contexts})
    return shared
