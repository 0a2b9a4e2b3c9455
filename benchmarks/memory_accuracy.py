"""The memory verdict's error: predicted total against what a process holds after load and after
a full context.

    python -m benchmarks.memory_accuracy                 # the default model + synthetic ones, 50 MB to ~3 GB
    python -m benchmarks.memory_accuracy --quick         # the 50 MB model at 512 tokens, f16 and q8_0
    python -m benchmarks.memory_accuracy --replay FILE [--solve] [--record FILE]   # recorded rows, predicted again
    python -m benchmarks.memory_accuracy --record benchmarks/data/memory_accuracy/NAME.json

Each (model, context, KV type) loads in a fresh child process: its RSS (or, on a GPU build, the
device's used memory, from ggml's own device query) is read before the load, after it, and after
the context has been filled to its last cell (a prompt of n_ctx - 1 tokens, one output token).
The growth is held against ondevice.roofline.memory's predicted total for the same settings, and
llama.cpp's logged buffer sizes are kept beside it. Targets: every row within ±10% of the growth
after a full context, and no row, after load or full, under by more than 5%, for model files from
about 50 MB up (a 1 MB model's rows are reported apart: the process's own megabytes outweigh it).
Rows are split by model into the ones the estimate's constants were solved on ("fit": the default
model, the 50 MB synthetic one and a 1 MB one; --replay FILE --solve) and the rest ("score"), both
reported. Exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

TOLERANCE, UNDER = 0.10, 0.05
TARGET_FROM_BYTES = 40_000_000  # the targets hold for model files from about 50 MB up
FIT_MODELS = ("default", "synth-50MB", "synth-tiny")  # the rows the estimate's constants were solved on (--solve)
# name -> (SynthConfig fields, quantize to or None). Sizes are the file's.
SYNTH = {
    "synth-tiny": (dict(), None),  # the tests' 2-layer model (1 MB): what a load and a request cost whatever the model
    "synth-50MB": (
        dict(d_model=384, n_layer=4, n_head=6, n_head_kv=2, d_ff=1024, n_vocab=32000, n_ctx_train=8192),
        None,
    ),
    "synth-300MB-Q4_0": (
        dict(d_model=2048, n_layer=8, n_head=16, n_head_kv=8, d_ff=5632, n_vocab=32000, n_ctx_train=16384),
        "Q4_0",
    ),
    "synth-550MB-Q8_0": (
        dict(d_model=2048, n_layer=8, n_head=16, n_head_kv=8, d_ff=5632, n_vocab=32000, n_ctx_train=16384),
        "Q8_0",
    ),
    "synth-1GB-F16": (
        dict(d_model=1024, n_layer=12, n_head=8, n_head_kv=8, d_ff=4096, n_vocab=151936, n_ctx_train=8192),
        None,
    ),
    "synth-3GB-F16": (
        dict(d_model=2048, n_layer=28, n_head=16, n_head_kv=8, d_ff=5632, n_vocab=32000, n_ctx_train=4096),
        None,
    ),
}
QUICK = ("synth-50MB",)


def _rss() -> dict:
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in ("VmRSS", "RssAnon", "RssFile", "VmHWM"):
                    out[key] = int(value.split()[0]) * 1024
    except OSError:
        import psutil

        out["VmRSS"] = psutil.Process().memory_info().rss
    return out


def _device_used() -> int | None:
    from ondevice.llama.devices import llama_devices

    gpus = [d for d in llama_devices() if d.kind in ("GPU", "IGPU") and d.memory_total_bytes]
    if not gpus:
        return None
    return sum(d.memory_total_bytes - (d.memory_free_bytes or 0) for d in gpus)


def child(job: dict) -> dict:
    """One load and fill in this process (a fresh one per job)."""
    from ondevice.engine import load
    from ondevice.llama.log import log_listener
    from ondevice.llama.memlog import parse_buffer_log
    from ondevice.llama.model import llama_lib

    llama_lib()
    base, dev0 = _rss(), _device_used()
    lines: list[str] = []
    with log_listener(lines.append):
        t0 = time.perf_counter()
        eng = load(
            job["path"],
            n_ctx=job["n_ctx"],
            cache_type_k=job["kv"],
            cache_type_v=job["kv"],
            n_gpu_layers=job.get("n_gpu_layers", "auto"),
        )
        load_s = time.perf_counter() - t0
    after_load, dev1 = _rss(), _device_used()
    seed = eng.tokenize("The Eiffel Tower is located in the city of Paris, the capital of France. ", add_bos=False)
    n = eng.n_ctx - 1
    ids = (seed * (n // max(1, len(seed)) + 1))[:n]
    t0 = time.perf_counter()
    eng.generate(ids, max_tokens=1, temperature=0)
    fill_s = time.perf_counter() - t0
    full, dev2 = _rss(), _device_used()
    info = eng.info
    eng.close()
    return dict(
        base=base,
        after_load=after_load,
        full=full,
        device_used=[dev0, dev1, dev2],
        load_s=load_s,
        fill_s=fill_s,
        backend=info.backend,
        n_gpu_layers=info.n_gpu_layers,
        n_ctx=info.n_ctx,
        n_ubatch=info.n_ubatch,
        n_batch=info.n_batch,
        flash_attn_used=info.flash_attn_used,
        cpu_buffers=info.cpu_buffers,
        buffers=parse_buffer_log(lines).to_dict(),
    )


def build_models(names, work: Path) -> dict[str, Path]:
    from ondevice.quant.quantize import quantize
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    from ondevice.models.materialize import resolve_model

    out = {}
    for name in names:
        if name == "default":
            out[name] = resolve_model(None)
            continue
        fields, qtype = SYNTH[name]
        dest = work / f"{name}.gguf"
        if not dest.exists():
            f16 = work / f"{name}-src.gguf" if qtype else dest
            if not f16.exists():
                build_synthetic_model(SynthConfig(**fields, name=name), f16)
            if qtype:
                quantize(f16, dest, qtype)
                f16.unlink()
        out[name] = dest
    return out


def predicted(path: Path, n_ctx: int, kv: str, row: dict) -> dict:
    """What ondevice.roofline.memory predicts for the settings the row ran with (its weights CPU_REPACK copies
    found as a load finds them)."""
    from ondevice.engine.memcheck import repacked_bytes_here
    from ondevice.gguf.spec import inspect
    from ondevice.roofline.memory import memory_need

    spec = inspect(path).with_kv_cache(kv, kv)
    layers = row["n_gpu_layers"] if row["backend"] != "CPU" else 0
    need = memory_need(
        spec,
        n_ctx=n_ctx,
        n_ubatch=row["n_ubatch"],
        flash_attn=row["flash_attn_used"] is not False,  # None: "auto" resolved without a log line (a quantized V)
        backend=row["backend"],
        n_gpu_layers=layers,
        unified=row["backend"] == "Metal",
        repacked_bytes=repacked_bytes_here(path, row["backend"], layers, spec.n_layer),
    )
    return asdict(need)


def measured(row: dict) -> tuple[int, int]:
    """(growth after load, growth after a full context): device memory on a GPU, else RSS."""
    dev = row["device_used"]
    if row["backend"] != "CPU" and None not in dev:
        host = row["full"]["VmRSS"] - row["base"]["VmRSS"]
        return dev[1] - dev[0] + (row["after_load"]["VmRSS"] - row["base"]["VmRSS"]), dev[2] - dev[0] + host
    return row["after_load"]["VmRSS"] - row["base"]["VmRSS"], row["full"]["VmRSS"] - row["base"]["VmRSS"]


def run_jobs(models: dict[str, Path], contexts, kvs, progress=print) -> list[dict]:
    from ondevice.gguf.spec import inspect

    rows = []
    for name, path in models.items():
        trained = inspect(path).n_ctx_train or 4096
        sizes = sorted({trained if c == "train" else min(int(c), trained) for c in contexts})
        for n_ctx in sizes:
            for kv in kvs:
                job = dict(path=str(path), n_ctx=n_ctx, kv=kv)
                done = subprocess.run(
                    [sys.executable, "-m", "benchmarks.memory_accuracy", "--child", json.dumps(job)],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    cwd=Path(__file__).resolve().parents[1],
                )
                if done.returncode != 0:
                    rows.append(dict(model=name, n_ctx=n_ctx, kv=kv, error=done.stderr.strip()[-400:]))
                    progress(f"{name} {n_ctx} {kv}: FAILED {rows[-1]['error'][-200:]}")
                    continue
                row = json.loads(done.stdout.strip().splitlines()[-1])
                row.update(
                    model=name, kv=kv, file_bytes=path.stat().st_size, group="fit" if name in FIT_MODELS else "score"
                )
                row["predicted"] = predicted(path, row["n_ctx"], kv, row)
                rows.append(row)
                progress(line(row))
    return rows


def errors(row: dict) -> tuple[float, float]:
    load, full = measured(row)
    total = row["predicted"]["total_bytes"]
    return total / load - 1.0, total / full - 1.0


def line(row: dict) -> str:
    if "error" in row:
        return f"{row['model']:<18} {row['n_ctx']:>6} {row['kv']:<5} FAILED"
    load, full = measured(row)
    p = row["predicted"]
    e_load, e_full = errors(row)
    return (
        f"{row['model']:<18} {row['group']:<5} {row['n_ctx']:>6} {row['kv']:<5} {p['total_bytes'] / 1e6:>8.0f} "
        f"{load / 1e6:>8.0f} {full / 1e6:>8.0f} {100 * e_load:>+7.1f}% {100 * e_full:>+7.1f}%  "
        f"(w {p['weight_bytes'] / 1e6:.0f} kv {p['kv_bytes'] / 1e6:.0f} buf {p['buffer_bytes'] / 1e6:.0f})"
    )


HEADER = (
    f"{'model':<18} {'group':<5} {'n_ctx':>6} {'kv':<5} {'pred MB':>8} {'load MB':>8} {'full MB':>8} "
    f"{'vs load':>8} {'vs full':>8}"
)


def summary(rows: list[dict]) -> tuple[list[str], bool]:
    """Per group (fit, score) the share within the target and the worst under-estimate; files under
    TARGET_FROM_BYTES (a process's own megabytes outweigh them) are reported apart and not held to it."""
    ok_rows = [r for r in rows if "error" not in r]
    out, met = [], bool(ok_rows) and len(ok_rows) == len(rows)
    for group in ("fit", "score", "small"):
        g = [r for r in ok_rows if _group(r) == group]
        if not g:
            continue
        full = [errors(r)[1] for r in g]
        worst_under = min(min(errors(r)) for r in g)
        within = sum(abs(e) <= TOLERANCE for e in full)
        out.append(
            f"{group}: {within}/{len(g)} rows within ±{TOLERANCE:.0%} of the full-context growth "
            f"(largest {100 * max(full, key=abs):+.1f}%); worst under {100 * worst_under:+.1f}%"
            + (" (files under 40 MB: not held to the target)" if group == "small" else "")
        )
        if group != "small":
            met = met and within == len(g) and worst_under >= -UNDER
    return out, met


def _group(row: dict) -> str:
    return "small" if row.get("file_bytes", 0) < TARGET_FROM_BYTES else row["group"]


def solve(report: dict, work: Path) -> dict:
    """The estimate's CPU constants from the fit rows alone: the tokenizer's bytes (after-load growth less the
    file, the repacked copy, the KV cache and the output buffer, against n_vocab) and what a request adds
    (full-context growth less all that and the masks, against d_model + the feed-forward width, and 1)."""
    import numpy as np

    from ondevice.engine.memcheck import repacked_bytes_here
    from ondevice.gguf.spec import inspect
    from ondevice.roofline import memory as mem

    rows = [r for r in report["rows"] if "error" not in r and r["group"] == "fit" and r["backend"] == "CPU"]
    models = build_models(sorted({r["model"] for r in rows}), work)
    load_x, load_y, full_x, full_y = [], [], [], []
    for r in rows:
        spec = inspect(models[r["model"]]).with_kv_cache(r["kv"], r["kv"])
        known = spec.file_bytes + repacked_bytes_here(models[r["model"]], "CPU", 0, spec.n_layer)
        known += r["n_ctx"] * spec.kv_bytes_per_token + 4 * spec.n_vocab
        load, full = measured(r)
        load_x.append([spec.n_vocab, 1.0])
        load_y.append(load - known)
        ub = min(r["n_ubatch"], r["n_ctx"])
        masks = mem._masks(spec) * r["n_ctx"] * ub * 2
        full_x.append([4 * ub * (spec.d_model + mem._d_ff(spec)), 1.0])
        full_y.append(full - known - masks)
    (alpha, beta), *_ = np.linalg.lstsq(np.array(load_x), np.array(load_y), rcond=None)
    tokenizer = np.array(load_x) @ [alpha, beta]
    (a, gamma), *_ = np.linalg.lstsq(np.array(full_x), np.array(full_y) - tokenizer, rcond=None)
    return {
        "VOCAB_ENTRY_BYTES": float(alpha),
        "VOCAB_FIXED_BYTES": float(beta),
        "ACT_FLOATS": float(a),
        "REQUEST_FIXED_BYTES": float(gamma),
    }


def replay(report: dict, work: Path, record: Path | None = None) -> int:
    """The recorded measurements against this code's prediction (the synthetic models are rebuilt: same bytes);
    with `record`, written there with the new predictions."""
    rows = [r for r in report["rows"] if "error" not in r]
    models = build_models(sorted({r["model"] for r in rows}), work)
    print(HEADER)
    for r in rows:
        r["predicted"] = predicted(models[r["model"]], r["n_ctx"], r["kv"], r)
        r["group"] = "fit" if r["model"] in FIT_MODELS else "score"
        print(line(r))
    lines, met = summary(rows)
    print("\n".join(lines))
    print("targets met" if met else "targets MISSED")
    if record:
        write_record(record, rows, lines, met, report.get("machine"), report.get("os"))
    return 0 if met else 1


def write_record(path: Path, rows: list[dict], lines: list[str], met: bool, machine=None, os_name=None) -> None:
    table = "\n".join([HEADER, *(line(r) for r in rows)])
    doc = dict(
        machine=machine or platform.processor() or platform.machine(),
        os=os_name or platform.platform(),
        rows=rows,
        summary=lines,
        met=met,
        table=table,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=1) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="the 50 MB synthetic model at 512 tokens, f16 and q8_0")
    ap.add_argument("--models", help="comma-separated: default," + ",".join(SYNTH))
    ap.add_argument("--contexts", default="512,4096,train", help="context sizes; 'train' = the trained context")
    ap.add_argument("--kv", default="f16,q8_0", help="KV cache types")
    ap.add_argument("--work", type=Path, help="where the synthetic models are built (default: a temporary folder)")
    ap.add_argument("--record", type=Path, help="write the rows and the summary as JSON here")
    ap.add_argument("--append", action="store_true", help="add the rows to those already in --record's file")
    ap.add_argument("--paths", help="comma-separated GGUF files to measure instead of --models (named by file)")
    ap.add_argument("--replay", type=Path, help="a recorded run: predict its rows again (models rebuilt in --work)")
    ap.add_argument(
        "--solve", action="store_true", help="with --replay: the estimate's CPU constants from its fit rows"
    )
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return 0
    if args.replay and args.solve:
        print(solve(json.loads(args.replay.read_text()), args.work or Path(tempfile.mkdtemp(prefix="ondevice-mem-"))))
        return 0
    if args.replay:
        work = args.work or Path(tempfile.mkdtemp(prefix="ondevice-mem-"))
        return replay(json.loads(args.replay.read_text()), work, args.record)
    names = QUICK if args.quick else (args.models.split(",") if args.models else ("default", *SYNTH))
    contexts = ("512",) if args.quick else args.contexts.split(",")
    with tempfile.TemporaryDirectory(prefix="ondevice-mem-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        if args.paths:
            models = {Path(p).stem: Path(p) for p in args.paths.split(",")}
        else:
            models = build_models(names, work)
        print(HEADER, flush=True)
        rows = run_jobs(models, contexts, args.kv.split(","), progress=lambda s: print(s, flush=True))
    if args.append and args.record and args.record.exists():
        rows = json.loads(args.record.read_text())["rows"] + rows
    lines, met = summary(rows)
    print("\n".join(lines))
    print("targets met" if met else "targets MISSED")
    if args.record:
        write_record(args.record, rows, lines, met)
    return 0 if met else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
