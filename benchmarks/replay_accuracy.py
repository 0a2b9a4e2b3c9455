"""Replay stored probe_accuracy runs through the code in this tree: a change to the step-time model or
to the kernel fit, tried against every round of past runs in seconds instead of one 35-minute run.

A `probe_accuracy.py --json` report keeps what each round measured: the kernel probe's own runs (step
and prefill seconds, per round), every decode row's tok/s and every TTFT row's seconds. This refits each
round's calibration from those runs (probe_accuracy's own pairing) and predicts each row again; what
comes out is each row's paired error as this tree computes it, beside the one the report stored. With
the code the report was made with, the two agree (a check that the replay is faithful). The step ratios
are the report's standalone probe's (older reports timed fewer of them).

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

sys.path.insert(0, str(Path(__file__).resolve().parent))

import probe_accuracy  # noqa: E402 - its pairing, its predictions, its target


def load_report(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def replay(report: dict, model_dir: Path, accuracy_dir: Path, tokens: int = 32) -> list[dict]:
    """Each decode row, then each TTFT row of `report`: {"row", "stored", "replayed", "round_errors",
    "tolerance"}, errors as fractions; `tokens`: the output tokens per round the run decoded (the report's
    own figure when it has one)."""
    from dataclasses import replace

    from ondevice.gguf.spec import inspect
    from ondevice.probing import kernel
    from ondevice.probing.result import ProbeResult

    probe = ProbeResult.from_dict(report["probe"])
    plan = kernel.plan_for(probe.host.llc_bytes)
    runs = kernel.probe_models(plan, model_dir, probe_accuracy.say)
    stored = report["decode"]["probe_runs"]
    if [r.path.name for r in runs] != [s["model"] for s in stored]:
        raise SystemExit("replay: this tree's probe runs differ from the report's (another plan): nothing to pair")
    runs = [
        replace(r, n_prompt=s["n_prompt"]) for r, s in zip(runs, stored)
    ]  # the prompts it ran (older: 256-token prefills)
    specs = [inspect(r.path) for r in runs]
    reps = len(stored[0]["step_s"])
    standalone = probe.calibration()
    if "repacked_types" not in (report["probe"].get("kernel") or {}):  # older reports: what this code finds here
        standalone = replace(
            standalone, repacked_types=kernel.repacked_types(runs, probe.backend, probe.kernel.cpu_buffers)
        )
    _fits, cals = probe_accuracy._round_calibrations(
        plan,
        runs,
        specs,
        [s["step_s"] for s in stored],
        [s["prefill_s"] for s in stored],
        reps,
        standalone,
        report["decode"]["ceiling_gbs"],
    )
    rows, ttft_rows = report["decode"]["rows"], report["decode"].get("ttft_rows", [])
    tokens = report.get("tokens") or tokens
    models = dict(probe_accuracy.build_models(accuracy_dir, sorted({r["model"] for r in rows + ttft_rows})))
    out = []
    for row in rows:
        spec = inspect(models[row["model"]])
        errors = [
            pred / tok_s - 1
            for pred, tok_s in zip(probe_accuracy.round_predictions(spec, cals, row["ctx"], tokens), row["all_tok_s"])
            if pred
        ]
        out.append(
            {
                "row": f"{row['model']} at {row['ctx']}",
                "stored": row["error"],
                "round_errors": errors,
                "replayed": statistics.median(errors) if errors else float("nan"),
                "tolerance": probe_accuracy.DECODE_TOLERANCE,
            }
        )
    for row in ttft_rows:
        chunk = row.get("chunk") or probe_accuracy.ttft_chunk(row["prompt"])  # older reports: as the engine set it
        errors = probe_accuracy.ttft_errors(
            inspect(models[row["model"]]), cals, row["prompt"], chunk, row["all_ttft_s"]
        )
        out.append(
            {
                "row": f"TTFT {row['model']} at {row['prompt']}",
                "stored": row["error"],
                "round_errors": errors,
                "replayed": statistics.median(errors) if errors else float("nan"),
                "tolerance": probe_accuracy.TTFT_TOLERANCE,
            }
        )
    return out


def render(name: str, rows: list[dict]) -> str:
    decode, ttft = _split(rows)
    within = {k: sum(abs(r[k]) <= r["tolerance"] for r in decode) for k in ("stored", "replayed")}
    ttft_within = {k: sum(abs(r[k]) <= r["tolerance"] for r in ttft) for k in ("stored", "replayed")}
    same = all(abs(r["stored"] - r["replayed"]) < 1e-9 for r in rows)
    lines = [
        f"{name}: decode rows within +-10%: stored {within['stored']}/{len(decode)}, "
        f"replayed {within['replayed']}/{len(decode)}; TTFT rows within +-15%: stored {ttft_within['stored']}/"
        f"{len(ttft)}, replayed {ttft_within['replayed']}/{len(ttft)}" + (" (as stored)" if same else "")
    ]
    lines += [
        f"  {r['row']:50s} stored {100 * r['stored']:+6.1f}%  replayed {100 * r['replayed']:+6.1f}%" for r in rows
    ]
    return "\n".join(lines)


def _split(rows: list[dict]) -> tuple[list[dict], list[dict]]:
    """(decode rows, TTFT rows) of one replayed report."""
    return (
        [r for r in rows if r["tolerance"] == probe_accuracy.DECODE_TOLERANCE],
        [r for r in rows if r["tolerance"] == probe_accuracy.TTFT_TOLERANCE],
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("reports", nargs="+", type=Path, help="probe_accuracy --json reports (.json or .json.gz)")
    ap.add_argument(
        "--tokens",
        type=int,
        default=32,
        help="output tokens per round, for reports that do not say (probe_accuracy's --tokens; default 32)",
    )
    args = ap.parse_args(argv)
    from ondevice.core import paths

    model_dir, accuracy_dir = paths.cache_dir() / "probe" / "models", paths.cache_dir() / "probe" / "accuracy"
    per_row: dict[str, list[float]] = {}
    met = ttft_met = 0
    for path in args.reports:
        rows = replay(load_report(path), model_dir, accuracy_dir, args.tokens)
        print(render(path.name, rows))
        decode, ttft = _split(rows)
        met += sum(abs(r["replayed"]) <= r["tolerance"] for r in decode) >= probe_accuracy.DECODE_SHARE * len(decode)
        ttft_met += all(abs(r["replayed"]) <= r["tolerance"] for r in ttft)
        for r in rows:
            per_row.setdefault(r["row"], []).append(r["replayed"])
    print(
        f"replayed: {met} of {len(args.reports)} runs meet the decode target (9 in 10 rows within +-10%), "
        f"{ttft_met} the TTFT target (every row within +-15%)"
    )
    if len(args.reports) > 1:
        for row, errors in per_row.items():
            print(f"  {row:45s} mean {100 * statistics.mean(errors):+5.1f}%  sd {100 * statistics.stdev(errors):4.1f}%")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
