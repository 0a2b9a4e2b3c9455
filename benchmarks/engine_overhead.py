"""What the engine costs on top of llama.cpp: Engine.stream vs a bare llama_decode loop.

Interleaved A B A B ... in one process, on the same model (the same weights in memory and the
same threads), each side with its own context:

  A  Engine.stream(prompt_ids, temperature=0, ignore_eos=True, reuse_prefix=False) with the
     engine's defaults
  B  a bare loop on the low-level binding, in a context built from llama.cpp's own default
     context parameters (llama_context_default_params: only n_ctx and threads set): clear the
     KV cache, llama_decode the prompt in n_batch chunks, then llama_sampler_sample (a native
     greedy chain) + llama_decode per token, timed with perf_counter_ns exactly where the
     engine marks its tokens.

So the ratio also checks that the engine's defaults (flash attention, batch sizes) are
llama.cpp's. Exit status 1 when a target is missed or the two sides' tokens differ.

Reported: decode tok/s ratio A/B and TTFT ratio A/B per pair, and their medians
(targets: decode >= 0.98, TTFT <= 1.02). Both produce the same greedy tokens; the script
checks that too. On a busy machine wall-clock ratios scatter widely, so two supplementary
figures are printed: the best-run ratios (fastest A over fastest B) and the median ratio
of the process CPU time of each whole request (with --threads 1 all of llama.cpp's work
runs on this thread, so CPU time barely depends on what else the machine is doing).

    python -m benchmarks.engine_overhead [--pairs 7] [--prompt-tokens 128] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import sys
from time import perf_counter_ns, process_time_ns

from benchmarks.common import add_model_arg, add_threads_arg, print_json

DEC_TARGET, TTFT_TARGET = 0.98, 1.02


class BareContext:
    """A context on the engine's model built from llama.cpp's default context parameters."""

    def __init__(self, eng, n_ctx: int):
        import llama_cpp as lib

        from ondevice.llama.model import new_context

        self.ctx, self.flash_attn = new_context(eng._h.model, n_ctx=n_ctx, n_threads=eng.info.n_threads, lib=lib)
        self.memory = lib.llama_get_memory(self.ctx)
        self.n_batch = int(lib.llama_n_batch(self.ctx))
        self.n_ubatch = int(lib.llama_n_ubatch(self.ctx))

    def close(self) -> None:
        import llama_cpp as lib

        lib.llama_free(self.ctx)


def bare_run(
    bare: BareContext, ids: list[int], n_out: int, marks: list[int] | None = None
) -> tuple[float, float, list[int]]:
    """(ttft_s, decode_tok_s, tokens) of a bare greedy loop in the bare context; `marks`, when
    given (an empty list), receives the perf_counter_ns() moment each token was sampled."""
    import llama_cpp as lib

    ctx, n_batch = bare.ctx, bare.n_batch
    chain_params = lib.llama_sampler_chain_default_params()
    chain_params.no_perf = True
    smpl = lib.llama_sampler_chain_init(chain_params)
    lib.llama_sampler_chain_add(smpl, lib.llama_sampler_init_greedy())
    arr = (ctypes.c_int32 * len(ids))(*ids)
    one = (ctypes.c_int32 * 1)()
    batch_one = lib.llama_batch_get_one(one, 1)
    marks = [] if marks is None else marks
    out: list[int] = []
    start = perf_counter_ns()
    lib.llama_memory_clear(bare.memory, False)  # as the engine clears it
    for lo in range(0, len(ids), n_batch):
        n = min(n_batch, len(ids) - lo)
        ptr = ctypes.cast(ctypes.addressof(arr) + 4 * lo, ctypes.POINTER(ctypes.c_int32))
        if lib.llama_decode(ctx, lib.llama_batch_get_one(ptr, n)) != 0:
            raise RuntimeError("prefill failed")
    tok = lib.llama_sampler_sample(smpl, ctx, -1)
    marks.append(perf_counter_ns())
    out.append(tok)
    for _ in range(n_out - 1):
        one[0] = tok
        if lib.llama_decode(ctx, batch_one) != 0:
            raise RuntimeError("decode failed")
        tok = lib.llama_sampler_sample(smpl, ctx, -1)
        marks.append(perf_counter_ns())
        out.append(tok)
    lib.llama_sampler_free(smpl)
    ttft = (marks[0] - start) * 1e-9
    return ttft, (len(marks) - 1) / ((marks[-1] - marks[0]) * 1e-9), out


def engine_run(eng, ids: list[int], n_out: int) -> tuple[float, float, list[int]]:
    g = eng.generate(ids, max_tokens=n_out, temperature=0, ignore_eos=True, reuse_prefix=False)
    return g.timings.ttft_s, g.timings.decode_tok_s, list(g.token_ids)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arg(ap)
    ap.add_argument("--pairs", type=int, default=7, help="A/B pairs (at least 5)")
    ap.add_argument("--prompt-tokens", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--n-ctx", type=int, default=2048)
    add_threads_arg(ap)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.pairs < 5:
        ap.error("--pairs must be at least 5")

    from ondevice.engine import load

    eng = load(args.model, n_ctx=args.n_ctx, n_threads=args.threads)
    text = "The history of the printing press begins in the fifteenth century, when " * 64
    ids = eng.tokenize(text)[: args.prompt_tokens]
    bare = BareContext(eng, args.n_ctx)
    engine_run(eng, ids, 8)  # warm-up, not counted
    bare_run(bare, ids, 8)
    rows = []
    for i in range(args.pairs):
        c0 = process_time_ns()
        a = engine_run(eng, ids, args.max_tokens)
        c1 = process_time_ns()
        b = bare_run(bare, ids, args.max_tokens)
        c2 = process_time_ns()
        rows.append(
            {
                "pair": i,
                "engine_ttft_s": a[0],
                "bare_ttft_s": b[0],
                "engine_decode_tok_s": a[1],
                "bare_decode_tok_s": b[1],
                "ttft_ratio": a[0] / b[0],
                "decode_ratio": a[1] / b[1],
                "engine_cpu_s": (c1 - c0) * 1e-9,
                "bare_cpu_s": (c2 - c1) * 1e-9,
                "cpu_ratio": (c1 - c0) / max(1, c2 - c1),
                "same_tokens": a[2] == b[2],
            }
        )
    summary = {
        "model": eng.info.spec.name,
        "backend": eng.info.backend,
        "n_threads": eng.info.n_threads,
        "n_batch": eng.info.n_batch,
        "n_ctx": eng.info.n_ctx,
        "prompt_tokens": len(ids),
        "engine_settings": {
            "n_batch": eng.info.n_batch,
            "n_ubatch": eng.info.n_ubatch,
            "flash_attn": eng.info.flash_attn_used,
        },
        "bare_settings": {"n_batch": bare.n_batch, "n_ubatch": bare.n_ubatch, "flash_attn": bare.flash_attn},
        "cpu_buffers": eng.info.cpu_buffers,
        "output_tokens": args.max_tokens,
        "pairs": args.pairs,
        "predictor": eng.predictor is not None,
        "median_decode_ratio": statistics.median(r["decode_ratio"] for r in rows),
        "median_ttft_ratio": statistics.median(r["ttft_ratio"] for r in rows),
        "all_same_tokens": all(r["same_tokens"] for r in rows),
        "best_decode_ratio": max(r["engine_decode_tok_s"] for r in rows) / max(r["bare_decode_tok_s"] for r in rows),
        "best_ttft_ratio": min(r["engine_ttft_s"] for r in rows) / min(r["bare_ttft_s"] for r in rows),
        "median_cpu_ratio": statistics.median(r["cpu_ratio"] for r in rows),
    }
    summary["decode_ok"] = summary["median_decode_ratio"] >= DEC_TARGET
    summary["ttft_ok"] = summary["median_ttft_ratio"] <= TTFT_TARGET
    bare.close()
    eng.close()
    if args.json:
        print_json({"summary": summary, "pairs": rows})
        print()
    else:
        print(render(summary, rows))
    return 0 if summary["decode_ok"] and summary["ttft_ok"] and summary["all_same_tokens"] else 1


def render(s: dict, rows: list[dict]) -> str:
    lines = [
        f"engine overhead: {s['model']} on {s['backend']}, {s['n_threads']} threads, n_batch {s['n_batch']}, "
        f"n_ctx {s['n_ctx']}, prompt {s['prompt_tokens']} tokens, {s['output_tokens']} output tokens, "
        f"{s['pairs']} interleaved pairs, predictor {'on' if s['predictor'] else 'off'}, CPU buffers {s['cpu_buffers']}",
        f"settings: engine {s['engine_settings']}; bare (llama.cpp defaults) {s['bare_settings']}",
        f"{'pair':>4}  {'TTFT engine':>12}  {'TTFT bare':>10}  {'ratio':>6}  {'decode engine':>14}  {'decode bare':>12}  {'ratio':>6}  same",
    ]
    for r in rows:
        lines.append(
            f"{r['pair']:>4}  {r['engine_ttft_s'] * 1e3:>9.1f} ms  {r['bare_ttft_s'] * 1e3:>7.1f} ms  {r['ttft_ratio']:>6.3f}"
            f"  {r['engine_decode_tok_s']:>8.2f} tok/s  {r['bare_decode_tok_s']:>6.2f} tok/s  {r['decode_ratio']:>6.3f}"
            f"  {'yes' if r['same_tokens'] else 'NO'}"
        )
    lines.append(
        f"median decode tok/s ratio engine/bare = {s['median_decode_ratio']:.3f} (target >= {DEC_TARGET}: "
        f"{'met' if s['decode_ok'] else 'NOT met'}); median TTFT ratio = {s['median_ttft_ratio']:.3f} "
        f"(target <= {TTFT_TARGET}: {'met' if s['ttft_ok'] else 'NOT met'}); same greedy tokens in every run: "
        f"{'yes' if s['all_same_tokens'] else 'NO'}"
    )
    lines.append(
        f"supplementary: best-run decode ratio = {s['best_decode_ratio']:.3f}, best-run TTFT ratio = "
        f"{s['best_ttft_ratio']:.3f}, median CPU-time ratio per request = {s['median_cpu_ratio']:.3f}"
    )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
