"""What a prefill chunk's attention costs as a prompt grows, on a model file: the premise of the prediction's
chain arithmetic (roofline.timing), that a chunk of K tokens after pos cached ones takes the same chunk from an
empty cache plus a cost per attention cell it adds (windows capped), that cost not moving with pos.

A chunk of --chunk tokens is prefilled from an empty cache, then --links more chunks as long, each on top of the
last (one growing prompt, the prefix reused), each timed to its first token right after a chunk as long from an
empty cache on a second engine; --rounds times over, other ids each round, the medians kept. Printed per position:
what the chunk took beyond the one from an empty cache, that per attention cell it added, and each round's figure.
It checks nothing and exits 0: what it shows is read.

    python -m benchmarks.chain_cost MODEL.gguf [--links 7] [--chunk 512] [--rounds 2] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from benchmarks.common import add_threads_arg, cpu_name


def chain_seconds(engine, fresh, chunk: int, links: int, rounds: int) -> dict[int, list[float]]:
    """{cached tokens before the chunk: [seconds it took beyond the same chunk from an empty cache, one per round]}:
    each link on `engine` right after a chunk from an empty cache on `fresh` (a second engine on the same file), so
    that what attention adds comes from the same moments as what it adds to (this machine's speed moves between
    minutes by more than attention adds at the first links)."""
    from ondevice.probing.timing import first_token_s, probe_ids

    vocab, out = engine.n_vocab, {}
    for eng in (engine, fresh):  # warm-up: the first pass of a chunk this size touches the compute buffers first
        eng.generate(probe_ids(vocab, chunk), max_tokens=2, ignore_eos=True, seed=0, reuse_prefix=False)
    for r in range(rounds):
        ids = probe_ids(vocab, chunk, 100 * r)
        engine.generate(ids, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
        for link in range(1, links + 1):
            alone = first_token_s(fresh, probe_ids(vocab, chunk, 100 * r + 50 + link), reuse=False)[0]
            ids = ids + probe_ids(vocab, chunk + 1, 100 * r + link)[1:]
            out.setdefault(len(ids) - chunk, []).append(first_token_s(engine, ids, reuse=True)[0] - alone)
    return out


def report(spec, beyond: dict[int, list[float]], chunk: int) -> str:
    from ondevice.roofline.attention import added_chunk_cells

    lines = []
    for pos in sorted(beyond):
        t = statistics.median(beyond[pos])
        added = added_chunk_cells(spec, pos, chunk)
        lines.append(
            f"after {pos:6d}: {t * 1e3:7.0f} ms beyond the chunk from an empty cache, "
            f"{t / added * 1e9:6.1f} ns per added cell (rounds {', '.join(f'{x * 1e3:.0f}' for x in beyond[pos])} ms)"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--links", type=int, default=7)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    from ondevice.engine import load

    n_ctx = args.chunk * (args.links + 1) + 64
    with (
        load(args.model, n_ctx=n_ctx, n_threads=args.threads) as engine,
        load(args.model, n_ctx=n_ctx, n_threads=args.threads) as fresh,
    ):
        with engine.side_requests(), fresh.side_requests():
            beyond = chain_seconds(engine, fresh, args.chunk, args.links, args.rounds)
        print(f"CPU: {cpu_name()}; {args.model.name}; {args.rounds} rounds")
        print(report(engine.info.spec, beyond, args.chunk))
    return 0


if __name__ == "__main__":
    sys.exit(main())
