"""The GPU device check: build llama-cpp-python for the device, install this project, run every
product path on the GPU and record it, in one bounded run.

On the device machine (no network; `.device/` filled beforehand by benchmarks/device_prep.py and
carried with the working tree):

    python3 -m benchmarks.device_check                   # writes $OUT/device_check.json and summary.txt

Here, on the CPU, to test the script end to end (no build, this interpreter's install, a tiny model):

    python -m benchmarks.device_check --cpu --out /tmp/device-check

Each step runs guarded and time-bounded (a failure or a time-out is recorded and the next step
runs), the JSON is rewritten after every step (a killed run keeps what it did), and a step that
cannot start with its budget left before the deadline (--deadline, 540 s) is recorded as skipped.
Steps, in order: gpu (nvidia-smi, compute capability), build (llama-cpp-python for that one
architecture, parallel, timed; the wheel comes back in $OUT in parts, and a later run that carries
them in .device/cache/ installs it instead of building), install (the wheels and this project, not
editable; with pip's --target into /tmp/odv-site, since the image's python3 is itself a venv), then,
with that on PYTHONPATH: system (llama.cpp's system info, ondevice's detection),
model (the default model's header with zero weights: same shapes, same speed on a GPU, a meaningless
answer), run (README's first command, full offload, llama.cpp's buffer log), info, probe (the GPU's
bandwidth from llama.cpp's kernels), predict, bench (quick suite: measured beside predicted), fit
(run --fit), batch (bench --batch 1,4,16), memory (the verdict against the device memory used),
config8b (`ondevice predict --config` on Llama 3.1 8B's config.json), twin8b (its twin, `ondevice
twin`, then predict and bench), tests (pytest -m gpu). The first run on a fresh machine spends most
of its time building; carry the wheel parts it returns in .device/cache/ and run it again for the rest.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEVICE = ROOT / ".device"
PROMPT = "The Eiffel Tower is located in the city of"
PIP_TARGET = ["-m", "pip", "install", "--no-deps", "--no-index", "--no-build-isolation", "--upgrade", "--target"]
WHEEL_PART_BYTES = 15 << 20  # a file back from $OUT may be 16 MiB
CONFIG_8B = ROOT / "tests" / "data" / "hf_configs" / "llama-3.1-8b.json"


def parse_compute_caps(text: str) -> list[str]:
    """`nvidia-smi --query-gpu=compute_cap --format=csv,noheader` ("9.0" per GPU) -> CMake architectures ["90"]."""
    out = []
    for line in text.splitlines():
        m = re.fullmatch(r"\s*(\d+)\.(\d+)\s*", line.split(",")[-1])
        if m and f"{m[1]}{m[2]}" not in out:
            out.append(f"{m[1]}{m[2]}")
    return out


def bench_rows(doc: dict) -> list[dict]:
    """The figures the summary holds from a bench result document: measured against predicted."""
    rows = []
    for r in doc.get("results", []):
        p50 = lambda k: (r.get(k) or {}).get("p50")  # noqa: E731 - one lookup, five uses
        rows.append(
            dict(
                model=r.get("model"),
                scenario=r.get("scenario"),
                workload=r.get("workload"),
                decode_tok_s=p50("decode_tok_s"),
                predicted_tok_s=r.get("predicted_tok_s"),
                ceiling_tok_s=r.get("ceiling_tok_s"),
                efficiency=r.get("efficiency"),
                ttft_s=p50("ttft_s"),
                predicted_ttft_s=r.get("predicted_ttft_s"),
                prefill_tok_s=p50("prefill_tok_s"),
                peak_rss_bytes=r.get("peak_rss_bytes"),
            )
        )
    return rows


class Check:
    """Runs steps against a deadline and records each one into out/device_check.json."""

    def __init__(self, out: Path, deadline_s: float, env: dict):
        self.out, self.t0, self.deadline_s, self.env = out, time.monotonic(), deadline_s, env
        self.steps: list[dict] = []
        self.facts: dict = {}
        self.log = (out / "log.txt").open("a", encoding="utf-8")

    def left(self) -> float:
        return self.deadline_s - (time.monotonic() - self.t0)

    def sh(self, argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
        self.log.write(f"\n$ {' '.join(map(str, argv))}\n")
        done = subprocess.run(
            [str(a) for a in argv],
            capture_output=True,
            text=True,
            timeout=max(1.0, min(timeout, self.left())),
            env={**os.environ, **self.env, **kw.pop("env", {})},
            **kw,
        )
        self.log.write(done.stdout[-20000:] + done.stderr[-20000:])
        self.log.flush()
        return done

    def step(self, name: str, budget_s: float, fn) -> dict | None:
        rec: dict = {"step": name, "budget_s": budget_s}
        if self.left() < min(budget_s, 30):
            rec.update(status="skipped", detail=f"{self.left():.0f} s left before the deadline")
        else:
            t = time.monotonic()
            try:
                rec.update(status="ok", **(fn(min(budget_s, self.left())) or {}))
            except subprocess.TimeoutExpired as exc:
                rec.update(status="timeout", detail=f"over {exc.timeout:.0f} s")
            except Exception as exc:  # noqa: BLE001 - a failed step is recorded, the check goes on
                rec.update(status="failed", detail=f"{type(exc).__name__}: {str(exc)[-1500:]}")
            rec["seconds"] = round(time.monotonic() - t, 1)
        self.steps.append(rec)
        self.save()
        return rec if rec["status"] == "ok" else None

    def save(self) -> None:
        doc = {"facts": self.facts, "steps": self.steps, "elapsed_s": round(time.monotonic() - self.t0, 1)}
        (self.out / "device_check.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        (self.out / "summary.txt").write_text(summary(doc) + "\n")


def checked(done: subprocess.CompletedProcess, what: str) -> subprocess.CompletedProcess:
    if done.returncode != 0:
        raise RuntimeError(f"{what}: exit {done.returncode}: {(done.stderr or done.stdout).strip()[-1200:]}")
    return done


def summary(doc: dict) -> str:
    """A short text: each step's status and time, then the figures that matter."""
    lines = [f"device check: {doc['elapsed_s']:.0f} s"]
    for s in doc["steps"]:
        said = s.get("note", s.get("detail", ""))
        lines.append(f"  {s['step']:<10} {s['status']:<8} {s.get('seconds', 0):>6.1f} s  {said}".rstrip()[:200])
    f = doc["facts"]
    for key in ("gpu", "arch", "build_s", "answer", "run_line", "fit_line", "probe_gbs"):
        if f.get(key) is not None:
            lines.append(f"{key}: {f[key]}")
    for r in f.get("bench", []):
        if r.get("decode_tok_s") is None:  # the load scenarios time loads, not decoding
            continue
        eff = f"{r['efficiency']:.2f}" if r.get("efficiency") else "-"
        lines.append(
            f"bench {r['model']} {r['scenario']} {r['workload']}: decode {r['decode_tok_s'] or 0:.1f} tok/s "
            f"(predicted {r['predicted_tok_s'] or 0:.1f}, eff {eff}), TTFT {1e3 * (r['ttft_s'] or 0):.1f} ms "
            f"(predicted {1e3 * (r['predicted_ttft_s'] or 0):.1f})"
        )
    for m in f.get("memory", []):
        lines.append(f"memory {m}")
    return "\n".join(lines)


# ---------- the steps ----------


def step_gpu(c: Check, cpu: bool):
    def run(budget):
        if cpu:
            c.facts.update(gpu="none (--cpu)", arch=None)
            return {"note": "CPU mode: no GPU"}
        q = checked(
            c.sh(
                [
                    "nvidia-smi",
                    "--query-gpu=name,memory.total,memory.free,driver_version,compute_cap",
                    "--format=csv,noheader,nounits",
                ],
                budget,
            ),
            "nvidia-smi",
        )
        caps = parse_compute_caps(q.stdout)
        c.facts.update(gpu=q.stdout.strip(), arch=caps[0] if caps else None, nvidia_smi=q.stdout)
        return {"note": f"{q.stdout.strip()} -> CMAKE_CUDA_ARCHITECTURES={c.facts['arch']}"}

    return run


def step_build(c: Check, py: str, site: Path):
    def run(budget):
        cached = sorted(glob.glob(str(DEVICE / "cache" / "*.whl.part*")))
        wheel_dir = Path("/tmp/odv-wheel")
        wheel_dir.mkdir(exist_ok=True)
        if cached:
            name = Path(cached[0]).name.split(".part")[0]
            with open(wheel_dir / name, "wb") as w:
                for part in cached:
                    w.write(Path(part).read_bytes())
            note = f"cached wheel {name}"
        else:
            (sdist,) = DEVICE.glob("llama_cpp_python-*-stripped.tar.gz")
            env = {
                "CMAKE_ARGS": f"-DGGML_CUDA=on -DCMAKE_CUDA_ARCHITECTURES={c.facts.get('arch') or 'native'}",
                "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 8),
            }
            t = time.monotonic()
            checked(
                c.sh(
                    [
                        py,
                        "-m",
                        "pip",
                        "wheel",
                        "--no-deps",
                        "--no-build-isolation",
                        "--no-index",
                        "-w",
                        wheel_dir,
                        sdist,
                    ],
                    budget,
                    env=env,
                ),
                "llama-cpp-python build",
            )
            c.facts["build_s"] = round(time.monotonic() - t, 1)
            note = f"built in {c.facts['build_s']} s"
            for whl in wheel_dir.glob("*.whl"):  # back in $OUT: carry them in .device/cache/ to skip the build
                data = whl.read_bytes()
                for i in range(0, len(data), WHEEL_PART_BYTES):
                    (c.out / f"{whl.name}.part{i // WHEEL_PART_BYTES:02d}").write_bytes(data[i : i + WHEEL_PART_BYTES])
        (whl,) = wheel_dir.glob("llama_cpp_python-*.whl")
        checked(c.sh([py, *PIP_TARGET, site, whl], 120), "install")
        return {"note": note}

    return run


def step_install(c: Check, py: str, site: Path):
    def run(budget):
        wheels = sorted(str(p) for p in (DEVICE / "wheels").glob("*.whl"))
        if wheels:
            checked(c.sh([py, *PIP_TARGET, site, *wheels], budget), "wheels")
        checked(c.sh([py, *PIP_TARGET, site, ROOT], budget), "project")
        shutil.rmtree(ROOT / "build", ignore_errors=True)  # setuptools' in-tree build: not part of the checkout
        return {"note": f"{len(wheels)} wheels and the project into {site}"}

    return run


def step_system(c: Check, py: str):
    def run(budget):
        code = (
            "import json, llama_cpp; from ondevice.probing.hardware import detect; "
            "print(json.dumps({'system_info': llama_cpp.llama_print_system_info().decode(), "
            "'host': detect().to_dict()}, default=str))"
        )
        d = json.loads(
            checked(c.sh([py, "-c", code], budget, cwd="/tmp"), "system info").stdout.strip().splitlines()[-1]
        )
        c.facts.update(system_info=d["system_info"], host=d["host"])
        return {"note": f"backends {d['host'].get('llama_backends')}"}

    return run


def step_model(c: Check, cpu: bool, models: Path):
    def run(budget):
        models.mkdir(parents=True, exist_ok=True)
        if cpu:  # a tiny synthetic model: the script's own path, not the speed, is under test here
            from ondevice.quant.synth import SynthConfig, build_synthetic_model

            path = build_synthetic_model(SynthConfig(d_model=128, n_layer=2, n_vocab=512), models / "tiny.gguf")
        else:
            meta = json.loads((DEVICE / "default-header.json").read_text())
            path = models / meta["name"].replace(".gguf", "-zero.gguf")
            shutil.copyfile(DEVICE / "default-header.gguf", path)
            with open(path, "r+b") as f:
                f.truncate(meta["file_bytes"])  # zero weights, sparse on disk
        c.facts["model"] = str(path)
        return {"note": str(path)}

    return run


def step_cli(c: Check, ondevice: list[str], name: str, args: list[str], parse=None):
    def run(budget):
        done = checked(c.sh([*ondevice, *args], budget, cwd="/tmp"), name)
        return parse(done) if parse else {"note": done.stdout.strip()[-200:]}

    return run


def parse_run(c: Check):
    def parse(done):
        from ondevice.llama.memlog import parse_buffer_log  # the site's install (with --cpu, this interpreter's)

        err = [x for x in done.stderr.splitlines() if x.strip()]
        c.facts.update(
            answer=done.stdout.strip()[:300],
            run_line=next((x for x in reversed(err) if "TTFT" in x), None),
            run_buffers=parse_buffer_log(done.stderr).to_dict(),
        )
        return {"note": c.facts["run_line"]}

    return parse


def parse_json_into(c: Check, key: str, pick=lambda d: d):
    def parse(done):
        c.facts[key] = pick(json.loads(done.stdout))
        return {"note": f"{key} recorded"}

    return parse


def parse_bench(c: Check, path: Path):
    def parse(done):
        rows = bench_rows(json.loads(path.read_text()))
        c.facts.setdefault("bench", []).extend(rows)
        return {"note": f"{len(rows)} rows"}

    return parse


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpu", action="store_true", help="run the steps on this machine's CPU with a tiny model")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "device-check-out")))
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds for the whole check")
    ap.add_argument("--steps", help="comma-separated subset of the steps")
    ap.add_argument("--work", type=Path, default=Path("/tmp/odv-work"), help="models, caches and bench files")
    ap.add_argument("--resume", action="store_true", help=argparse.SUPPRESS)  # the steps after install, with the site
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    work, site = args.work, Path("/tmp/odv-site")  # installed with --target: the image's python3 is itself a venv
    c = Check(args.out, args.deadline, {"PYTHONUNBUFFERED": "1", "ONDEVICE_CACHE_DIR": str(work / "cache")})
    wanted = set(args.steps.split(",")) if args.steps else None
    if args.resume:
        doc = json.loads((args.out / "device_check.json").read_text())
        c.steps, c.facts = doc["steps"], doc["facts"]
        c.t0 -= doc["elapsed_s"]  # one clock for the whole check: the steps before the exec count
        c.deadline_s += doc["elapsed_s"]
    else:
        py = sys.executable
        first = [("gpu", 30, step_gpu(c, args.cpu))]
        if not args.cpu:
            first += [("build", 420, step_build(c, py, site)), ("install", 90, step_install(c, py, site))]
        for name, budget, fn in first:
            if wanted is None or name in wanted:
                c.step(name, budget, fn)
        if not args.cpu:  # the rest runs with what was installed (ondevice and llama_cpp importable from the site)
            c.save()
            c.log.close()
            os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
            rest = ["--out", str(args.out), "--work", str(work), "--deadline", str(max(1.0, c.left())), "--resume"]
            os.execv(py, [py, __file__, *rest, *(["--steps", args.steps] if args.steps else [])])
    later(c, args, work, wanted)
    c.facts["probe_gbs"] = (c.facts.get("probe") or {}).get("ceiling_gbs")
    c.save()
    print((args.out / "summary.txt").read_text())
    return 0 if all(s["status"] == "ok" for s in c.steps) else 1


def later(c: Check, args, work: Path, wanted) -> None:
    """The steps that need ondevice and llama_cpp (this interpreter has both)."""
    py = sys.executable
    od = [py, "-m", "ondevice.cli.main"]
    models, tmp = work / "models", work / "tmp"
    tmp.mkdir(parents=True, exist_ok=True)
    model = lambda: c.facts.get("model", "")  # noqa: E731 - the model the model step made
    quick = ["--suite", "quick", "--repeat", "2"] if args.cpu else ["--suite", "quick"]
    mem_ctx = "512" if args.cpu else "4096,train"

    def cli(name, argv, parse=None, cmd=None):
        return lambda budget: step_cli(c, cmd or od, name, [str(a) for a in argv()], parse)(budget)

    bench = ["--json", tmp / "bench.json", "--force", *quick]
    batch = ["--batch", "1,4,16", "-p", "64", "-n", "32", "--json", tmp / "batch.json", "--force"]
    memory = [ROOT / "benchmarks" / "memory_accuracy.py", "--contexts", mem_ctx, "--kv", "f16"]
    mem = tmp / "memory.json"
    tests = ["-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", ROOT / "tests"]
    steps = [
        ("system", 60, step_system(c, py)),
        ("model", 30, step_model(c, args.cpu, models)),
        ("run", 90, cli("run", lambda: ["--log-level", "INFO", "run", model(), PROMPT, "-n", "32"], parse_run(c))),
        ("info", 30, cli("info", lambda: ["info", model(), "--json"], parse_json_into(c, "info"))),
        ("probe", 240, cli("probe", lambda: ["probe", "--json"], parse_json_into(c, "probe"))),
        (
            "predict",
            60,
            cli(
                "predict",
                lambda: ["predict", model(), "--json", "--prompt", "256", "--output", "128"],
                parse_json_into(c, "predict"),
            ),
        ),
        ("bench", 120, cli("bench", lambda: ["bench", model(), *bench], parse_bench(c, tmp / "bench.json"))),
        ("fit", 60, cli("fit", lambda: ["run", "--fit", model(), "Hello", "-n", "4"], lambda d: _fit_line(c, d))),
        (
            "batch",
            120,
            cli("batch", lambda: ["bench", model(), *batch], parse_json_file(c, "batch", tmp / "batch.json")),
        ),
        ("memory", 150, lambda b: _memory(c, [py, *map(str, memory), "--paths", model(), "--record", str(mem)], b)),
        (
            "config8b",
            60,
            cli(
                "config8b",
                lambda: ["predict", "--config", CONFIG_8B, "--quant", "Q4_K_M", "--json"],
                parse_json_into(c, "predict_config_8b"),
            ),
        ),
        ("twin8b", 180, lambda b: _twin8b(c, od, models, tmp, quick, b)),
        ("tests", 120, cli("tests", lambda: tests, lambda d: {"note": d.stdout.strip().splitlines()[-1]}, cmd=[py])),
    ]
    for name, budget, fn in steps:
        if wanted is None or name in wanted:
            c.step(name, budget, fn)


def _fit_line(c: Check, done) -> dict:
    c.facts["fit_line"] = next((x for x in done.stderr.splitlines() if "--fit" in x), None)
    return {"note": c.facts["fit_line"] or "no --fit line"}


def _memory(c: Check, argv: list[str], budget: float) -> dict:
    """The memory verdict against what the load took; a missed target (exit 1) is a finding, not a failure."""
    done = c.sh(argv, budget)
    if done.returncode not in (0, 1):
        checked(done, "memory")
    doc = json.loads(Path(argv[argv.index("--record") + 1]).read_text())
    c.facts["memory"] = doc.get("summary", []) + [doc.get("table", "")]
    return {"note": "; ".join(doc.get("summary", []))[:200]}


def parse_json_file(c: Check, key: str, path: Path):
    def parse(done):
        c.facts[key] = json.loads(path.read_text())
        return {"note": f"{key} recorded"}

    return parse


def _twin8b(c: Check, od, models: Path, tmp: Path, quick, budget) -> dict:
    twin = models / "llama-3.1-8b-Q4_K_M-twin.gguf"
    # --sparse: the data region a hole (zero weights): a GPU decodes them as fast, and nothing 4.9 GB is written
    checked(
        c.sh([*od, "twin", "--config", CONFIG_8B, "--quant", "Q4_K_M", "--sparse", twin], budget / 3, cwd="/tmp"),
        "twin",
    )
    pred = checked(c.sh([*od, "predict", twin, "--json", "--prompt", "256", "--output", "128"], budget / 3), "predict")
    c.facts["predict_8b"] = json.loads(pred.stdout)
    checked(c.sh([*od, "bench", twin, *quick, "--json", tmp / "bench8b.json", "--force"], budget / 3), "bench")
    rows = bench_rows(json.loads((tmp / "bench8b.json").read_text()))
    c.facts.setdefault("bench", []).extend(rows)
    return {"note": f"{len(rows)} rows"}


if __name__ == "__main__":
    sys.exit(main())
