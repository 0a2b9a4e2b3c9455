"""A model's twin against the model: how long twins take to write, and whether a twin decodes as
fast as the file it copies (the premise of timing twins: kernel speed does not depend on values).

1. Write times (each the median of --repeat runs, each run replacing the last one's file):
   - the default model's full twin (its header read from the file);
   - Llama 3.1 8B Q4_K_M from its config.json (tests/data/hf_configs) at 1 and 3 blocks: the
     header from the config, llama.cpp's dry run for the Q4_K_M types, the write; with the token
     embedding written and as a hole.
2. Decode, interleaved: the default model and its full twin loaded side by side (same threads,
   context and settings), then rounds A B B A ...: each a greedy generation of --tokens tokens
   from the same prompt ids, end-of-sequence ignored, no prefix reuse. Per round the median ITL
   of each side and, with --threads 1, the process CPU time per token (all of llama.cpp's work
   on this thread, so it barely depends on what else the machine does). Reported: the median
   over rounds of the twin/model ratios. Exit 1 when the median ITL ratio is off by more than
   --tolerance (default 3%).

    python -m benchmarks.twin_speed [--rounds 6] [--tokens 64] [--threads 1] [--out DIR]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from time import process_time_ns

from benchmarks.common import HF_CONFIGS, cpu_description, paired_order

CONFIGS = HF_CONFIGS


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def write_times(folder: Path, repeat: int) -> None:
    from ondevice.quant.hfconfig import header_from_hf_config
    from ondevice.quant.twin import matching_blocks, quantized_header, read_header, reduce_layers, write_twin

    from ondevice.models.materialize import resolve_model

    out = folder / "write.gguf"

    def full_default():
        return write_twin(read_header(resolve_model(None)), out)

    s, path = timed(full_default, repeat)
    print(f"default model, full twin (read header + write): {s:.2f} s, {path.stat().st_size / 1e6:.0f} MB")
    config = CONFIGS / "llama-3.1-8b.json"
    s_cfg, f16 = timed(lambda: header_from_hf_config(config), repeat)
    s_q, q4 = timed(lambda: quantized_header(f16, "Q4_K_M"), repeat)
    print(f"Llama 3.1 8B: header from config.json {s_cfg:.2f} s, Q4_K_M types by dry run {s_q:.2f} s")
    for k in (1, 3):
        small = reduce_layers(q4, k, matching_blocks(q4, k))
        s, path = timed(lambda: write_twin(small, out), repeat)
        print(f"  {k} block(s): write {s:.2f} s, {path.stat().st_size / 1e6:.0f} MB")
    out.unlink(missing_ok=True)


def decode_check(twin_dir: Path, rounds: int, tokens: int, threads: int) -> float:
    from ondevice.quant.twin import read_header, write_twin

    from ondevice.engine import load
    from ondevice.models.materialize import resolve_model

    real = resolve_model(None)
    twin = write_twin(read_header(real), twin_dir / "default-twin.gguf")
    engines = {"model": load(real, n_ctx=512, n_threads=threads), "twin": load(twin, n_ctx=512, n_threads=threads)}
    prompt = list(range(1000, 1032))
    itl: dict[str, list[float]] = {k: [] for k in engines}
    cpu: dict[str, list[float]] = {k: [] for k in engines}
    for r in range(rounds + 1):  # round 0 warms both up and is not counted
        for side in paired_order(r, ("model", "twin")):
            c0 = process_time_ns()
            g = engines[side].generate(prompt, max_tokens=tokens, temperature=0, ignore_eos=True, reuse_prefix=False)
            c1 = process_time_ns()
            if r:
                itl[side].append(statistics.median(g.timings.itl_s))
                cpu[side].append((c1 - c0) / 1e9 / tokens)
        if r:
            print(
                f"  round {r}: ITL p50 model {itl['model'][-1] * 1e3:.2f} ms, twin {itl['twin'][-1] * 1e3:.2f} ms; "
                f"CPU/token model {cpu['model'][-1] * 1e3:.2f} ms, twin {cpu['twin'][-1] * 1e3:.2f} ms"
            )
    for eng in engines.values():
        eng.close()
    itl_ratio = statistics.median(t / m for t, m in zip(itl["twin"], itl["model"]))
    cpu_ratio = statistics.median(t / m for t, m in zip(cpu["twin"], cpu["model"]))
    print(
        f"decode: model {1 / statistics.median(itl['model']):.1f} tok/s, twin {1 / statistics.median(itl['twin']):.1f}"
        f" tok/s (median ITL over {rounds} rounds of {tokens} tokens, {threads} thread(s))"
    )
    print(f"twin/model: ITL ratio {itl_ratio:.3f} (median of paired rounds), CPU time per token ratio {cpu_ratio:.3f}")
    return itl_ratio


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeat", type=int, default=3, help="write-time runs per figure (median)")
    ap.add_argument("--tolerance", type=float, default=0.03)
    ap.add_argument("--out", type=Path, default=None, help="folder for the twins (default: a temporary one)")
    ap.add_argument("--skip-writes", action="store_true")
    args = ap.parse_args()
    print(cpu_description())
    with tempfile.TemporaryDirectory(dir=args.out) as folder:
        if not args.skip_writes:
            write_times(Path(folder), args.repeat)
        ratio = decode_check(Path(folder), args.rounds, args.tokens, args.threads)
    ok = abs(ratio - 1) <= args.tolerance
    print(f"{'PASS' if ok else 'FAIL'}: twin/model ITL ratio {ratio:.3f}, target within {args.tolerance:.0%}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
