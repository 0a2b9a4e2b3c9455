"""`ondevice bench compare` on live runs: a model against itself is noise, six times the layers is slower.

Builds two synthetic llamas alike but for depth (2 and 12 layers), runs `ondevice bench` on
[small, small] and on [small, large] (interleaved by repeat, in this process: `-p 32 -n 48
-r 5 -t 1 --scenarios resident`), then `ondevice bench compare` on each file. Live timings on a
shared machine drift by 10-40% within minutes, so the check calls only a change of more than
half a change (--threshold 0.5); the 5% verdicts are checked on known data in
tests/test_bench_compare.py, and on recorded runs in tests/test_bench_cli.py (`--record DIR`
writes this run's files under the names those tests read: same.json, slowed.json).

Exit status 1 when a verdict is wrong: a scenario of small against small not "no significant
difference", or one of small against large not "slower".

    python -m benchmarks.compare_verdicts [--repeats 5] [--threshold 0.5] [--record DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

SAME, SLOWER = "no significant difference", "slower"
SHAPE = dict(d_model=256, n_head=4, n_head_kv=2, d_ff=768, n_vocab=512, n_ctx_train=512)


def build_pair(folder: Path) -> tuple[Path, Path]:
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    small = build_synthetic_model(SynthConfig(n_layer=2, seed=5, **SHAPE), folder / "small.gguf")
    large = build_synthetic_model(SynthConfig(n_layer=12, seed=6, **SHAPE), folder / "large.gguf")
    return small, large


def bench_and_compare(models: list[Path], out: Path, args) -> list[str]:
    """Bench the models into `out`, compare the file's two models; the verdict of each scenario."""
    from ondevice.cli.main import main

    rc = main(
        [
            "bench",
            *map(str, models),
            "-p",
            "32",
            "-n",
            "48",
            "-r",
            str(args.repeats),
            "-t",
            "1",
            "--scenarios",
            "resident",
            "--no-progress",
            "--json",
            str(out),
        ]
    )
    if rc != 0:
        raise SystemExit(f"ondevice bench exited {rc}")
    cmp = out.with_suffix(".compare.json")
    if main(["bench", "compare", str(out), "--threshold", str(args.threshold), "--json", str(cmp)]) != 0:
        raise SystemExit("ondevice bench compare failed")
    return [s["verdict"] for s in json.loads(cmp.read_text())["scenarios"]]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="measured runs per model (default 5)")
    ap.add_argument("--threshold", type=float, default=0.5, help="bench compare --threshold (default 0.5)")
    ap.add_argument("--record", type=Path, help="copy the two bench files here as same.json and slowed.json")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        small, large = build_pair(folder)
        same = bench_and_compare([small, small], folder / "same.json", args)
        slowed = bench_and_compare([small, large], folder / "slowed.json", args)
        if args.record:
            args.record.mkdir(parents=True, exist_ok=True)
            for name in ("same.json", "slowed.json"):
                shutil.copyfile(folder / name, args.record / name)
    ok_same = bool(same) and all(v == SAME for v in same)
    ok_slowed = bool(slowed) and all(v == SLOWER for v in slowed)
    print(f"threshold {args.threshold}, {args.repeats} runs per model")
    print(
        f"small against small: {', '.join(same) or 'nothing compared'} (expected: {SAME}) -> {'ok' if ok_same else 'WRONG'}"
    )
    print(
        f"small against large: {', '.join(slowed) or 'nothing compared'} (expected: {SLOWER}) -> {'ok' if ok_slowed else 'WRONG'}"
    )
    return 0 if ok_same and ok_slowed else 1


if __name__ == "__main__":
    sys.exit(main())
