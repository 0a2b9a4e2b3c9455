"""How right is the host probe? ondevice's read passes against a plain C read kernel's, on this machine.

The C kernel (OpenMP, same threads, same array size, huge pages as numpy asks for them, 16-byte GNU
C vectors so that plain -O2 reads a cache line in four loads) is compiled here with gcc -O2 -fopenmp
and stays running, its array filled once, so one pass of it takes about 10 ms and can sit right
beside one of the probe's. Pass by pass, because this VM's bandwidth will not hold still for longer:
over a few minutes it switched between about 36 and 63 GB/s, at times every few seconds, at others
in bursts of 10-50 ms that one pass in twenty caught. A best-of-N figure catches such a burst or not
by chance: taken one after the other (C's best of 5, then the probe's), their ratio ran from 0.50 to
1.49 in one run, where the pass-by-pass ratio of the same kernels, minutes later, was 0.99.

1. Read passes: each round fills the probe's own arrays afresh (ondevice.probing.host.MemoryPasses,
   what probe_memory and so the first-contact probe measure with) and takes PAIRS_PER_ROUND of its
   read passes, each between two C passes. The ratio is the median over every adjacent pair of
   passes (C then probe, probe then C) of probe / C: a pass that caught a burst or a stall, on
   either side, moves two pairs and the median little, and nothing is set aside (a filter on how
   steady C's side looked would drop C's stalled passes and keep the probe's; on one noisy run's
   passes it gave 0.958 where the pairs give 0.955, so it did not matter there). It must be within
   +-5%: issue 15's bound for the first-contact probe, which reads with the same passes as
   `ondevice probe` (+-10%), only more of them.
2. The probe a first `ondevice run` takes (ondevice.api.first_contact: host only, no disk read,
   measured and not saved), timed whole, each round: done within 3 s every time. Its figure is
   shown beside C's best of as many passes taken just before it, not checked (see above).

    python -m benchmarks.host_accuracy [--rounds 9] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import write_json

C_READ = r"""
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <sys/mman.h>
#include <omp.h>
typedef long long v2 __attribute__((vector_size(16)));  /* GNU C vectors: SSE2 at plain -O2 */
/* read-only bandwidth: each thread sums its own contiguous slice, one 64-byte line per step.
   argv[1]: array bytes. Prints "ready" once the array is filled, then for every line "P" on stdin
   the best GB/s of P passes. */
int main(int argc, char **argv) {
    size_t n = (size_t)atoll(argv[1]) / 8; int passes; uint64_t sink = 0;
    uint64_t *a = aligned_alloc(1 << 21, n * 8);
    if (!a) return 1;
    madvise(a, n * 8, MADV_HUGEPAGE);
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) a[i] = i;
    printf("ready\n"); fflush(stdout);
    while (scanf("%d", &passes) == 1) {
        double best = 1e30;
        for (int p = 0; p < passes; p++) {
            double t = omp_get_wtime(); uint64_t total = 0;
            #pragma omp parallel reduction(+:total)
            {
                size_t nt = omp_get_num_threads(), id = omp_get_thread_num();
                size_t lo = (n * id / nt) & ~(size_t)7, hi = (n * (id + 1) / nt) & ~(size_t)7;
                v2 x0 = {0, 0}, x1 = {0, 0}, x2 = {0, 0}, x3 = {0, 0};
                const v2 *v = (const v2 *)(a + lo);
                for (size_t i = 0; i < (hi - lo) / 2; i += 4) { x0 += v[i]; x1 += v[i + 1]; x2 += v[i + 2]; x3 += v[i + 3]; }
                v2 x = x0 + x1 + x2 + x3;
                total += (uint64_t)(x[0] + x[1]);
            }
            t = omp_get_wtime() - t; if (t < best) best = t; sink += total;
        }
        printf("%.4f %d\n", n * 8 / best / 1e9, (int)(sink & 1)); fflush(stdout);
    }
    return 0;
}
"""

PAIRS_PER_ROUND = 20  # probe read passes per round, each between two C passes
TOLERANCE = 0.05  # the paired ratio's bound (issue 15: +-5% for the first-contact probe, +-10% for the probe)
MAX_FIRST_CONTACT_S = 3.0
# pause after each first-contact probe: right after one the C kernel read 10-20% slower (28-33 against
# 32-39 GB/s before, AMD EPYC VM, 10 rounds) and was back 0.3 s later
REST_S = 0.5


def say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


class CReadKernel:
    """The C read kernel, compiled and running with its array filled: read_gbs(passes) -> best GB/s."""

    def __init__(self, array_bytes: int, threads: int, workdir: Path):
        gcc = shutil.which("gcc")
        if gcc is None:
            raise FileNotFoundError("gcc not found")
        src, exe = workdir / "read.c", workdir / "read"
        src.write_text(C_READ)
        subprocess.run([gcc, "-O2", "-fopenmp", str(src), "-o", str(exe)], check=True)
        # passive: its idle threads sleep while the probe runs, instead of spinning on the same cores
        env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OMP_PROC_BIND": "false", "OMP_WAIT_POLICY": "passive"}
        self._proc = subprocess.Popen(
            [str(exe), str(array_bytes)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )
        if self._proc.stdout.readline().strip() != "ready":
            self.close()
            raise RuntimeError("the C read kernel did not start")

    def read_gbs(self, passes: int) -> float:
        self._proc.stdin.write(f"{passes}\n")
        self._proc.stdin.flush()
        return float(self._proc.stdout.readline().split()[0])

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=30)

    def __enter__(self) -> CReadKernel:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def interleaved(c_read, probe_read, pairs: int) -> list[dict]:
    """C pass, probe pass, C pass, ... (`pairs` probe passes, GB/s each): one dict per probe pass with
    its two C neighbours."""
    c = [c_read()]
    taken = []
    for _ in range(pairs):
        gbs = probe_read()
        c.append(c_read())
        taken.append({"probe_gbs": gbs, "c_before_gbs": c[-2], "c_after_gbs": c[-1]})
    return taken


def paired_ratio(taken: list[dict]) -> float:
    """The median over every adjacent pair of passes of probe / C (two per probe pass: its C
    neighbours either side); NaN with none."""
    ratios = [t["probe_gbs"] / t[side] for t in taken for side in ("c_before_gbs", "c_after_gbs")]
    return statistics.median(ratios) if ratios else float("nan")


def read_check(kernel: CReadKernel, rounds: int, threads: int, size: int) -> dict:
    """Check 1: every round the probe's arrays filled afresh, then PAIRS_PER_ROUND interleaved passes."""
    from ondevice.probing.host import MemoryPasses

    passes, per_round, kernel_name = [], [], ""
    for r in range(rounds):
        with MemoryPasses(threads, size) as arrays:
            kernel_name = arrays.read_kernel
            taken = interleaved(
                lambda: kernel.read_gbs(1), lambda: arrays.array_bytes / arrays.read_s(1) / 1e9, PAIRS_PER_ROUND
            )
        passes += taken
        per_round.append(paired_ratio(taken))
        say(
            f"read passes, round {r + 1}/{rounds}: probe/C {per_round[-1]:.3f}; best pass C "
            f"{max(t['c_before_gbs'] for t in taken):.1f}, probe {max(t['probe_gbs'] for t in taken):.1f} GB/s"
        )
    ratio = paired_ratio(passes)
    return {
        "passes": passes,
        "round_ratios": per_round,
        "ratio": ratio,
        "within": abs(ratio - 1) <= TOLERANCE,
        "read_kernel": kernel_name,
        "probe_median_gbs": statistics.median(t["probe_gbs"] for t in passes),
        "c_median_gbs": statistics.median(t["c_before_gbs"] for t in passes),
    }


def first_contact_check(kernel: CReadKernel, rounds: int) -> dict:
    """Check 2: C's best of FIRST_CONTACT_PASSES passes, then the first-contact probe, timed whole."""
    from ondevice.api import FIRST_CONTACT_PASSES, first_contact
    from ondevice.probing import default_backend

    taken = []
    for r in range(rounds):
        c = kernel.read_gbs(FIRST_CONTACT_PASSES)
        t0 = time.perf_counter()
        result = first_contact(default_backend(), refresh=True, save=False)  # what a first run measures, not cached
        taken.append({"c_gbs": c, "probe_gbs": result.memory.read_gbs, "elapsed_s": time.perf_counter() - t0})
        say(
            f"first contact, round {r + 1}/{rounds}: {taken[-1]['elapsed_s']:.2f} s, read {result.memory.read_gbs:.1f} "
            f"GB/s (C just before: {c:.1f})"
        )
        time.sleep(REST_S)
    elapsed = [t["elapsed_s"] for t in taken]
    return {
        "rounds": taken,
        "median_elapsed_s": statistics.median(elapsed),
        "max_elapsed_s": max(elapsed),
        "within_3s": max(elapsed) <= MAX_FIRST_CONTACT_S,
        "best_of_ratio": statistics.median(t["probe_gbs"] / t["c_gbs"] for t in taken),
    }


def host_check(rounds: int, threads: int | None) -> dict:
    """Both checks, with one C read kernel running throughout."""
    from ondevice.probing import hardware
    from ondevice.probing.host import array_bytes_for

    info = hardware.detect()
    threads = threads or hardware.default_threads(info)
    size = array_bytes_for(info.llc_bytes, info.ram_available_bytes)
    with tempfile.TemporaryDirectory() as tmp:
        try:
            kernel = CReadKernel(size, threads, Path(tmp))
        except FileNotFoundError as exc:
            return {"skipped": str(exc)}
        with kernel:
            read = read_check(kernel, rounds, threads, size)
            first = first_contact_check(kernel, rounds)
    return {"threads": threads, "array_bytes": size, **read, "first_contact": first}


def misses(h: dict) -> list[str]:
    """Every missed host target, one line each (empty: all met)."""
    if "skipped" in h:
        return []
    out = []
    if not h["within"]:
        out.append(f"host read: probe/C pass ratio {h['ratio']:.3f} outside +-{TOLERANCE:.0%}")
    fc = h["first_contact"]
    if not fc["within_3s"]:
        out.append(f"first-contact probe: took {fc['max_elapsed_s']:.2f} s (more than {MAX_FIRST_CONTACT_S:.0f} s)")
    return out


def render(h: dict) -> list[str]:
    if "skipped" in h:
        return [f"host read: skipped ({h['skipped']})"]
    fc = h["first_contact"]
    return [
        f"host read passes, {h['threads']} threads, {h['array_bytes'] >> 20} MiB: probe ({h.get('read_kernel') or '?'}) "
        f"{h['probe_median_gbs']:.2f} GB/s "
        f"vs C {h['c_median_gbs']:.2f} GB/s (medians of {len(h['passes'])} passes each); "
        f"paired ratio {h['ratio']:.3f} ({'within' if h['within'] else 'OUTSIDE'} +-{TOLERANCE:.0%}); per round "
        + " ".join(f"{x:.3f}" for x in h["round_ratios"]),
        f"first-contact probe (host only): took {fc['median_elapsed_s']:.2f} s median, {fc['max_elapsed_s']:.2f} s at "
        f"most ({'within' if fc['within_3s'] else 'OVER'} {MAX_FIRST_CONTACT_S:.0f} s); its read figure against C's "
        f"best of as many passes just before: {fc['best_of_ratio']:.3f} (median; not checked: best-of figures "
        f"catch this VM's speed bursts by chance)",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=9, help="rounds of each check (default 9)")
    ap.add_argument(
        "--threads", type=int, help="threads for both kernels (default: the engine's, one per physical core)"
    )
    ap.add_argument("--json", type=Path, help="write all figures here")
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    report = host_check(args.rounds, args.threads)
    missed = misses(report)
    print("\n".join(render(report) + ([f"target NOT met: {m}" for m in missed] or ["targets met"])))
    if args.json:
        write_json(args.json, report)
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
