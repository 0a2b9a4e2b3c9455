"""Bench reports what llama.cpp does: its figures against a truly bare llama.cpp loop.

One engine (the default model unless --model), loaded once. Interleaved pairs, order
alternating (A B, B A, ...), greedy on both sides so that both decode the same tokens:

  A  one request through the whole bench path (run_bench with the resident scenario: runner,
     scenarios, peak-RSS meter, prompt builder); its figures are the ones bench reports, from
     the engine's own per-token marks.
  B  engine_overhead.py's bare loop (BareContext / bare_run, imported from there): clear the
     KV cache, llama_decode the prompt, then a native greedy sampler + llama_decode per token,
     in its own context built from llama.cpp's default context parameters, timed on its own
     perf_counter_ns marks. The prompt is the very ids bench used in that pair.

Checked: the ITL p50 pooled over all of bench's runs (what bench reports) against the same over
the bare runs, within 2% either way; each pair's prompts and decoded tokens are identical.
Reported beside it: the per-pair ITL p50 ratio and its median (how noisy the machine is), and
the median TTFT and decode tok/s ratios. Exit status 1 when a check fails.

    python -m benchmarks.bench_overhead [--pairs 7] [--prompt 128] [--tokens 128] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import add_threads_arg
from benchmarks.engine_overhead import BareContext, bare_run  # the bare loop it is measured against
from ondevice.core.metrics import summarize

ITL_TOLERANCE = 0.02


class _Shared:
    """The loaded engine, lent to run_bench (its close() is not passed on); keeps each request's
    prompt ids and stream, so the bare side can be held to the same work."""

    def __init__(self, engine: Any):
        self._e = engine
        self.requests: list[tuple[list[int], Any]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._e, name)

    def stream(self, ids, **kw):
        ts = self._e.stream(ids, **kw)
        self.requests.append((list(ids), ts))
        return ts

    def close(self) -> None:
        pass


def bench_side(shared: _Shared, path: Path, args, n_ctx: int, seed: int) -> dict:
    from ondevice.bench.runner import BenchConfig, run_bench
    from ondevice.bench.runs import RESIDENT
    from ondevice.bench.suites import custom_suite

    cfg = BenchConfig(
        models=(str(path),),
        suite=custom_suite((args.prompt,), (args.tokens,), repeats=1, warmup=0),
        scenarios=(RESIDENT,),
        cap_to_context=False,
        n_ctx=n_ctx,
        n_threads=args.threads,
        sampling={"temperature": 0.0},
        seed=seed,
    )
    before = len(shared.requests)
    out = run_bench(cfg, load_fn=lambda *a, **k: shared)
    (run,) = out.runs
    if not run.ok or len(shared.requests) != before + 1:
        raise SystemExit(f"bench's run did not complete as one request: {run.status} {run.reason}")
    ids, stream = shared.requests[-1]
    t = run.timings
    return {
        "ids": ids,
        "tokens": list(stream.generation.token_ids),
        "itl_s": list(t.itl_s),
        "ttft_s": t.ttft_s,
        "decode_tok_s": t.decode_tok_s,
    }


def bare_side(bare: BareContext, ids: list[int], n_out: int) -> dict:
    marks: list[int] = []
    ttft, decode, tokens = bare_run(bare, ids, n_out, marks)
    itl = [(b - a) * 1e-9 for a, b in zip(marks, marks[1:])]
    return {"ids": list(ids), "tokens": tokens, "itl_s": itl, "ttft_s": ttft, "decode_tok_s": decode}


def run_pairs(eng, path: Path, args, n_ctx: int) -> list[tuple[dict, dict]]:
    from ondevice.bench.suites import PromptBuilder

    shared, bare = _Shared(eng), BareContext(eng, n_ctx)
    try:
        warm = PromptBuilder(lambda t, bos: eng.tokenize(t, add_bos=bos), seed=99).ids(64, "warmup")
        eng.generate(warm, max_tokens=8, ignore_eos=True)  # untimed
        bare_run(bare, warm, 8)
        pairs = []
        for i in range(args.pairs):
            seed = 1000 + i
            # the prompt bench builds for pair i (checked against what it really sent)
            ids = PromptBuilder(lambda t, bos: eng.tokenize(t, add_bos=bos), seed=seed).ids(
                args.prompt, f"p{args.prompt}_n{args.tokens}:resident:0"
            )
            if i % 2 == 0:
                a = bench_side(shared, path, args, n_ctx, seed)
                b = bare_side(bare, ids, args.tokens)
            else:
                b = bare_side(bare, ids, args.tokens)
                a = bench_side(shared, path, args, n_ctx, seed)
            pairs.append((a, b))
    finally:
        bare.close()
    return pairs


def summary(pairs: list[tuple[dict, dict]]) -> dict:
    pooled_a = summarize([x for a, _ in pairs for x in a["itl_s"]]).p50
    pooled_b = summarize([x for _, b in pairs for x in b["itl_s"]]).p50
    s = {
        "itl_p50_ratio": pooled_a / pooled_b,
        "bench_itl_p50_s": pooled_a,
        "bare_itl_p50_s": pooled_b,
        "median_pair_itl_ratio": statistics.median(
            summarize(a["itl_s"]).p50 / summarize(b["itl_s"]).p50 for a, b in pairs
        ),
        "median_ttft_ratio": statistics.median(a["ttft_s"] / b["ttft_s"] for a, b in pairs),
        "median_decode_ratio": statistics.median(a["decode_tok_s"] / b["decode_tok_s"] for a, b in pairs),
        "same_prompts": all(a["ids"] == b["ids"] for a, b in pairs),
        "same_tokens": all(a["tokens"] == b["tokens"] for a, b in pairs),
    }
    s["itl_ok"] = abs(s["itl_p50_ratio"] - 1.0) <= ITL_TOLERANCE
    return s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    if args.pairs < 1 or args.tokens < 2:
        ap.error("--pairs must be at least 1 and --tokens at least 2")

    from ondevice.engine import load
    from ondevice.models.materialize import resolve_model

    path = resolve_model(args.model)
    n_ctx = -(-(args.prompt + args.tokens) // 256) * 256
    eng = load(str(path), n_ctx=n_ctx, n_threads=args.threads)
    print(
        f"model {path.name}, backend {eng.info.backend}, {eng.info.n_threads} threads, prompt {args.prompt}, "
        f"{args.tokens} tokens, greedy, {args.pairs} pairs (order alternates); bench against the bare llama.cpp loop"
    )
    try:
        pairs = run_pairs(eng, path, args, n_ctx)
    finally:
        eng.close()
    print(
        f"{'pair':>4}  {'bench ITL p50 ms':>16}  {'bare ITL p50 ms':>15}  {'bench/bare':>10}  {'TTFT bench/bare':>15}  same"
    )
    for i, (a, b) in enumerate(pairs):
        pa, pb = summarize(a["itl_s"]).p50, summarize(b["itl_s"]).p50
        same = a["ids"] == b["ids"] and a["tokens"] == b["tokens"]
        print(
            f"{i:>4}  {pa * 1e3:>16.3f}  {pb * 1e3:>15.3f}  {pa / pb:>10.4f}  {a['ttft_s'] / b['ttft_s']:>15.4f}  "
            f"{'yes' if same else 'NO'}"
        )
    s = summary(pairs)
    print(
        f"median of pair ratios (bench/bare ITL p50): {s['median_pair_itl_ratio']:.4f}; median TTFT ratio "
        f"{s['median_ttft_ratio']:.4f}; median decode tok/s ratio {s['median_decode_ratio']:.4f}"
    )
    print(
        f"pooled ITL p50: bench {s['bench_itl_p50_s'] * 1e3:.3f} ms, bare {s['bare_itl_p50_s'] * 1e3:.3f} ms, "
        f"ratio {s['itl_p50_ratio']:.4f}: within {ITL_TOLERANCE:.0%} {'yes' if s['itl_ok'] else 'NO'}; "
        f"same prompts {'yes' if s['same_prompts'] else 'NO'}, same tokens {'yes' if s['same_tokens'] else 'NO'}"
    )
    return 0 if s["itl_ok"] and s["same_prompts"] and s["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
