"""Prefix reuse pays: a chat's second turn prefills faster than the same prompt prefilled cold.

One engine (the default model unless --model), several pairs. Each pair starts a fresh chat
with a long system prompt and sends a first question; then

  warm  the second question: the engine reuses the first turn from the KV cache and computes
        only the new turn's tokens;
  cold  the very prompt ids of that second turn, generated with reuse_prefix=False (the KV
        cache cleared: every token computed), one output token.

The warm side always runs first (the first turn must still be in the cache for it). Checked:
the median over pairs of warm / cold prefill time is below 1 (the cold side computes ten times
the tokens or more), and every warm turn computed only the tokens not cached. Exit status 1
when a check fails.

    python -m benchmarks.prefix_reuse [--pairs 5] [--model REF] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys

from benchmarks.common import add_model_arg, add_threads_arg

TARGET = 1.0
SYSTEM = (
    "You are a geography tutor. You answer questions about countries, their capital cities, rivers, "
    "mountains and famous buildings. Keep every answer to one short sentence, give the plain fact first, "
    "and do not add lists, jokes or follow-up questions. When a question is ambiguous, answer the most "
    "common reading of it. Use the English names of places. "
) * 3
TURNS = [
    ("What is the capital of France?", "And the capital of Italy?"),
    ("Which river flows through Vienna?", "And through Budapest?"),
    ("Where is Mount Fuji?", "How high is it?"),
]


def one_pair(engine, first: str, second: str) -> dict:
    chat = engine.chat(system=SYSTEM, temperature=0, max_tokens=24)
    chat.send(first)
    cached = engine.kv_cache_tokens
    ids = chat.prompt_tokens(second)  # what turn two prefills, rendered the same way
    warm = chat.send(second)
    cold = engine.generate(ids, max_tokens=1, temperature=0, reuse_prefix=False)
    return {
        "prompt_tokens": len(ids),
        "warm_cached": warm.cached_prompt_tokens,
        "warm_computed": warm.timings.prompt_tokens_computed,
        "cold_computed": cold.timings.prompt_tokens_computed,
        "warm_prefill_s": warm.timings.prefill_s,
        "cold_prefill_s": cold.timings.prefill_s,
        "ratio": warm.timings.prefill_s / cold.timings.prefill_s,
        "counts_ok": warm.cached_prompt_tokens == cached
        and warm.timings.prompt_tokens_computed == len(ids) - cached
        and cold.timings.prompt_tokens_computed == len(ids),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arg(ap)
    ap.add_argument("--pairs", type=int, default=5)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    if args.pairs < 1:
        ap.error("--pairs must be at least 1")
    from ondevice.engine import load

    eng = load(args.model, n_ctx=2048, n_threads=args.threads)
    try:
        one_pair(eng, *TURNS[-1])  # warm-up, not counted
        rows = [one_pair(eng, *TURNS[i % len(TURNS)]) for i in range(args.pairs)]
    finally:
        eng.close()
    print(f"prefix reuse: {eng.info.spec.name} on {eng.info.backend}, {eng.info.n_threads} threads, {args.pairs} pairs")
    print(
        f"{'pair':>4}  {'prompt':>6}  {'warm computed':>13}  {'cold computed':>13}  {'warm ms':>8}  {'cold ms':>8}  {'ratio':>6}"
    )
    for i, r in enumerate(rows):
        print(
            f"{i:>4}  {r['prompt_tokens']:>6}  {r['warm_computed']:>13}  {r['cold_computed']:>13}  "
            f"{r['warm_prefill_s'] * 1e3:>8.1f}  {r['cold_prefill_s'] * 1e3:>8.1f}  {r['ratio']:>6.3f}"
            + ("" if r["counts_ok"] else "  token counts WRONG")
        )
    median = statistics.median(r["ratio"] for r in rows)
    counts_ok = all(r["counts_ok"] for r in rows)
    ok = median < TARGET and counts_ok
    print(
        f"median warm/cold prefill time {median:.3f} (target < {TARGET}); warm turns computed only the uncached "
        f"tokens: {'yes' if counts_ok else 'NO'} -> {'met' if ok else 'NOT met'}"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
