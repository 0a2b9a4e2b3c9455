"""`ondevice bench --url http://HOST:PORT/v1`: the same metrics against an OpenAI-compatible server.

Exit status as for local benches (ondevice.cli.bench decides it from what run_serve returns):
0 all ok, 1 a request failed or timed out or an SLO failed, 2 bad input (one line), 130 after
Ctrl-C (what was gathered is written, marked incomplete). The local bench's helpers (its
config, output writers) are handed in, so this module does not import it back.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import sys
from collections.abc import Callable
from typing import Any

from ondevice.bench.suites import parse_number_list
from ondevice.core.errors import BenchError

__all__ = ["add_serve_args", "check_serve_args", "run_serve"]

DEFAULT_TIMEOUT_S = 300.0
_SERVE_ONLY = ("model", "api_key_env", "tokenizer", "concurrency", "rate", "requests", "duration", "local")
_LOCAL_ONLY = (("scenarios", "--scenarios"), ("no_kv_cache", "--no-kv-cache"))


def add_serve_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("server benchmark (--url)")
    g.add_argument("--url", help="an OpenAI-compatible server's base URL, e.g. http://127.0.0.1:8000/v1: measure it")
    g.add_argument(
        "--model", help="the served model's name sent in requests (default: the first one GET /models lists)"
    )
    g.add_argument(
        "--chat", action="store_true", help="use /chat/completions with a user message (default: /completions)"
    )
    g.add_argument(
        "--api-key-env", metavar="VAR", help="the environment variable holding the API key (never written anywhere)"
    )
    g.add_argument(
        "--tokenizer",
        metavar="MODEL",
        help="a GGUF or registry name whose tokenizer builds exact prompts and counts "
        "tokens the server does not report (else tokens are estimated)",
    )
    g.add_argument("--concurrency", help="closed-loop levels, comma-separated clients in flight (default 1)")
    g.add_argument("--rate", help="open-loop levels, comma-separated Poisson arrival rates in requests/s")
    g.add_argument("--requests", type=int, help="requests per level (default 8)")
    g.add_argument("--duration", type=float, help="seconds per level after which no request is sent (default 120)")
    g.add_argument(
        "--local",
        metavar="MODEL",
        help="also run MODEL in-process, interleaved with the concurrency-1 level, "
        "in the same results (bench compare FILE: the server's overhead)",
    )


def check_serve_args(args: argparse.Namespace) -> bool:
    """True when this is a server bench; BenchError for flags of the other kind."""
    if not getattr(args, "url", None):
        given = [f"--{k.replace('_', '-')}" for k in _SERVE_ONLY if getattr(args, k, None) is not None]
        given += ["--chat"] if getattr(args, "chat", False) else []
        if given:
            raise BenchError(f"{given[0]} applies to server benchmarks: add --url http://HOST:PORT/v1")
        return False
    if args.models:
        raise BenchError(
            "with --url, name the served model with --model (and --local MODEL to run it in-process too), "
            f"not as MODEL ({args.models[0]!r})"
        )
    for key, flag in _LOCAL_ONLY:
        if getattr(args, key, None):
            raise BenchError(f"{flag} applies to local benchmarks, not --url")
    return True


def _positive_list(text: str, flag: str, kind: type) -> tuple:
    """Load levels: positive numbers, none named twice."""
    values = parse_number_list(text, flag, kind)
    if len(set(values)) != len(values):
        raise BenchError(f"{flag} {text!r}: a level is named twice")
    return values


def _serve_config(args: argparse.Namespace, make_config: Callable[[argparse.Namespace], Any]):
    from dataclasses import replace

    from ondevice.bench.serve.client import Target
    from ondevice.bench.serve.runner import ServeConfig

    conc = _positive_list(args.concurrency, "--concurrency", int) if args.concurrency is not None else ()
    rates = _positive_list(args.rate, "--rate", float) if args.rate is not None else ()
    conc = conc or (() if rates else (1,))
    if args.local and 1 not in conc:
        raise BenchError("--local runs interleaved with the concurrency-1 level: include 1 in --concurrency")
    for flag, value in (("--requests", args.requests), ("--duration", args.duration)):
        if value is not None and not (math.isfinite(value) and value > 0):
            raise BenchError(f"{flag} {value:g}: must be greater than 0")
    key = None
    if args.api_key_env:
        key = os.environ.get(args.api_key_env)
        if not key:
            raise BenchError(f"--api-key-env {args.api_key_env}: that environment variable is not set")
    if args.suite is None and args.prompt_tokens is None and args.output_tokens is None:
        args.suite = "quick"  # a server level runs many requests: CI-sized by default
    models, args.models = args.models, [args.local] if args.local else []
    try:
        bench = make_config(args)
    finally:
        args.models = models
    timeout = args.timeout or DEFAULT_TIMEOUT_S
    bench = replace(bench, timeout_s=timeout)
    target = Target(args.url, model=args.model, chat=args.chat, api_key=key, timeout_s=timeout)
    return ServeConfig(
        target,
        bench,
        conc,
        rates,
        requests=args.requests or 8,
        duration_s=args.duration or 120.0,
        tokenizer=args.tokenizer,
        local=bool(args.local),
        api_key_env=args.api_key_env,
    )


def run_serve(args: argparse.Namespace, make_config: Callable, write_outputs: Callable) -> tuple[Any, dict]:
    """Run and report; returns (the BenchOutcome, the SLO results) for the exit status."""
    from ondevice.bench import report
    from ondevice.bench.serve.report import level_table, serve_record
    from ondevice.bench.serve.runner import run_serve as run
    from ondevice.bench.slo import evaluate, parse_slo
    from ondevice.bench.stats import scenario_results

    cfg = _serve_config(args, make_config)
    bounds = parse_slo(args.slo) if args.slo else None
    from ondevice.cli.progress import step_progress

    with step_progress("bench", enabled=not args.no_progress) as progress:  # a bar per load level on a terminal
        serve = run(cfg, progress=progress)
    outcome = serve.outcome
    results = scenario_results(outcome)
    slo = {}
    if bounds is not None:
        for r in results:
            s = evaluate(list(r.runs), bounds)
            if s is not None:
                slo[(r.model, r.scenario, r.workload)] = s
    load = level_table(serve, results, slo)
    from ondevice.bench.record import model_digests

    record = serve_record(
        serve, argv=getattr(args, "argv", None), digests=model_digests([p for p in outcome.models if p.path])
    )
    doc = report.result_document(record, results, slo, load)
    width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
    sys.stdout.write(report.render_table(record, results, slo, width=width, load=load))
    write_outputs(args, doc, record, results, slo, load)
    return outcome, slo
