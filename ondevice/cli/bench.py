"""`ondevice bench [MODEL...]` and `ondevice bench compare A.json B.json` (or one file of two models).

Exit status: 0 when every run was ok (and every --slo passed); 1 when a run failed or timed
out or an SLO failed (the results are still written); 2 for bad input, or an output file that
could not be written after the run (the results are then kept in the cache dir, and the
one-line error names the file); 130 after Ctrl-C (the runs gathered so far are written,
marked incomplete). `bench compare` exits 0 when it could compare, also when it says the two
runs are not comparable (different model file, llama-cpp-python, settings or machine: one
line above the table names what differs, and the JSON has "comparable" and "differences").

Output files (--json, --csv, --md) follow one rule with `ondevice quantize`: checked before
anything runs (paths.check_destination), an existing file is replaced only with --force, and
a directory, device, FIFO or socket never.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

from ondevice.cli.engine_args import add_engine_args, engine_kwargs
from ondevice.cli.output import terminal_width
from ondevice.cli.progress import step_progress
from ondevice.cli.sampling_args import add_sampling_args, sampling_settings
from ondevice.core.errors import BenchError

EXIT_OK, EXIT_FAILURES, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
MAX_TIMEOUT_S = 1e6  # seconds per request: about 11 days, far inside every timer's range


def register(sub) -> None:
    p = sub.add_parser(
        "bench",
        help="measure TTFT/ITL/TPOT percentiles, load and cache states, against the roofline",
        description="Benchmark one or more models (default: the built-in model, the standard suite). "
        "`ondevice bench compare A.json B.json` compares two result files. "
        "Output files are checked before the bench runs: an existing file is refused unless --force "
        "(as `ondevice quantize` does), a directory, device or other special file always.",
    )
    p.add_argument("models", nargs="*", metavar="MODEL", help="registry names or .gguf paths (interleaved by repeat)")
    p.add_argument("--suite", help="quick or standard (default: standard; -p/-n make a custom suite)")
    p.add_argument("-p", "--prompt-tokens", help="prompt lengths in tokens, comma-separated (custom suite)")
    p.add_argument("-n", "--output-tokens", help="output lengths in tokens, comma-separated (custom suite)")
    p.add_argument("-r", "--repeat", type=int, help="measured runs per workload and scenario")
    p.add_argument("--warmup", type=int, help="untimed requests after each load (default 1)")
    p.add_argument(
        "--scenarios",
        help="comma-separated subset of cold_load,warm_load,resident,prefix_hit,no_kv_cache,"
        "speculative,restore,cold_start (speculative: prompt lookup paired with plain decoding of the same prompt; "
        "restore: a conversation resumed from its KV state on disk against recomputing it and the in-memory "
        "prefix hit, each beside its prediction; "
        "cold_start: page cache dropped -> load -> first token, with its parts and a prediction; each has "
        "its own table; default: cold_load,warm_load,resident,prefix_hit,cold_start)",
    )
    from ondevice.cli.run import add_spec_exact_arg

    add_spec_exact_arg(p)
    p.add_argument(
        "--no-kv-cache",
        action="store_true",
        help="add the ablation: recompute the whole context for every token (short run)",
    )
    p.add_argument("--n-ctx", type=int, help="context size (default: the smallest that fits the suite)")
    p.add_argument("-t", "--threads", type=int, help="CPU threads (default: the engine's choice)")
    p.add_argument("--n-gpu-layers", default="auto", help="layers to offload: a number or auto (default)")
    add_engine_args(p)
    add_sampling_args(p, short_temperature=False)  # -t is --threads here, as in llama-bench
    p.add_argument("--seed", type=int, default=0, help="seed of the prompt texts and the sampler (default 0)")
    p.add_argument("--timeout", type=float, help="seconds per request before it is cancelled and kept as a time-out")
    p.add_argument(
        "--batch",
        metavar="B,B,...",
        help="sweep batch sizes: B sequences decoded per llama_decode, e.g. "
        "1,2,4,8 (one workload: -p/-n, or the short one; aggregate and per-sequence tok/s against the roofline)",
    )
    p.add_argument("--slo", help="bounds such as ttft_p95=1.0,tpot_p95=0.04: goodput and pass/fail per scenario")
    p.add_argument("--json", metavar="FILE", help="write the full results (record, summaries, per-run ITL traces)")
    p.add_argument("--csv", metavar="FILE", help="write one CSV row per scenario")
    p.add_argument("--md", metavar="FILE", help="write a Markdown report")
    p.add_argument(
        "--plot",
        metavar="FILE.svg",
        help="draw the roofline (measured and predicted decode tok/s against bytes per token, the ceiling line) "
        "and the ITL distribution per scenario; with --batch, the sweep: decode tok/s against B, measured and "
        "predicted (.svg, .png or .pdf; needs the extra ondevice[plot])",
    )
    p.add_argument(
        "--force", action="store_true", help="replace existing --json/--csv/--md/--plot files (refused without it)"
    )
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument(
        "--threshold", type=float, default=0.05, help="compare: smallest change called a change (default 0.05 = 5%%)"
    )
    from ondevice.cli.bench_serve import add_serve_args

    add_serve_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.models[:1] == ["compare"]:
        return run_compare(args)
    if args.plot is not None:  # the extra installed and the format known, before any model loads
        if getattr(args, "url", None):
            raise BenchError("--plot draws a local bench: not with --url")
        from ondevice.bench.plot import check_plot_path

        check_plot_path(args.plot)
    if args.batch is not None:
        from ondevice.cli.bench_batch import run_batch

        return run_batch(args, _config, _check_outputs, write_files)
    from ondevice.cli import bench_serve

    if bench_serve.check_serve_args(args):
        _check_outputs(args, ("--json", "--csv", "--md"))
        return _exit_code(*bench_serve.run_serve(args, _config, _write_outputs))
    _check_outputs(args, ("--json", "--csv", "--md", "--plot"))
    from ondevice.bench.runner import plan_bench, run_bench

    config = _config(args)
    slo_bounds = None
    if args.slo:
        from ondevice.bench.slo import parse_slo

        slo_bounds = parse_slo(args.slo)
    plans = plan_bench(config)
    from ondevice.bench.record import model_digests

    digests = model_digests(plans)
    with step_progress("bench", enabled=not args.no_progress) as progress:
        outcome = run_bench(config, plans, progress=progress)
    return _report(args, outcome, digests, slo_bounds)


def _check_outputs(args, flags) -> None:
    """Every output file, checked before any work: a writable folder, a regular file or none
    (an existing one only with --force), and no file named twice."""
    from ondevice.core.paths import check_destination

    seen: dict[str, str] = {}
    for flag in flags:
        value = getattr(args, flag.lstrip("-"))
        if value is None:
            continue
        key = os.path.realpath(value)
        if key in seen:
            raise BenchError(f"{seen[key]} and {flag} name the same file: {value}")
        seen[key] = flag
        check_destination(value, force=args.force)


def _report(args, outcome, digests, slo_bounds) -> int:
    from ondevice.bench import report
    from ondevice.bench.record import build_record
    from ondevice.bench.slo import evaluate
    from ondevice.bench.stats import scenario_results

    results = scenario_results(outcome)
    record = build_record(outcome, argv=getattr(args, "argv", None), digests=digests)
    slo = {}
    if slo_bounds:
        for r in results:
            s = evaluate(list(r.runs), slo_bounds)
            if s is not None:
                slo[(r.model, r.scenario, r.workload)] = s
    doc = report.result_document(record, results, slo)
    for plan in outcome.models:
        if plan.engine_info.get("fit_reason"):
            print(f"ondevice: --fit: {plan.label}: {plan.engine_info['fit_reason']}", file=sys.stderr)
    sys.stdout.write(report.render_table(record, results, slo, width=terminal_width()))
    _write_outputs(args, doc, record, results, slo, plot=(results, outcome.models))
    return _exit_code(outcome, slo)


def _exit_code(outcome, slo) -> int:
    if outcome.incomplete:
        print("ondevice: bench interrupted: the results above are incomplete", file=sys.stderr)
        return EXIT_INTERRUPTED
    bad = any(r.status in ("failed", "timeout") for r in outcome.runs)
    return EXIT_FAILURES if bad or any(not s.passed for s in slo.values()) else EXIT_OK


def _write_outputs(args, doc, record, results, slo, load=None, plot=None) -> None:
    """Write --json/--csv/--md and, for a local bench (plot: its results and model plans), --plot (see write_files)."""
    from ondevice.bench import report

    write_files(
        doc,
        (
            ("--json", args.json, lambda p: report.write_json(p, doc)),
            ("--csv", args.csv, lambda p: report.write_csv(p, doc)),
            ("--md", args.md, lambda p: report.write_markdown(p, record, results, slo, load)),
            ("--plot", getattr(args, "plot", None) if plot else None, lambda p: _write_plot(p, *plot)),
        ),
    )


def _write_plot(path, results, plans) -> None:
    from ondevice.bench.plot import itl_series, roofline_from_bench, write_plot

    write_plot(path, roofline_from_bench(results, plans), itl_series(results))


def write_files(doc, writers) -> None:
    """Run each (flag, path or None, write(path)). When one fails (a full disk, a folder gone
    read-only), the results are kept in the cache dir and BenchError names that file: a run is never lost."""
    from ondevice.bench import report

    failed = []
    for flag, path, write in writers:
        if path is None:
            continue
        try:
            write(path)
        except OSError as exc:
            failed.append(f"{flag} {path} ({exc.strerror or exc})")
    if not failed:
        return
    more = f" and {len(failed) - 1} more" if len(failed) > 1 else ""
    try:
        kept = report.keep_unsaved(doc)
    except OSError as exc:
        raise BenchError(
            f"could not write {failed[0]}{more}, nor keep the results in the cache dir "
            f"({exc.strerror or exc}); the table above is all that is left"
        ) from None
    raise BenchError(f"could not write {failed[0]}{more}; the results are kept in {kept}")


def _config(args: argparse.Namespace):
    from ondevice.bench import suites
    from ondevice.bench.runner import BenchConfig
    from ondevice.bench.runs import DEFAULT_SCENARIOS, NO_KV_CACHE, SPECULATIVE

    custom = args.prompt_tokens is not None or args.output_tokens is not None
    if custom and args.suite:
        raise BenchError("use either --suite or -p/-n (a custom suite), not both")
    if custom:
        p = suites.parse_number_list(args.prompt_tokens, "-p") if args.prompt_tokens is not None else (256,)
        n = suites.parse_number_list(args.output_tokens, "-n") if args.output_tokens is not None else (128,)
        suite = suites.custom_suite(p, n)
    else:
        suite = suites.get_suite(args.suite or "standard")
    suite = suites.with_counts(suite, repeats=args.repeat, warmup=args.warmup)
    scenarios = (
        tuple(s.strip().replace("-", "_") for s in args.scenarios.split(",") if s.strip())
        if args.scenarios
        else DEFAULT_SCENARIOS
    )
    if args.no_kv_cache and NO_KV_CACHE not in scenarios:
        scenarios += (NO_KV_CACHE,)
    if not scenarios:
        raise BenchError("--scenarios: name at least one scenario")
    for name, value in (("--threads", args.threads), ("--n-ctx", args.n_ctx)):
        if value is not None and value < 1:
            raise BenchError(f"{name} {value}: must be at least 1")
    if args.n_ctx is not None:
        from ondevice.engine.loader import resolve_n_ctx

        resolve_n_ctx(
            args.n_ctx
        )  # llama.cpp's smallest context, as in run and chat (the runner checks the trained one)
    # finite numbers only: an infinite time-out overflows the watchdog's and the socket's timers
    if args.timeout is not None and not (math.isfinite(args.timeout) and 0 < args.timeout <= MAX_TIMEOUT_S):
        raise BenchError(f"--timeout {args.timeout}: must be a number of seconds in (0, {MAX_TIMEOUT_S:g}]")
    sampling = sampling_settings(args)  # a NaN temperature would fail every run
    from ondevice.cli.run import parse_spec_exact

    spec_exact = parse_spec_exact(args.spec_exact)
    if spec_exact is not None and SPECULATIVE not in scenarios:
        raise BenchError("--spec-exact needs the speculative scenario (--scenarios ...,speculative)")
    gpu = args.n_gpu_layers
    if gpu != "auto":
        try:
            gpu = int(gpu)
        except ValueError:
            raise BenchError(f"--n-gpu-layers {gpu!r}: a number or auto") from None
    models = tuple(args.models) or (None,)
    return BenchConfig(
        models=models,
        suite=suite,
        scenarios=scenarios,
        cap_to_context=not custom,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_gpu_layers=gpu,
        **engine_kwargs(args),
        sampling=sampling,
        seed=args.seed,
        timeout_s=args.timeout,
        spec_exact=spec_exact,
    )


def run_compare(args: argparse.Namespace) -> int:
    from ondevice.bench.compare import comparability, compare_docs, load_results, render_comparison, split_models

    _check_outputs(args, ("--json",))
    files = args.models[1:]
    if len(files) == 1:
        a, b, name_a, name_b = split_models(load_results(files[0]), files[0])
        names = [f"{files[0]}:{name_a}", f"{files[0]}:{name_b}"]
    elif len(files) == 2:
        a, b = (load_results(f) for f in files)
        names = files
    else:
        raise BenchError(
            f"bench compare needs two result files (A.json B.json), or one holding two models; got {len(files)}"
        )
    rows = compare_docs(a, b, threshold=args.threshold)
    differs = comparability(a, b, rows, same_file=len(files) == 1)
    if args.json:
        import json

        from ondevice.bench.stats import clean
        from ondevice.core.paths import atomic_write

        with atomic_write(args.json, "w") as f:
            json.dump(
                clean(
                    {
                        "a": names[0],
                        "b": names[1],
                        "threshold": args.threshold,
                        "comparable": not differs,
                        "differences": differs,
                        "scenarios": [r.to_dict() for r in rows],
                    }
                ),
                f,
                indent=1,
            )
    print(render_comparison(rows, names[0], names[1], width=terminal_width(), differs=differs))
    return EXIT_OK
