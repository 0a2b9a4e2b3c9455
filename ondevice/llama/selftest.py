"""The crash guard's child: `python -m ondevice.llama.selftest MODE WORKDIR`.

Builds (once, in WORKDIR) a tiny synthetic model and its Q4_0, Q8_0 and Q4_K versions (the
weight types llama.cpp's AMX and CPU_REPACK buffers take), then loads each through the normal
open path with placement MODE ("all", "repack" or "none") and no GPU device (a GPU build too: the
check is of the CPU's kernels), prefills 64 tokens and decodes 4.
Exit 0 = those native paths ran; death by a signal = they fault on this machine.
"""

from __future__ import annotations

import sys
from pathlib import Path

WEIGHT_TYPES = ("Q4_0", "Q8_0", "Q4_K_M")  # file types whose matrices are Q4_0, Q8_0, Q4_K (pure)
PREFILL_TOKENS = 64  # a batch big enough for the tile (matrix-matrix) kernels
DECODE_STEPS = 4  # single-token steps (matrix-vector kernels)


def build_models(work: Path) -> list[Path]:
    """The test models in `work`, built on first use (row lengths a multiple of 256 for the K-quants)."""
    from ondevice.quant.quantize import quantize
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    base = work / "selftest-f16.gguf"
    if not base.exists():
        build_synthetic_model(SynthConfig(d_model=256, n_layer=1, n_head=4, n_head_kv=2, d_ff=512, n_vocab=512), base)
    out = []
    for qtype in WEIGHT_TYPES:
        dst = work / f"selftest-{qtype.lower()}.gguf"
        if not dst.exists():
            quantize(base, dst, qtype, threads=1, pure=True)
        out.append(dst)
    return out


def run_model(path: Path, mode: str) -> None:
    import llama_cpp as lib

    from ondevice.llama.guard import Verdict
    from ondevice.llama.model import load_model, new_context

    # CPU only: the check is of the CPU's buffer types and kernels, on a GPU build too
    verdict = Verdict(mode, "self-test", "child")
    model, _ = load_model(path, n_gpu_layers=0, verdict=verdict, lib=lib, cpu_only=True, first_open=False)
    try:
        ctx, _ = new_context(model, n_ctx=256, n_threads=1, n_batch=PREFILL_TOKENS, lib=lib)
        try:
            batch = lib.llama_batch_init(PREFILL_TOKENS, 0, 1)
            try:
                _decode(lib, ctx, batch, list(range(3, 3 + PREFILL_TOKENS)), 0)
                for step in range(DECODE_STEPS):
                    _decode(lib, ctx, batch, [10 + step], PREFILL_TOKENS + step)
            finally:
                lib.llama_batch_free(batch)
        finally:
            lib.llama_free(ctx)
    finally:
        lib.llama_model_free(model)


def _decode(lib, ctx, batch, tokens: list[int], pos0: int) -> None:
    from ondevice.llama.model import fill_batch

    fill_batch(batch, tokens, pos0, lambda i: i == len(tokens) - 1)
    rc = lib.llama_decode(ctx, batch)
    if rc != 0:
        raise RuntimeError(f"llama_decode returned {rc}")


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m ondevice.llama.selftest", description="the crash guard's child")
    parser.add_argument("mode", choices=("all", "repack", "none"), help="extra CPU buffer types to load with")
    parser.add_argument("workdir", type=Path, help="where the test models are built (once)")
    args = parser.parse_args(argv)  # a wrong call: argparse's usage line and exit 2
    for path in build_models(args.workdir):
        run_model(path, args.mode)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
