"""`ondevice quantize`, `ondevice quality`, `ondevice ladder`: make quant levels, measure them."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ondevice.cli.output import ProgressLine, dump_json, terminal_width
from ondevice.cli.progress import ProgressBar
from ondevice.core.fmt import fold, human_bytes, millis, number, table

__all__ = ["register", "render_ladder", "ladder_markdown"]


def register(sub) -> None:
    p = sub.add_parser("quantize", help="quantize a GGUF model with llama.cpp's quantizer")
    p.add_argument("src", help="source model: registry name or .gguf path")
    p.add_argument("dst", help="output .gguf path")
    p.add_argument(
        "--type", "-t", required=True, dest="qtype", help="target type, e.g. Q4_K_M, Q4_0, Q5_K_M, Q6_K, Q8_0, F16"
    )
    p.add_argument("--threads", type=int, default=None, help="quantizer threads (default: all)")
    p.add_argument(
        "--allow-requantize",
        action="store_true",
        help="accept an already-quantized source (quality lost cannot come back)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="overwrite an existing destination (refused without it; a directory or special file always)",
    )
    p.add_argument(
        "--pure", action="store_true", help="every matrix in the type itself (no llama.cpp mix; e.g. Q4_0 output head)"
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    p.set_defaults(func=run_quantize)

    q = sub.add_parser("quality", help="perplexity of a model; KL divergence and top-1 agreement against a base")
    q.add_argument("base", help="model (the reference when OTHER is given)")
    q.add_argument("other", nargs="?", help="model to compare with BASE (same tokenizer)")
    _quality_args(q)
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    q.set_defaults(func=run_quality)

    lad = sub.add_parser("ladder", help="size, predicted and measured speed, and quality per quant type")
    lad.add_argument("src", help="source model: registry name or .gguf path")
    lad.add_argument("--types", required=True, help="comma-separated types, e.g. Q4_0,Q4_K_M,Q8_0")
    lad.add_argument("--allow-requantize", action="store_true", help="accept an already-quantized source")
    lad.add_argument("--threads", type=int, default=None, help="threads for quantizing, the bench and quality")
    lad.add_argument("--prompt-tokens", type=int, default=64, help="bench prompt length (default 64)")
    lad.add_argument("--gen-tokens", type=int, default=32, help="bench output tokens, EOS ignored (default 32)")
    lad.add_argument("--runs", type=int, default=3, help="measured bench runs per type, after a warm-up (default 3)")
    lad.add_argument("--no-bench", action="store_true", help="skip the speed measurement")
    lad.add_argument(
        "--bandwidth",
        type=float,
        default=None,
        metavar="GBS",
        help="predict the pure ceiling at this bandwidth instead of this machine's cached probe",
    )
    lad.add_argument("--no-quality", action="store_true", help="skip perplexity and KL")
    _quality_args(lad)
    fmt = lad.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="machine-readable output")
    fmt.add_argument("--md", action="store_true", help="a Markdown table")
    lad.add_argument("--no-progress", action="store_true", help="no progress line on stderr")
    lad.set_defaults(func=run_ladder_cmd)


def _quality_args(p) -> None:
    p.add_argument("--text", default=None, help="UTF-8 text file to score (default: the shipped public-domain text)")
    p.add_argument(
        "--ctx", type=int, default=None, help="window length in tokens (default 512, capped at the trained context)"
    )
    p.add_argument("--max-tokens", type=int, default=None, help="score at most the first N tokens of the text")
    if not any(a.dest == "threads" for a in p._actions):
        p.add_argument("--threads", type=int, default=None, help="llama.cpp threads")


def run_quantize(args) -> int:
    from ondevice.core.paths import check_destination
    from ondevice.gguf.reader import read_gguf
    from ondevice.gguf.spec import inspect
    from ondevice.models.materialize import resolve_model
    from ondevice.quant.quantize import file_type, is_quantized, quantize

    file_type(args.qtype)  # an unknown type fails before anything is read
    check_destination(args.dst, force=args.force)  # so does a destination that cannot take the output
    src = resolve_model(args.src)
    already = is_quantized(read_gguf(src))
    if already and args.allow_requantize:
        print(
            f"ondevice: warning: {src} is already quantized ({', '.join(already)}); "
            "requantizing cannot bring back the quality it lost",
            file=sys.stderr,
        )
    bar = ProgressBar(f"quantizing to {args.qtype.upper()}") if not args.no_progress else None
    t0 = time.perf_counter()
    try:
        out = quantize(
            src,
            Path(args.dst),
            args.qtype,
            threads=args.threads,
            allow_requantize=args.allow_requantize,
            force=args.force,
            pure=args.pure,
            progress=bar,
        )
    finally:
        if bar is not None:
            bar.close()
    elapsed = time.perf_counter() - t0
    s_in, s_out = inspect(src), inspect(out)
    if args.json:
        dump_json(
            {
                "src": str(src),
                "dst": str(out),
                "type": args.qtype.upper(),
                "seconds": elapsed,
                "src_bytes": s_in.file_bytes,
                "dst_bytes": s_out.file_bytes,
                "src_bits_per_weight": s_in.bits_per_weight,
                "dst_bits_per_weight": s_out.bits_per_weight,
                "bytes_by_type": s_out.bytes_by_type,
            }
        )
        return 0
    print(
        f"wrote {out}: {human_bytes(s_out.file_bytes)}, {s_out.bits_per_weight:.2f} bits per weight "
        f"(from {human_bytes(s_in.file_bytes)}, {s_in.bits_per_weight:.2f} bpw) in {elapsed:.1f} s"
    )
    types = ", ".join(f"{t} {100 * b / s_out.weight_bytes:.0f}%" for t, b in s_out.bytes_by_type.items())
    print(f"  tensor bytes by type: {types}")
    return 0


def _quality_opts(args) -> dict[str, Any]:
    return {"text": args.text, "n_ctx": args.ctx, "max_tokens": args.max_tokens, "n_threads": args.threads}


def run_quality(args) -> int:
    from ondevice.models.materialize import resolve_model
    from ondevice.quant import quality

    base = resolve_model(args.base)
    other = resolve_model(args.other) if args.other else None
    line = ProgressLine(not args.no_progress)
    tell = lambda d, n: line(f"scoring: window {d}/{n}")  # noqa: E731 - one progress line format, passed as a callback
    try:
        if other is None:
            result: Any = quality.perplexity(base, progress=tell, **_quality_opts(args))
        else:
            result = quality.compare(base, other, progress=tell, **_quality_opts(args))
    finally:
        line.done()
    if args.json:
        dump_json(result.to_dict())
    elif other is None:
        print(_ppl_line(result))
    else:
        print(render_comparison(result))
    return 0


def _ppl_line(p) -> str:
    return (
        f"{p.model_path}: perplexity {p.ppl:.4f} (± {p.ppl * p.nll_stderr:.3f}); {p.n_scored} tokens scored "
        f"in {p.n_windows} windows of {p.n_ctx}, text {p.text_name}, {p.eval_s:.1f} s"
    )


def render_comparison(c) -> str:
    return "\n".join(
        [
            f"base   {_ppl_line(c.base)}",
            f"other  {_ppl_line(c.other)}",
            f"perplexity ratio other/base: {c.ppl_ratio:.4f}",
            f"KL(base || other), nats per token: mean {c.kl_mean:.6f}, median {c.kl_median:.6f}, "
            f"p99 {c.kl_p99:.6f}, max {c.kl_max:.6f}",
            f"top-1 agreement: {100 * c.top1_agreement:.2f}% of {c.other.n_scored} positions",
        ]
    )


def run_ladder_cmd(args) -> int:
    from ondevice.models.materialize import resolve_model
    from ondevice.quant.ladder import BenchPlan, parse_types, run_ladder

    parse_types(args.types)  # unknown types fail before anything is read
    src = resolve_model(args.src)
    bench = None if args.no_bench else BenchPlan(args.prompt_tokens, args.gen_tokens, args.runs, args.threads)
    line = ProgressLine(not args.no_progress)
    try:
        ladder = run_ladder(
            src,
            args.types,
            allow_requantize=args.allow_requantize,
            threads=args.threads,
            bench=bench,
            quality_opts=_quality_opts(args),
            with_quality=not args.no_quality,
            bandwidth_gbs=args.bandwidth,
            progress=lambda stage, detail: line(f"ladder: {stage} {detail}"),
        )
    finally:
        line.done()
    if args.json:
        dump_json(ladder.to_dict())
    elif args.md:
        print(ladder_markdown(ladder))
    else:
        print(render_ladder(ladder, width=terminal_width()))
    return 0


def _kl(v: float | None) -> str:
    if v is None:
        return "-"
    return "0" if v == 0 else format(v, ".5f" if v >= 1e-3 else ".2e")


def _rows(ladder) -> tuple[list[str], list[list[str]]]:
    headers = [
        "type",
        "size",
        "bpw",
        "ceiling tok/s",
        "predicted tok/s",
        "measured tok/s",
        "TTFT ms",
        "PPL",
        "KL",
        "top-1",
    ]
    rows = []
    for r in ladder.rungs:
        rows.append(
            [
                r.qtype + (" (base)" if r.is_base else ""),
                human_bytes(r.file_bytes),
                f"{r.bits_per_weight:.2f}",
                number(r.ceiling_tok_s),
                number(r.predicted_tok_s),
                number(r.decode_tok_s),
                millis(r.ttft_s, unit=False),
                number(r.ppl, ".3f"),
                _kl(r.kl_mean),
                "-" if r.top1_agreement is None else f"{100 * r.top1_agreement:.1f}%",
            ]
        )
    return headers, rows


def _notes(ladder) -> list[str]:
    notes = [
        f"source {ladder.source} ({ladder.source_quant or 'unknown type'}); quality measured against {ladder.base_type}"
    ]
    if ladder.bench:
        b = ladder.bench
        notes.append(
            f"speed: {b.prompt_tokens}-token prompt, {b.output_tokens} tokens generated (EOS ignored), "
            f"median of {b.runs} runs after a warm-up, backend {ladder.backend}; predictions at context {b.mean_ctx}"
        )
    if ladder.prediction_note:
        notes.append(ladder.prediction_note)
    if ladder.quality_text:
        notes.append(
            f"quality: {ladder.quality_scored_tokens} tokens of {ladder.quality_text} scored, windows of "
            f"{ladder.quality_n_ctx}"
        )
    return notes


def render_ladder(ladder, *, width: int | None = None) -> str:
    """The ladder as text; width: the terminal's columns (None: no limit). A narrow terminal loses
    the pure ceiling first (the calibrated prediction stays), then bits per weight (size stays)."""
    headers, rows = _rows(ladder)
    notes = [fold("  " + n, width, indent="    ") for n in _notes(ladder)]
    return "\n".join(
        [
            table(headers, rows, align="lrrrrrrrrr", width=width, drop=("ceiling tok/s", "bpw"), full="--json/--md"),
            *notes,
        ]
    )


def ladder_markdown(ladder) -> str:
    headers, rows = _rows(ladder)
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(["---"] + ["---:"] * (len(headers) - 1)) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines + [""] + [f"- {n}" for n in _notes(ladder)])
