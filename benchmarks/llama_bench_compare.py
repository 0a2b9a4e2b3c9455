"""The engine against llama.cpp's own `llama-bench`, interleaved, at the same depth, threads and settings.

    LLAMA_BENCH=/path/to/llama-bench python -m benchmarks.llama_bench_compare [--rounds 5]

Build llama-bench from the llama.cpp sources inside llama-cpp-python's sdist:

    pip download --no-deps --no-binary :all: llama-cpp-python==0.3.36 && tar xzf llama_cpp_python-0.3.36.tar.gz
    cd llama_cpp_python-0.3.36/vendor/llama.cpp
    cmake -B build -DLLAMA_CURL=OFF && cmake --build build --target llama-bench -j

Each round runs llama-bench once (a fresh process: `-p P -n 0` for prefill, `-n N -d D` for
decode after D tokens of context, `-r 1`, flash attention on, `--repack` as below) and the
engine once (resident in this process, the same threads, n_ubatch and flash attention):
prefill tok/s of a P-token prompt, and decode tok/s of N tokens after a D-token prompt.

Buffer types: llama-bench's `--repack` switches every extra CPU buffer type on or off (llama.cpp
has no "CPU_REPACK but not AMX"), so the two sides run with the same placement: `--buffers
none` (default; llama-bench --repack 0, ONDEVICE_CPU_BUFFERS=none) or `--buffers all`
(--repack 1, ONDEVICE_CPU_BUFFERS=all: only where the crash guard found "all" safe).

Target: median decode ratio engine / llama-bench >= 0.98 (exit 1 when missed; exit 2 when
LLAMA_BENCH is not set or does not run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from benchmarks.common import add_model_arg, add_threads_arg, print_json

DEC_TARGET = 0.98


def llama_bench(
    binary: str, model: Path, *, threads: int, repack: bool, n_prompt: int, n_gen: int, depth: int
) -> float:
    """tokens/s llama-bench reports for one test (-r 1)."""
    cmd = [
        binary,
        "-m",
        str(model),
        "-t",
        str(threads),
        "-fa",
        "1",
        "--repack",
        "1" if repack else "0",
        "-r",
        "1",
        "-p",
        str(n_prompt),
        "-n",
        str(n_gen),
        "-d",
        str(depth),
        "-o",
        "json",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(f"llama-bench exited {out.returncode}: {out.stderr.strip()[-300:]}")
    rows = json.loads(out.stdout)
    return float(rows[0]["avg_ts"])


def engine_prefill_tok_s(eng, ids: list[int]) -> float:
    g = eng.generate(ids, max_tokens=1, temperature=0, ignore_eos=True, reuse_prefix=False)
    return g.timings.prefill_tok_s


def engine_decode_tok_s(eng, ids: list[int], n_gen: int) -> float:
    g = eng.generate(ids, max_tokens=n_gen + 1, temperature=0, ignore_eos=True, reuse_prefix=False)
    return g.timings.decode_tok_s  # n_gen decode steps after the prompt, as llama-bench's tg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_arg(ap)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--prompt-tokens", type=int, default=256, help="prefill test, tokens (llama-bench -p)")
    ap.add_argument("--gen-tokens", type=int, default=64, help="decode test, tokens (llama-bench -n)")
    ap.add_argument("--depth", type=int, default=256, help="context before the decode test, tokens (llama-bench -d)")
    add_threads_arg(ap)
    ap.add_argument("--buffers", choices=("none", "all"), default="none")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    binary = os.environ.get("LLAMA_BENCH")
    if not binary or not Path(binary).is_file():
        print(
            "LLAMA_BENCH is not set to a llama-bench binary: nothing to compare (see this script's docstring)",
            file=sys.stderr,
        )
        return 2
    os.environ["ONDEVICE_CPU_BUFFERS"] = args.buffers
    from ondevice.engine import load
    from ondevice.models.materialize import resolve_model

    model = resolve_model(args.model)
    eng = load(
        model, n_ctx=args.depth + args.gen_tokens + args.prompt_tokens + 16, n_threads=args.threads, flash_attn=True
    )
    text = "The history of the printing press begins in the fifteenth century, when " * 200
    all_ids = eng.tokenize(text)
    pp_ids, tg_ids = all_ids[: args.prompt_tokens], all_ids[: args.depth]
    bench = dict(threads=eng.info.n_threads, repack=args.buffers == "all")
    rows = []
    try:
        engine_decode_tok_s(eng, tg_ids, 8)  # warm-up, not counted
        for r in range(args.rounds):
            row = {"round": r}
            row["bench_pp"] = llama_bench(binary, model, n_prompt=args.prompt_tokens, n_gen=0, depth=0, **bench)
            row["engine_pp"] = engine_prefill_tok_s(eng, pp_ids)
            row["bench_tg"] = llama_bench(binary, model, n_prompt=0, n_gen=args.gen_tokens, depth=args.depth, **bench)
            row["engine_tg"] = engine_decode_tok_s(eng, tg_ids, args.gen_tokens)
            rows.append(row)
    except (RuntimeError, OSError, subprocess.TimeoutExpired, ValueError, KeyError) as exc:
        print(f"llama-bench did not run: {exc}", file=sys.stderr)
        return 2
    finally:
        eng.close()
    summary = {
        "model": model.name,
        "threads": eng.info.n_threads,
        "buffers": args.buffers,
        "n_ubatch": eng.info.n_ubatch,
        "prompt_tokens": args.prompt_tokens,
        "gen_tokens": args.gen_tokens,
        "depth": args.depth,
        "rounds": args.rounds,
        "median_prefill_ratio": statistics.median(r["engine_pp"] / r["bench_pp"] for r in rows),
        "median_decode_ratio": statistics.median(r["engine_tg"] / r["bench_tg"] for r in rows),
    }
    ok = summary["median_decode_ratio"] >= DEC_TARGET
    if args.json:
        print_json({"summary": summary, "rounds": rows})
    else:
        print(
            f"engine vs llama-bench: {summary['model']}, {summary['threads']} threads, flash attention on, "
            f"CPU buffers {args.buffers}, pp{args.prompt_tokens}, tg{args.gen_tokens} at depth {args.depth}"
        )
        for r in rows:
            print(
                f"  round {r['round']}: prefill {r['engine_pp']:.1f} vs {r['bench_pp']:.1f} tok/s, "
                f"decode {r['engine_tg']:.2f} vs {r['bench_tg']:.2f} tok/s"
            )
        print(
            f"median prefill ratio {summary['median_prefill_ratio']:.3f}; median decode ratio "
            f"{summary['median_decode_ratio']:.3f} (target >= {DEC_TARGET}: {'met' if ok else 'NOT met'})"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
