"""`ondevice bench --batch 1,2,4,8 [MODEL]`: B sequences per llama_decode, swept over B (ondevice.bench.batch).

One workload: -p P -n N (one value each), else the quick suite's (--suite quick) or the standard
suite's short one (256 + 128 tokens, the default). Bad input (a batch size below 1 or above 256,
one named twice, sequences that do not fit --n-ctx or the model's trained context, flags of
other bench modes) is one line and exit 2 before the model loads. Exit status otherwise as for
every bench: 0 all ok, 1 a run failed or no batch size met --slo, 130 after Ctrl-C.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any

from ondevice.cli.engine_args import say_fit
from ondevice.core.errors import BenchError

__all__ = ["run_batch", "batch_workload"]

_OTHER_MODES = (("url", "--url"), ("scenarios", "--scenarios"), ("no_kv_cache", "--no-kv-cache"))


def batch_workload(args: argparse.Namespace):
    """The one workload of the sweep, from -p/-n or --suite."""
    from ondevice.bench import suites

    if args.prompt_tokens is not None or args.output_tokens is not None:
        if args.suite:
            raise BenchError("use either --suite or -p/-n (a custom suite), not both")
        p = suites.parse_number_list(args.prompt_tokens, "-p") if args.prompt_tokens is not None else (256,)
        n = suites.parse_number_list(args.output_tokens, "-n") if args.output_tokens is not None else (128,)
        if len(p) != 1 or len(n) != 1:
            raise BenchError("--batch sweeps one workload: give one -p and one -n value")
        return suites.custom_suite(p, n).workloads[0], False
    suite = suites.get_suite(args.suite or "standard")
    return suite.workloads[0], True


def _check_args(args: argparse.Namespace) -> tuple[int, ...]:
    from ondevice.bench.suites import parse_number_list

    for key, flag in _OTHER_MODES:
        if getattr(args, key, None):
            raise BenchError(f"{flag} does not go with --batch (a sweep of batch sizes on one local model)")
    from ondevice.cli.bench_serve import check_serve_args

    check_serve_args(args)  # flags of server benches without --url: one line
    if len(args.models) > 1:
        raise BenchError(f"--batch sweeps one model; got {len(args.models)}")
    return parse_number_list(args.batch, "--batch")


def run_batch(args: argparse.Namespace, make_config: Callable, check_outputs: Callable, write_files: Callable) -> int:
    """Plan, check, load, sweep, report; returns the exit status."""
    from ondevice.bench.batch import SweepConfig, check_levels
    from ondevice.bench.runner import load_plan, plan_bench
    from ondevice.bench.suites import Suite, with_counts

    levels = _check_args(args)
    workload, built_in = batch_workload(args)
    check_outputs(args, ("--json", "--csv", "--md", "--plot"))
    suite = with_counts(Suite("batch", (workload,), repeats=3, warmup=1), repeats=args.repeat, warmup=args.warmup)
    # --n-ctx is the context the whole batch may use (checked below), not the engine's own
    config = replace(make_config(args), suite=suite, scenarios=(), cap_to_context=built_in, n_ctx=None)
    plan = plan_bench(config)[0]  # resolves and reads the header: no llama.cpp yet
    if plan.error or plan.spec is None:  # a plan without a header has an error
        raise BenchError(f"{plan.label}: {plan.error}")
    workload = plan.suite.workloads[0]  # a built-in one may have been capped to the context
    levels = check_levels(levels, workload, n_ctx=args.n_ctx, n_ctx_train=plan.spec.n_ctx_train)
    bounds = None
    if args.slo:
        from ondevice.bench.slo import parse_slo

        bounds = parse_slo(args.slo)
    sweep = SweepConfig(levels, workload, suite.repeats, suite.warmup, dict(config.sampling), config.seed)
    from ondevice.bench.record import model_digests

    digests = model_digests([plan])
    started = time.time()
    engine = load_plan(config, plan)
    say_fit(engine.info)
    try:
        outcome = _run(engine, sweep, args)
    finally:
        plan.engine = None
        engine.close()
    outcome.started_at = started
    return _report(args, config, plan, digests, sweep, outcome, bounds, write_files)


def _run(engine: Any, sweep: Any, args: argparse.Namespace):
    from ondevice.bench.batch import run_sweep
    from ondevice.cli.progress import step_progress

    with step_progress("bench --batch", enabled=not args.no_progress) as progress:  # a bar per batch level
        return run_sweep(engine, sweep, progress=progress)


def _report(args, config, plan, digests, sweep, outcome, bounds, write_files) -> int:
    from ondevice.bench import batch_report as br
    from ondevice.bench.batch import summarize_sweep
    from ondevice.bench.record import build_record
    from ondevice.bench.runner import BenchOutcome
    from ondevice.cli.output import terminal_width

    bench = BenchOutcome(config, [plan], [], outcome.started_at, outcome.ended_at, outcome.incomplete)
    record = build_record(bench, argv=getattr(args, "argv", None), digests=digests)
    record["settings"]["batch"] = {"levels": list(sweep.levels), "n_ctx": args.n_ctx}
    result = summarize_sweep(sweep, outcome.runs, bounds)
    doc = br.sweep_document(record, sweep.workload, result, outcome.runs)
    sys.stdout.write(br.render_sweep(record, sweep.workload, result, width=terminal_width()))
    label = f"{plan.label}, {sweep.workload.prompt_tokens} + {sweep.workload.output_tokens} tokens"
    draw = partial(_write_plot, result=result, label=label)
    _write(args, doc, lambda: br.sweep_markdown(record, sweep.workload, result), write_files, draw)
    if outcome.incomplete:
        print("ondevice: bench interrupted: the results above are incomplete", file=sys.stderr)
        return 130
    failed = any(not r.ok for r in outcome.runs)
    return 1 if failed or (bounds and result.slo_max_seqs is None) else 0


def _write(args, doc: dict, markdown: Callable[[], str], write_files: Callable, draw: Callable[[str], None]) -> None:
    from ondevice.bench import batch_report as br
    from ondevice.bench import report
    from ondevice.core.paths import atomic_write

    def write_md(path: str) -> None:
        with atomic_write(Path(path), "w") as f:
            f.write(markdown())

    write_files(
        doc,
        (
            ("--json", args.json, lambda p: report.write_json(p, doc)),
            ("--csv", args.csv, lambda p: br.write_sweep_csv(p, doc)),
            ("--md", args.md, write_md),
            ("--plot", args.plot, draw),
        ),
    )


def _write_plot(path: str, result: Any, label: str) -> None:
    from ondevice.bench.plot import batch_curve_from_sweep, write_plot

    write_plot(path, None, None, batch_curve_from_sweep(result, label))
