"""Are the timing plans' chunk sizes enough? A prompt's TTFT is read off the line between the chunk sizes a plan
timed (roofline.timing.TimedPredictor.chunk_s), so wherever a chunk's cost bends between two timed sizes the
prediction leans. This measures the cost itself at many sizes and holds each plan's line against it.

Per model: one engine, then --rounds rounds, each one chunk of every size k from an empty cache (probe token ids,
probing.timing.first_token_s: llama_decode and the first sample) in an order shuffled anew each round. The median of
each size stands for its cost; each plan's line runs through the medians at its own chunk sizes (so the check is the
plan's sizes, not its sampling noise), and the worst |line / measured - 1| at the sizes in between is reported. Exit 1
when a plan's worst error on any model is beyond --tolerance (5%: a third of the TTFT target, +-15%).

    python -m benchmarks.chunk_line [--rounds 10] [--sizes 1,2,4,...] [--models default,FILE.gguf,...]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys

import numpy as np

from benchmarks.common import add_threads_arg, cpu_description
from ondevice.engine import load
from ondevice.models.materialize import resolve_model
from ondevice.probing.plans import FULL, QUICK, TWINS
from ondevice.probing.timing import first_token_s, probe_ids

SIZES = (1, 2, 3, 4, 6, 8, 10, 12, 16, 24, 32, 48, 64, 96, 128)
PLANS = {"quick": QUICK.prefill_chunks, "full": FULL.prefill_chunks, "twins": TWINS.prefill_chunks}


def chunk_medians(path: str, sizes: tuple[int, ...], rounds: int, threads: int | None) -> dict[int, list[float]]:
    """Seconds of one chunk of each size from an empty cache, every round in a fresh shuffled order."""
    engine = load(path, n_ctx=max(256, max(sizes) + 64), n_threads=threads)
    samples: dict[int, list[float]] = {k: [] for k in sizes}
    try:
        for r in range(rounds):
            order = list(sizes)
            random.Random(r).shuffle(order)
            for k in order:
                samples[k].append(first_token_s(engine, probe_ids(engine.n_vocab, k, 31 * r + k), reuse=False)[0])
    finally:
        engine.close()
    return samples


def line_errors(medians: dict[int, float], chunks: tuple[int, ...]) -> dict[int, float]:
    """line / measured - 1 at every measured size between the plan's smallest and largest chunk it was not timed at
    (the line through the medians at the plan's chunks)."""
    xs = [k for k in chunks if k in medians]
    ys = [medians[k] for k in xs]
    return {
        k: float(np.interp(k, xs, ys)) / m - 1 for k, m in medians.items() if xs[0] < k < xs[-1] and k not in chunks
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--sizes", default=",".join(map(str, SIZES)), help="chunk sizes measured (comma-separated)")
    ap.add_argument("--models", default="default", help="comma-separated registry names or GGUF paths")
    ap.add_argument("--tolerance", type=float, default=0.05)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    sizes = tuple(sorted({int(s) for s in args.sizes.split(",")} | {k for c in PLANS.values() for k in c if k <= 128}))
    print(cpu_description())
    worst: dict[str, float] = {name: 0.0 for name in PLANS}
    for model in args.models.split(","):
        path = str(resolve_model(None if model == "default" else model))
        samples = chunk_medians(path, sizes, args.rounds, args.threads)
        medians = {k: statistics.median(v) for k, v in samples.items()}
        print(f"\n{path}: chunk k, median ms, then every round's ms")
        for k in sizes:
            print(f"  {k:4d} {1e3 * medians[k]:8.2f}  {[round(1e3 * t, 1) for t in samples[k]]}")
        for name, chunks in PLANS.items():
            errs = line_errors(medians, chunks)
            k_worst = max(errs, key=lambda k: abs(errs[k]))
            worst[name] = max(worst[name], abs(errs[k_worst]))
            shown = ", ".join(f"{k}: {100 * e:+.1f}%" for k, e in sorted(errs.items()))
            print(f"  {name} plan {chunks}: worst {100 * errs[k_worst]:+.1f}% at {k_worst} ({shown})")
    print("\nworst line error by plan: " + ", ".join(f"{n} {100 * w:.1f}%" for n, w in worst.items()))
    return 0 if all(w <= args.tolerance for w in worst.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
