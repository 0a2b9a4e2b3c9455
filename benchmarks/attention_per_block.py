"""What a long context adds to a decode step, per block, on twins of a model of fewer blocks and on the model itself:
the premise of roofline.extrapolate_layers, which multiplies the fewer twin's attention by the model's blocks.

MODEL is a GGUF file. Its twins of each --blocks count (quant.twin, holding the model's own bytes, each twin block
its model block's) are written in shared memory; a count of at least the model's blocks is the file itself. Each
engine is prefilled with --context tokens and a sibling context (Engine.sibling) with 16; per trial (the order of the
counts alternating) both decode --steps steps alternating every step, as time_pair's bursts do, and long minus short
over the blocks is that trial's attention per block. Per count: the median over the trials, each trial's, and that
median times the model's blocks. It checks nothing and exits 0: what it shows is read.

    python -m benchmarks.attention_per_block MODEL.gguf [--blocks 1,3,32] [--context 1538] [--trials 4]
        [--steps 32] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

from benchmarks.common import add_threads_arg, cpu_name


def twin_files(model: Path, counts: list[int], work: Path) -> tuple[dict[int, Path], int]:
    """({blocks: the twin's path, or the model's own for a count of at least its blocks}, the model's blocks)."""
    from ondevice.quant.twin import ModelData, matching_blocks, read_header, reduce_layers, write_twin

    from ondevice.gguf.spec import inspect

    header = read_header(model)
    n_layer = int(inspect(model).n_layer or 0)
    files = {}
    for n in counts:
        if n >= n_layer:
            files[n] = model
            continue
        picks = matching_blocks(header, n)
        twin = reduce_layers(header, len(picks), picks)
        files[n] = write_twin(
            twin, work / f"attention-twin-{n}.gguf", durable=False, model=ModelData(model, tuple(picks))
        )
    return files, n_layer


def per_block(files: dict[int, Path], n_layer: int, args) -> dict[int, list[float]]:
    """{blocks: each trial's long-minus-short decode step over the blocks (at most n_layer, the file's), seconds}."""
    import ondevice.probing.timing as timing
    from ondevice.engine import load

    n_ctx = max(256, args.context + args.steps + 64)  # llama.cpp rounds it up to a multiple of 256
    out: dict[int, list[float]] = {n: [] for n in files}
    with contextlib.ExitStack() as stack:
        engines = {n: stack.enter_context(load(p, n_ctx=n_ctx, n_threads=args.threads)) for n, p in files.items()}
        shorts = {n: stack.enter_context(contextlib.closing(e.sibling(256))) for n, e in engines.items()}
        for trial in range(args.trials):
            for n in list(files) if trial % 2 == 0 else list(files)[::-1]:
                long_e, short_e = engines[n], shorts[n]
                long_ids = timing.probe_ids(long_e.n_vocab, args.context, 7 + trial)
                short_ids = timing.probe_ids(long_e.n_vocab, 16, 3 + trial)
                for engine, ids in ((long_e, long_ids), (short_e, short_ids)):
                    engine.generate(ids, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
                long_s, short_s = timing._decode_bursts(long_e, long_ids, short_e, short_ids, args.steps)
                out[n].append((long_s - short_s) / min(n, n_layer))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--blocks", default="1,3,1000", help="block counts of the twins (at least the model's: itself)")
    ap.add_argument("--context", type=int, default=1538)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    from ondevice.core import paths

    counts = sorted({int(b) for b in args.blocks.split(",")})
    work = paths.scratch_dir(Path.cwd(), args.model.stat().st_size)
    try:
        files, n_layer = twin_files(args.model, counts, work)
        found = per_block(files, n_layer, args)
    finally:
        for n in counts:
            (work / f"attention-twin-{n}.gguf").unlink(missing_ok=True)
    print(f"CPU: {cpu_name()}; {args.model.name} ({n_layer} blocks); long context {args.context} tokens")
    print(f"{args.trials} trials of {args.steps} steps per context, alternating every step; figures in ms")
    for n, values in found.items():
        mid = statistics.median(values)
        print(
            f"{min(n, n_layer):3d} blocks: attention per block {mid * 1e3:.3f} (x{n_layer} = "
            f"{mid * n_layer * 1e3:.2f}); trials {' '.join(f'{v * 1e3:.3f}' for v in values)}"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
