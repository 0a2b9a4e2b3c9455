"""What a first run costs, and how right its prediction is: `ondevice run` on the default model with an empty
cache (the bandwidth measured, the model timed with the quick plan) against the same command with both cached,
in pairs, each pair in fresh cache folders. The default model itself is assembled once beforehand and shared,
so what differs is the first contact alone.

Targets: the first run takes at most 3 s longer than the next (median over pairs), and its own prediction of
decode tok/s and TTFT is within +-15% of what it measured (median over pairs). Exit 1 when either is missed.

    python -m benchmarks.first_contact [--pairs 5]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUDGET_S, TOLERANCE = 3.0, 0.15
PROMPT = "The Eiffel Tower is located in the city of"
_RATE = re.compile(r"decode ([\d.]+) tok/s \(predicted ([\d.]+)")
_TTFT = re.compile(r"TTFT ([\d.]+) (ms|s) \(predicted ([\d.]+) (ms|s)")


def run_once(env: dict[str, str]) -> tuple[float, str]:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "ondevice.cli.main", "run", PROMPT, "-n", "32"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    return time.perf_counter() - t0, out.stderr.strip().splitlines()[-1]


def _seconds(value: str, unit: str) -> float:
    return float(value) / (1000.0 if unit == "ms" else 1.0)


def errors(line: str) -> tuple[float, float]:
    """(predicted / measured decode tok/s - 1, predicted / measured TTFT - 1) of a run line."""
    rate, ttft = _RATE.search(line), _TTFT.search(line)
    decode = float(rate.group(2)) / float(rate.group(1)) - 1
    return decode, _seconds(ttft.group(3), ttft.group(4)) / _seconds(ttft.group(1), ttft.group(2)) - 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pairs", type=int, default=5)
    args = ap.parse_args(argv)
    models = Path(tempfile.mkdtemp(prefix="ondevice-fc-models-"))
    added, decode_err, ttft_err = [], [], []
    for i in range(args.pairs):
        with tempfile.TemporaryDirectory(prefix="ondevice-fc-") as root:
            env = dict(
                os.environ,
                ONDEVICE_CACHE_DIR=f"{root}/cache",
                ONDEVICE_CONFIG_DIR=f"{root}/config",
                ONDEVICE_DATA_DIR=f"{root}/data",
            )
            (Path(root) / "cache").mkdir()
            os.symlink(models, Path(root) / "cache" / "models")  # the assembled default model, shared
            if i == 0:
                run_once(env)  # assembles the default model once into the shared folder
                for p in (Path(root) / "cache").iterdir():
                    if p.name != "models":
                        subprocess.run(["rm", "-rf", str(p)], check=True)
            first_s, first_line = run_once(env)
            next_s, _ = run_once(env)
        added.append(first_s - next_s)
        d, t = errors(first_line)
        decode_err.append(d)
        ttft_err.append(t)
        print(
            f"pair {i + 1}: first {first_s:.2f} s, next {next_s:.2f} s (+{first_s - next_s:.2f} s); "
            f"its prediction: decode {100 * d:+.1f}%, TTFT {100 * t:+.1f}%",
            flush=True,
        )
    med_added, med_d, med_t = statistics.median(added), statistics.median(decode_err), statistics.median(ttft_err)
    print(
        f"first contact adds {med_added:.2f} s (median; at most {max(added):.2f} s); its prediction: decode "
        f"{100 * med_d:+.1f}%, TTFT {100 * med_t:+.1f}% (medians)"
    )
    ok = med_added <= BUDGET_S and abs(med_d) <= TOLERANCE and abs(med_t) <= TOLERANCE
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
