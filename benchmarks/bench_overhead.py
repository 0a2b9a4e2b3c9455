"""Bench adds no work to the decode loop: its ITL p50 against a bare Engine.stream.

One engine (the default model unless --model), loaded once. Interleaved pairs, order
alternating (A B, B A, ...): A is one request through the whole bench path (run_bench with
the resident scenario: runner, scenarios, peak-RSS meter, prompt builder), B is a bare
`for _ in eng.stream(ids, ...): pass` on the same prompt with the same sampling seed (so both
generate the same tokens). Both read the engine's
own per-token timings. Reported: per-pair ITL p50 ratio A/B and its median (how noisy the
machine is), and the figure checked: the ITL p50 pooled over all of bench's runs (what bench
reports) against the same over the bare runs, within 2%.

    python benchmarks/bench_overhead.py [--pairs 7] [--prompt 128] [--tokens 128] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from ondevice.bench.runner import DEFAULT_SAMPLING, BenchConfig, run_bench
from ondevice.bench.runs import RESIDENT
from ondevice.bench.suites import PromptBuilder, custom_suite
from ondevice.engine import load
from ondevice.materialize import resolve_model
from ondevice.metrics import summarize


class _Shared:
    """The loaded engine, lent to run_bench (its close() is not passed on)."""

    def __init__(self, engine: Any):
        self._e = engine

    def __getattr__(self, name: str) -> Any:
        return getattr(self._e, name)

    def close(self) -> None:
        pass


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--pairs", type=int, default=7)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args(argv)

    path = resolve_model(args.model)
    n_ctx = -(-(args.prompt + args.tokens) // 256) * 256
    eng = load(str(path), n_ctx=n_ctx, n_threads=args.threads)
    shared = _Shared(eng)
    prompts = PromptBuilder(lambda t, bos: eng.tokenize(t, add_bos=bos), seed=99)
    eng.generate(prompts.ids(64, "warmup"), max_tokens=8, ignore_eos=True)  # untimed

    def bench_side(i: int) -> list[float]:
        cfg = BenchConfig(models=(str(path),), suite=custom_suite((args.prompt,), (args.tokens,), repeats=1, warmup=0),
                          scenarios=(RESIDENT,), cap_to_context=False, n_ctx=n_ctx, n_threads=args.threads,
                          sampling=dict(DEFAULT_SAMPLING), seed=1000 + i)
        out = run_bench(cfg, load_fn=lambda *a, **k: shared)
        run = out.runs[0]
        assert run.ok, run.reason
        return list(run.timings.itl_s)

    def bare_side(i: int) -> list[float]:
        # the very prompt and sampling seed bench uses in pair i: both sides do identical work
        same = PromptBuilder(lambda t, bos: eng.tokenize(t, add_bos=bos), seed=1000 + i)
        ids = same.ids(args.prompt, f"p{args.prompt}_n{args.tokens}:resident:0")
        ts = eng.stream(ids, max_tokens=args.tokens, ignore_eos=True, reuse_prefix=False, seed=1000 + i, **DEFAULT_SAMPLING)
        for _ in ts:
            pass
        return list(ts.generation.timings.itl_s)

    ratios, pooled_a, pooled_b = [], [], []
    print(f"model {path.name}, backend {eng.info.backend}, {eng.info.n_threads} threads, "
          f"prompt {args.prompt}, {args.tokens} tokens, {args.pairs} pairs (order alternates)")
    print(f"{'pair':>4}  {'bench ITL p50 ms':>16}  {'bare ITL p50 ms':>15}  {'bench/bare':>10}")
    for i in range(args.pairs):
        if i % 2 == 0:
            a = bench_side(i)
            b = bare_side(i)
        else:
            b = bare_side(i)
            a = bench_side(i)
        pa, pb = summarize(a).p50, summarize(b).p50
        ratios.append(pa / pb)
        pooled_a += a
        pooled_b += b
        print(f"{i:>4}  {pa * 1e3:>16.3f}  {pb * 1e3:>15.3f}  {pa / pb:>10.4f}")
    eng.close()
    med = statistics.median(ratios)
    pa, pb = summarize(pooled_a).p50, summarize(pooled_b).p50
    print(f"median of pair ratios (bench/bare ITL p50): {med:.4f}")
    print(f"pooled ITL p50: bench {pa * 1e3:.3f} ms, bare {pb * 1e3:.3f} ms, ratio {pa / pb:.4f}")
    ok = abs(pa / pb - 1.0) <= 0.02
    print(f"pooled ITL p50 within 2%: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
