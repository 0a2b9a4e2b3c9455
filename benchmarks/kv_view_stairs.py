"""What a decode step costs as the context grows, on both sides of llama.cpp's KV view steps: the premise of
roofline.attention.decode_kv_padding. llama.cpp attends a view of the KV cells in use rounded up to 256
(llama_kv_cache::get_n_kv); where its kernel works through the whole view, the step time climbs in stairs of 256
cells, flat inside each; where it skips the masked padding, it grows with every cell.

One engine on MODEL: each round prefills a prompt of the longest context once, then at every context (longest first,
the prefix reused) decodes --steps tokens and keeps the median step (the first left out); --rounds times over, other
ids each round, the medians printed per context beside the view's size. Contexts that keep all their steps inside one
stair (context mod 256 at most 245 with 10 steps) show the stairs; pairs either side of a multiple of 256 show their
rise. It checks nothing and exits 0: what it shows is read.

    python -m benchmarks.kv_view_stairs MODEL.gguf [--rounds 3] [--contexts 16,240,270,490,...] [--cache-type q8_0]
        [--no-flash-attn] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from benchmarks.common import add_threads_arg, cpu_name

CONTEXTS = (16, 100, 200, 240, 270, 400, 490, 520, 700, 1000, 1040, 1270, 1290, 1500, 1545, 1800, 2030, 2050, 2300)


def view_cells(n_ctx: int, steps: int) -> int:
    """The view llama.cpp attends at the last of `steps` decode steps after n_ctx tokens."""
    return max(256, -(-(n_ctx + steps) // 256) * 256)


def step_seconds(engine, contexts: list[int], steps: int, rounds: int) -> dict[int, list[float]]:
    """{context: [median decode step of each round]}."""
    from ondevice.probing.timing import probe_ids

    out: dict[int, list[float]] = {}
    for r in range(rounds):
        ids = probe_ids(engine.n_vocab, max(contexts) + 1, 77 + r)
        engine.generate(ids, max_tokens=1, ignore_eos=True, reuse_prefix=False, seed=0)
        for c in sorted(contexts, reverse=True):  # each a prefix of the last: only its tail is dropped
            g = engine.generate(ids[:c], max_tokens=steps, ignore_eos=True, reuse_prefix=True, seed=0)
            out.setdefault(c, []).append(statistics.median(g.timings.itl_s[1:]))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    ap.add_argument("--cache-type", default="f16", help="K and V cache type (default f16)")
    ap.add_argument("--no-flash-attn", action="store_true")
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    from ondevice.engine import load

    contexts = sorted({int(c) for c in args.contexts.split(",")})
    n_ctx = -(-(max(contexts) + args.steps + 8) // 256) * 256
    settings = {"cache_type_k": args.cache_type, "cache_type_v": args.cache_type, "n_threads": args.threads}
    if args.no_flash_attn:
        settings["flash_attn"] = False
    with load(args.model, n_ctx=n_ctx, **settings) as engine, engine.side_requests():
        info = engine.info
        steps = step_seconds(engine, contexts, args.steps, args.rounds)
    print(f"CPU: {cpu_name()}; {args.model.name}; {args.rounds} rounds of {args.steps} steps")
    print(f"backend {info.backend}, flash attention {info.flash_attn_used}, KV {info.cache_type_k}/{info.cache_type_v}")
    for c in contexts:
        ts = steps[c]
        rounds = " ".join(f"{t * 1e3:.2f}" for t in ts)
        print(
            f"context {c:5d} (view {view_cells(c, args.steps):5d}): step {statistics.median(ts) * 1e3:7.2f} ms"
            f"  (rounds {rounds})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
