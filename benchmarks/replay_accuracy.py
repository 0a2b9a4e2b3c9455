"""Replay stored probe_accuracy runs through the code in this tree: a change to the step-time model or
to the kernel fit, tried against every round of past runs in seconds instead of one 35-minute run.

A `probe_accuracy.py --json` report keeps what each round measured: the kernel probe's own runs (step
and prefill seconds, per round) and every decode row's tok/s. This refits each round's calibration from
those steps (probe_accuracy's own pairing) and predicts each row again; what comes out is each decode
row's paired error as this tree computes it, beside the one the report stored. With the code the report
was made with, the two agree (a check that the replay is faithful); the TTFT rows are not replayed.

The probe's models (the probe's cache) and the accuracy models are rebuilt when missing, as
probe_accuracy builds them; the default model comes from its package.

    python benchmarks/replay_accuracy.py RUN.json [RUN.json.gz ...]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing
sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_accuracy  # noqa: E402 - its pairing, its predictions, its target

def load_report(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def replay(report: dict, model_dir: Path, accuracy_dir: Path, tokens: int = 32) -> list[dict]:
    """Each decode row of `report`: {"row", "stored", "replayed", "round_errors"}, errors as fractions;
    `tokens`: the output tokens per round the run decoded (the report's own figure when it has one)."""
    from ondevice.modelspec import inspect
    from ondevice.probing import kernel
    from ondevice.probing.result import ProbeResult

    probe = ProbeResult.from_dict(report["probe"])
    plan = kernel.plan_for(probe.host.llc_bytes)
    runs = kernel.probe_models(plan, model_dir, probe_accuracy.say)
    stored = report["decode"]["probe_runs"]
    if [r.path.name for r in runs] != [s["model"] for s in stored]:
        raise SystemExit("replay: this tree's probe runs differ from the report's (another plan): nothing to pair")
    specs = [inspect(r.path) for r in runs]
    reps = len(stored[0]["step_s"])
    _fits, cals = probe_accuracy._round_calibrations(plan, runs, specs, [s["step_s"] for s in stored],
                                                     [s["prefill_s"] for s in stored], reps, probe.calibration(),
                                                     report["decode"]["ceiling_gbs"])
    rows = report["decode"]["rows"]
    tokens = report.get("tokens") or tokens
    models = dict(probe_accuracy.build_models(accuracy_dir, sorted({r["model"] for r in rows})))
    out = []
    for row in rows:
        spec = inspect(models[row["model"]])
        errors = [pred / tok_s - 1 for pred, tok_s in
                  zip(probe_accuracy.round_predictions(spec, cals, row["ctx"], tokens), row["all_tok_s"]) if pred]
        out.append({"row": f"{row['model']} at {row['ctx']}", "stored": row["error"], "round_errors": errors,
                    "replayed": statistics.median(errors) if errors else float("nan")})
    return out


def render(name: str, rows: list[dict]) -> str:
    within = {k: sum(abs(r[k]) <= probe_accuracy.DECODE_TOLERANCE for r in rows) for k in ("stored", "replayed")}
    same = all(abs(r["stored"] - r["replayed"]) < 1e-9 for r in rows)
    lines = [f"{name}: decode rows within +-10%: stored {within['stored']}/{len(rows)}, "
             f"replayed {within['replayed']}/{len(rows)}" + (" (as stored)" if same else "")]
    lines += [f"  {r['row']:45s} stored {100 * r['stored']:+6.1f}%  replayed {100 * r['replayed']:+6.1f}%" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="probe_accuracy --json reports (.json or .json.gz)")
    ap.add_argument("--tokens", type=int, default=32, help="output tokens per round, for reports that do not say "
                    "(probe_accuracy's --tokens; default 32)")
    args = ap.parse_args(argv)
    from ondevice import paths

    model_dir, accuracy_dir = paths.cache_dir() / "probe" / "models", paths.cache_dir() / "probe" / "accuracy"
    per_row: dict[str, list[float]] = {}
    met = 0
    for path in args.reports:
        rows = replay(load_report(path), model_dir, accuracy_dir, args.tokens)
        print(render(path.name, rows))
        within = sum(abs(r["replayed"]) <= probe_accuracy.DECODE_TOLERANCE for r in rows)
        met += within >= probe_accuracy.DECODE_SHARE * len(rows)
        for r in rows:
            per_row.setdefault(r["row"], []).append(r["replayed"])
    print(f"replayed: {met} of {len(args.reports)} runs meet the decode target (9 in 10 rows within +-10%)")
    if len(args.reports) > 1:
        for row, errors in per_row.items():
            print(f"  {row:45s} mean {100 * statistics.mean(errors):+5.1f}%  sd {100 * statistics.stdev(errors):4.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
