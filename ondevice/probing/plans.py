"""What a timing times, and how often: the plans of probing.timing (the full one, a large model's twins', a model
known by its header, a first run's) and a plan cut to what an engine holds."""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = [
    "TimingPlan",
    "SHORT_CHUNKS",
    "FULL",
    "QUICK",
    "TWINS",
    "UNBATCHED",
    "BATCH_STEPS",
    "plan_for_engine",
    "plan_context",
]

BATCH_STEPS = 8  # batched decode steps timed per batch size (each step decodes every sequence: a long one)


@dataclass(frozen=True)
class TimingPlan:
    """What to time, and how often."""

    name: str = "full"  # "full" or "quick" (ShapeTiming.plan)
    chunks: tuple[int, ...] = (1, 4, 16, 64, 128, 512)  # chunk sizes prefilled from an empty cache (<= n_ubatch)
    # sizes below the longest chunk also prefilled from an empty cache, with no decode steps after them (SHORT_CHUNKS)
    short_chunks: tuple[int, ...] = ()
    # chunks as long as the longest prefilled on top of it, one after another: attention as a prompt grows
    chain: int = 3
    short_prompt: int = 16  # prompt tokens before the short-context decode steps
    decode_steps: int = 16  # decode steps timed at each context (their mean counts)
    batch: tuple[int, ...] = (2, 4, 8, 16)  # sequences per batched decode step
    batch_prompt: int = 4  # prompt tokens of each sequence before the batched steps (each prefilled on its own)
    rounds: int = 3  # every point is timed this many times; the median round counts
    batch_rounds: int | None = None  # the rounds that time the batch points (None: all); each is B sequences' steps
    min_rounds: int | None = None  # after this many rounds, time only what they disagree on (None: every round all)

    def times(self, key: tuple, round_index: int) -> bool:
        """Whether round round_index times the point `key`."""
        return key[0] != "batch" or self.batch_rounds is None or round_index < self.batch_rounds

    @property
    def tokens(self) -> int:
        """Tokens one round computes (the chunk on top reuses the longest chunk's cache): what its cost grows with."""
        on_top = self.chain * max(self.chunks) + self.decode_steps
        batch = sum(b * (self.batch_prompt + BATCH_STEPS) for b in self.batch)
        return sum(self.prefill_chunks) + on_top + self.short_prompt + self.decode_steps + batch

    @property
    def prefill_chunks(self) -> tuple[int, ...]:
        """Every chunk size prefilled from an empty cache, ascending: `chunks`, and the short ones below the longest."""
        longest = max(self.chunks)
        return tuple(sorted(set(self.chunks) | {k for k in self.short_chunks if 0 < k < longest}))


# every size up to 16 tokens, then 24 and 32: a short prompt's cost rises in steps where the CPU kernels take its
# tokens a tile at a time (on one Q4_0 model 3 tokens took as long as 4, and 12 as long as 16), which a line between
# the sizes in `chunks` missed by up to a quarter (benchmarks/chunk_line.py); each one llama_decode and no decode
# steps after it, a small part of a round's time
SHORT_CHUNKS = (*range(1, 17), 24, 32)
# `ondevice probe`, `ondevice predict`, `ondevice bench`: a third round only of what the first two disagree on
FULL = TimingPlan(short_chunks=SHORT_CHUNKS, min_rounds=2)
# the full plan on a large model's twins (probing.twins): fewer chunk sizes, the chain of two, three rounds (the
# twins' differences are multiplied by the model's blocks: one round on a busy moment would be too; the third only
# when the first two disagree, and then only what they disagree on, pairs.unsettled), the batch points in the first
# (each a mean over steps of B sequences at once, and half of a round's time on its own)
TWINS = TimingPlan(
    chunks=(1, 16, 128, 512),
    short_chunks=SHORT_CHUNKS,
    chain=2,
    batch=(2, 4, 8),
    rounds=3,
    batch_rounds=1,
    min_rounds=2,
)
# a model known by its header alone (`ondevice predict --config`, a file not downloaded): what predict shows, decode
# and TTFT, without the batched steps (a third of a large model's first round; a batch step is then estimated from
# the chunks, roofline.timing.TimedPredictor._columns_s); the twins of a large one time the same points (time_header)
UNBATCHED = replace(FULL, batch=())
# a first run: about a second on a small model (chunks up to 128, one on top, fewer decode steps, one round)
QUICK = TimingPlan(
    name="quick", chunks=(1, 16, 128), short_chunks=SHORT_CHUNKS, chain=1, decode_steps=8, batch=(), rounds=1
)


_SPARE = 8  # context left over beyond the chain and the decode steps after it


def plan_context(plan: TimingPlan, n_ubatch: int) -> int:
    """The context an engine of micro-batch n_ubatch needs for the plan uncut: the longest chunk (at most
    n_ubatch), the chain on top of it and the decode steps after them."""
    return (1 + plan.chain) * min(max(plan.chunks), n_ubatch) + plan.decode_steps + _SPARE


def plan_for_engine(plan: TimingPlan, n_ctx: int, n_ubatch: int) -> TimingPlan:
    """The plan cut to what an engine's context holds: chunks of at most n_ubatch tokens (a longer one is
    several passes) and, with the chain on top and the decode steps, within n_ctx; the longest that fits
    replaces the chunks that do not."""
    room = (n_ctx - plan.decode_steps - _SPARE) // (1 + plan.chain)
    longest = min(n_ubatch, room)
    chunks = tuple(sorted(k for k in plan.chunks if k <= longest))  # the longest last: the chunk on top reuses it
    if len(chunks) < len(plan.chunks):  # the longest chunk the engine holds stands in for those it does not
        chunks = (*chunks, max(1, longest))
    return replace(plan, chunks=chunks)
