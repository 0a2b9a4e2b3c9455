"""A model's twin against the model: how long twins take to write, and whether a twin decodes as
fast as the file it copies (the premise of timing twins: kernel speed does not depend on values).

1. Write times (each the median of --repeat runs, each run replacing the last one's file):
   - the default model's full twin (its header read from the file);
   - Llama 3.1 8B Q4_K_M from its config.json (tests/data/hf_configs) at 1 and 3 blocks: the
     header from the config, llama.cpp's dry run for the Q4_K_M types, the write; with the token
     embedding written and as a hole.
2. Prefill and decode, interleaved, for every model with real weights here (--models: the default
   model, its requantized ladder as prediction_accuracy builds it, the chat model): the model, a byte copy
   of it and its full twin loaded side by side (same threads, context and settings), then rounds in
   rotating order: each a generation of --tokens tokens after a prompt of --prompt token ids (the same on
   every side), end-of-sequence ignored, no prefix reuse. The copy and the twin lie where the product
   writes twins (shared memory when there is room): the copy is the control, the same bytes in the
   twin's place, so twin/copy is what the values change and copy/model what placement and noise alone
   do (on a 2 vCPU VM a copy's decode came out 5% either side of the model's in runs of 12 rounds).
   Reported per model: the medians over rounds of the twin/model, copy/model and twin/copy ratios of
   TTFT and of the median ITL, and (with --threads 1, all of llama.cpp's work on this thread) of the
   process CPU time per generation, which depends less on what else the machine does. Exit 1 when any model's twin/copy TTFT ratio is off by more than
   --prefill-tolerance (8%) or its ITL ratio by more than --tolerance (5%).
   (Random-weight files in public models' shapes, as prediction_accuracy measures, cannot show
   this: their twins are random as they are. Only real weights show whether values move speed.)

    python -m benchmarks.twin_speed [--rounds 6] [--tokens 64] [--prompt 512] [--threads 1] [--models ...]
"""

from __future__ import annotations

import argparse
import contextlib
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from time import process_time_ns

from benchmarks.common import HF_CONFIGS, cpu_description, rotating_order
from ondevice.core import paths

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


SIDES = ("model", "copy", "twin")


def fidelity_check(label: str, real: Path, twin_dir: Path, args) -> dict[str, tuple[float, float]]:
    """{"twin", "copy", "twin/copy": (TTFT ratio, ITL ratio)} of one model: medians over rounds of the paired
    ratios (twin and copy each against the model, and the twin against the copy)."""
    from ondevice.quant.twin import read_header, write_twin

    from ondevice.engine import load
    from ondevice.probing.timing import probe_ids

    files = {
        "model": real,
        "copy": Path(shutil.copyfile(real, twin_dir / "copy.gguf")),
        "twin": write_twin(read_header(real), twin_dir / "twin.gguf", durable=False),
    }
    n_ctx = args.prompt + args.tokens + 64
    ttft: dict[str, list[float]] = {k: [] for k in SIDES}
    itl: dict[str, list[float]] = {k: [] for k in SIDES}
    cpu: dict[str, list[float]] = {k: [] for k in SIDES}
    with contextlib.ExitStack() as stack:
        for path in (files["copy"], files["twin"]):
            stack.callback(path.unlink, missing_ok=True)
        engines = {k: stack.enter_context(load(files[k], n_ctx=n_ctx, n_threads=args.threads)) for k in SIDES}
        for r in range(args.rounds + 1):  # round 0 warms all up (first use of the compute buffers) and is not counted
            prompt = probe_ids(engines["model"].n_vocab, args.prompt, salt=r)  # the same ids on every side
            for side in rotating_order(r, SIDES):
                c0 = process_time_ns()
                g = engines[side].generate(prompt, max_tokens=args.tokens, ignore_eos=True, reuse_prefix=False, seed=0)
                if r:
                    cpu[side].append(process_time_ns() - c0)
                    ttft[side].append(g.timings.ttft_s)
                    itl[side].append(statistics.median(g.timings.itl_s))

    def ratio(times: dict[str, list[float]], side: str, base: str) -> float:
        return statistics.median(a / b for a, b in zip(times[side], times[base]))

    ratios = {
        "twin": (ratio(ttft, "twin", "model"), ratio(itl, "twin", "model")),
        "copy": (ratio(ttft, "copy", "model"), ratio(itl, "copy", "model")),
        "twin/copy": (ratio(ttft, "twin", "copy"), ratio(itl, "twin", "copy")),
    }
    print(
        f"{label:<28} model TTFT({args.prompt}) {1e3 * statistics.median(ttft['model']):7.1f} ms, decode "
        f"{1 / statistics.median(itl['model']):6.1f} tok/s | TTFT, ITL ratios: "
        + ", ".join(f"{k} {p:.3f} {d:.3f}" for k, (p, d) in ratios.items())
        + f" | CPU time twin/copy {ratio(cpu, 'twin', 'copy'):.3f}",
        flush=True,
    )
    return ratios


def main() -> int:
    from benchmarks.prediction_accuracy import build_models

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512, help="prompt tokens of each generation (the prefill timed)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--models", default="default,ladder,chat", help="some of default, ladder, chat (real weights)")
    ap.add_argument("--repeat", type=int, default=3, help="write-time runs per figure (median)")
    ap.add_argument("--tolerance", type=float, default=0.05, help="decode: |twin/copy ITL ratio - 1| at most this")
    ap.add_argument(
        "--prefill-tolerance", type=float, default=0.08, help="prefill: |twin/copy TTFT ratio - 1| at most this"
    )
    ap.add_argument("--work", type=Path, default=Path.home() / ".cache" / "ondevice-bench" / "prediction")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for the twins and copies (default: where the product writes twins)",
    )
    ap.add_argument("--skip-writes", action="store_true")
    args = ap.parse_args()
    print(cpu_description())
    args.work.mkdir(parents=True, exist_ok=True)
    models = build_models(set(args.models.split(",")) & {"default", "ladder", "chat"}, args.work)
    misses = []
    if not args.skip_writes:
        with tempfile.TemporaryDirectory(dir=args.out) as folder:
            write_times(Path(folder), args.repeat)
    largest = max(path.stat().st_size for _, path in models)
    where = args.out or paths.scratch_dir(Path(tempfile.gettempdir()), 2 * largest)  # where the product times twins
    print(f"twin and copy against the model, {args.rounds} rounds, {args.threads} thread(s), written in {where}:")
    with tempfile.TemporaryDirectory(dir=where) as folder:
        for label, path in models:
            prefill, decode = fidelity_check(label, path, Path(folder), args)["twin/copy"]
            if abs(prefill - 1) > args.prefill_tolerance or abs(decode - 1) > args.tolerance:
                misses.append(label)
    verdict = f"FAIL: {', '.join(misses)}" if misses else "PASS"
    print(
        f"{verdict}: {len(models) - len(misses)}/{len(models)} models' twins within {args.prefill_tolerance:.0%} "
        f"(TTFT) and {args.tolerance:.0%} (ITL) of the model's copy"
    )
    return 1 if misses else 0


if __name__ == "__main__":
    sys.exit(main())
