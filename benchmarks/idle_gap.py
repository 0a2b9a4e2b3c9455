"""What a pause before a request costs. The timing plans time their chunks one right after another
(probing.timing), and the prediction is read off those figures; a person's request comes after a pause (typing, the
CLI's own work). This measures a chunk's TTFT right after another request and after an idle gap of each length.

Per model: one engine, then --rounds rounds; in each, every (size, gap) case in an order shuffled anew: one request of
that size, then the gap (time.sleep), then the timed request of the same size (probe token ids,
probing.timing.first_token_s). The median over rounds of each case is reported beside the no-gap median. Exit 1 when
a gap's median is more than --tolerance (15%: the TTFT target) over the no-gap one at any size: a prediction timed
back to back would then miss a request that follows a pause.

    python -m benchmarks.idle_gap [--rounds 8] [--sizes 1,10,128] [--gaps 0.02,0.1,0.5] [--models default,FILE.gguf]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time

from benchmarks.common import add_threads_arg, cpu_description
from ondevice.engine import load
from ondevice.models.materialize import resolve_model
from ondevice.probing.timing import first_token_s, probe_ids


def _numbers(text: str, kind=float) -> tuple:
    return tuple(kind(x) for x in text.split(",") if x.strip())


def measure(engine, sizes: tuple[int, ...], gaps: tuple[float, ...], rounds: int) -> dict[tuple[int, float], float]:
    """{(size, gap): median TTFT ms} over the rounds, gap 0.0 being the request right after another."""
    cases = [(k, gap) for k in sizes for gap in (0.0, *gaps)]
    taken: dict[tuple[int, float], list[float]] = {}
    for r in range(rounds):
        random.shuffle(cases)
        for k, gap in cases:
            ids = probe_ids(engine.n_vocab, k, r)
            first_token_s(engine, ids, reuse=False)
            time.sleep(gap)
            taken.setdefault((k, gap), []).append(first_token_s(engine, ids, reuse=False)[0] * 1e3)
    return {case: statistics.median(ts) for case, ts in taken.items()}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="default", help="comma-separated: default, or GGUF files")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--sizes", type=lambda s: _numbers(s, int), default=(1, 10, 128))
    ap.add_argument("--gaps", type=_numbers, default=(0.02, 0.1, 0.5), help="idle gaps in seconds")
    ap.add_argument("--tolerance", type=float, default=0.15)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    print(f"{cpu_description()}; {args.rounds} rounds, shuffled")
    worst = 0.0
    for name in args.models.split(","):
        path = resolve_model(None if name == "default" else name)
        with load(path, n_threads=args.threads) as engine:
            medians = measure(engine, args.sizes, args.gaps, args.rounds)
        print(f"\n{path.name}")
        for k in args.sizes:
            base = medians[(k, 0.0)]
            cells = [
                f"gap {gap:g} s {medians[(k, gap)]:7.2f} ms ({medians[(k, gap)] / base - 1:+.0%})" for gap in args.gaps
            ]
            print(f"  {k:4d} tokens: no gap {base:7.2f} ms | " + " | ".join(cells))
            worst = max(worst, *(medians[(k, gap)] / base - 1 for gap in args.gaps))
    print(f"\nworst: a gap's median {worst:+.0%} over the no-gap one (tolerance {args.tolerance:.0%})")
    return 1 if worst > args.tolerance else 0


if __name__ == "__main__":
    sys.exit(main())
