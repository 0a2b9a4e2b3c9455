"""How steady the twins' paired decode differences are, by how many steps each engine decodes before the other
takes over: the premise of probing.timing._BURST. time_pair measures what a long context adds to a twin's decode step
as the difference of two engines on the same twin file decoding in alternating bursts, one with a long context
cached, one with a short; that difference is multiplied by the model's blocks over the twin's.

MODEL is a GGUF file or a Hugging Face config.json (with --quant): its twin of --blocks blocks (quant.twin, random
data) is written in shared memory, two engines are opened on it, the long one prefilled with --context tokens, and
each trial decodes --steps steps on each engine in bursts of every size in --bursts (the trials interleave the
sizes). Per size: the median long-minus-short difference over the trials and its interquartile range over that
median; the short engine's step beside. It checks nothing and exits 0: what it shows is read.

    python -m benchmarks.burst_size MODEL [--quant Q4_K_M] [--blocks 1] [--context 1536] [--trials 12]
        [--bursts 4,1] [--steps 16] [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from pathlib import Path

from benchmarks.common import add_threads_arg, cpu_name


def twin_header(model: Path, quant: str | None, blocks: int):
    """The header of MODEL's twin of `blocks` blocks (in the model's mix of block types)."""
    from ondevice.quant.hfconfig import header_from_hf_config
    from ondevice.quant.twin import matching_blocks, quantized_header, read_header, reduce_layers

    if model.suffix == ".json":
        header = quantized_header(header_from_hf_config(model), quant or "Q4_K_M")
    else:
        header = read_header(model)
    picks = matching_blocks(header, blocks)
    return reduce_layers(header, len(picks), picks)


def differences(path: Path, args) -> dict[int, tuple[list[float], list[float]]]:
    """{burst size: (long-minus-short step differences, short steps) of every trial}, seconds."""
    import ondevice.probing.timing as timing
    from ondevice.engine import load

    sizes = [int(b) for b in args.bursts.split(",")]
    out: dict[int, tuple[list[float], list[float]]] = {b: ([], []) for b in sizes}
    n_ctx = -(-(args.context + args.steps + 64) // 256) * 256
    with (
        load(path, n_ctx=n_ctx, n_threads=args.threads) as long_e,
        load(path, n_ctx=n_ctx, n_threads=args.threads) as short_e,
        long_e.side_requests(),
        short_e.side_requests(),
    ):
        long_ids = timing.probe_ids(long_e.n_vocab, args.context, 5)
        long_e.generate(long_ids, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
        for trial in range(args.trials):
            for b in sizes:
                short_ids = timing.probe_ids(short_e.n_vocab, 16, trial)
                with _burst(timing, b):
                    long_s, short_s = timing._decode_bursts(long_e, long_ids, short_e, short_ids, args.steps)
                out[b][0].append(long_s - short_s)
                out[b][1].append(short_s)
    return out


@contextlib.contextmanager
def _burst(timing, size: int):
    saved, timing._BURST = timing._BURST, size
    try:
        yield
    finally:
        timing._BURST = saved


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--quant", default=None, help="weight type of a config.json's twin (default Q4_K_M)")
    ap.add_argument("--blocks", type=int, default=1)
    ap.add_argument("--context", type=int, default=1536)
    ap.add_argument("--trials", type=int, default=12)
    ap.add_argument("--bursts", default="4,1")
    ap.add_argument("--steps", type=int, default=16)
    add_threads_arg(ap)
    args = ap.parse_args(argv)
    from ondevice.quant.twin import write_twin

    from ondevice.core import paths

    header = twin_header(args.model, args.quant, args.blocks)
    work = paths.scratch_dir(Path.cwd(), sum(t.n_bytes for t in header.tensors))
    path = work / f"burst-size-twin-{args.blocks}.gguf"
    try:
        write_twin(header, path, durable=False)
        found = differences(path, args)
    finally:
        path.unlink(missing_ok=True)
    print(f"CPU: {cpu_name()}; twin of {args.blocks} block(s) of {args.model.name}; long context {args.context} tokens")
    print(f"{args.trials} trials of {args.steps} steps per engine; figures in ms")
    for b, (diffs, shorts) in found.items():
        q1, mid, q3 = statistics.quantiles(diffs, n=4)
        print(
            f"bursts of {b}: long-short median {mid * 1e3:6.2f}, IQR/median {(q3 - q1) / mid:5.2f}; short step"
            f" {statistics.median(shorts) * 1e3:6.2f}  (trials {' '.join(f'{d * 1e3:.2f}' for d in diffs)})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
