"""`ondevice predict [MODEL] [--ctx 128,2048,8192] [--prompt 1024] [--json]`, or a spec from flags."""

from __future__ import annotations

import math
import sys

from ondevice.cli.engine_args import add_fit_arg, add_kv_cache_args
from ondevice.cli.output import dump_json, terminal_width
from ondevice.cli.target_args import add_target_args, estimate_lines, memory_where_text, target_from_args
from ondevice.core.fmt import MS_THEN_S, fold_lines, human_bytes, millis, number, table

__all__ = ["register", "run", "render", "DEFAULT_CONTEXTS"]

DEFAULT_CONTEXTS = (128, 2048, 8192)


def register(sub) -> None:
    p = sub.add_parser("predict", help="predict decode speed, TTFT and memory for a model on this machine")
    p.add_argument("model", nargs="?", help="registry name or .gguf path (default: the built-in model)")
    p.add_argument("--ctx", help="context lengths, comma-separated (default 128,2048,8192 within the model's)")
    p.add_argument(
        "--prompt",
        type=int,
        default=None,
        help="prompt tokens of the request predicted (default 1024, or the trained context when shorter)",
    )
    p.add_argument(
        "--output",
        type=int,
        default=None,
        help="output tokens of the request: predict its decode time, E2E and the prefill share",
    )
    p.add_argument(
        "--bandwidth",
        type=float,
        help="GB/s of another machine: the bound, and beside it an estimate fitted on published llama.cpp runs",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.add_argument(
        "--plot",
        metavar="FILE.svg",
        help="draw the roofline: the ceiling line and the predicted decode tok/s of each context against its bytes "
        "per token (.svg, .png or .pdf; needs the extra ondevice[plot])",
    )
    p.add_argument("--force", action="store_true", help="replace an existing --plot file")
    p.add_argument(
        "--refresh", action="store_true", help="time the model here again instead of using its cached timing"
    )
    g = p.add_argument_group(
        "a model you have not downloaded (instead of MODEL): its twin is timed here; with --params, give "
        "--d-model and --vocab too (else only the bound and an estimate)"
    )
    g.add_argument("--config", metavar="CONFIG.json", help="its Hugging Face config.json (with --quant)")
    g.add_argument("--params", help="parameters, e.g. 8B or 8.03e9")
    g.add_argument("--quant", help="file type, e.g. Q4_K_M, Q8_0, F16 (default with --config: Q4_K_M)")
    g.add_argument("--layers", type=int, help="transformer blocks")
    g.add_argument("--kv-heads", type=int, help="key/value heads")
    g.add_argument("--head-dim", type=int, help="head dimension")
    g.add_argument("--d-model", type=int, help="embedding width (with --vocab: the embedding is a row gather)")
    g.add_argument("--vocab", type=int, help="vocabulary size")
    g.add_argument("--heads", type=int, help="query heads (attention FLOPs)")
    g.add_argument("--ctx-train", type=int, help="trained context length")
    g.add_argument("--active-params", type=float, help="parameters used per token (MoE)")
    g.add_argument("--tied", action="store_true", help="output head tied to the embedding")
    add_kv_cache_args(p)
    add_fit_arg(p)
    add_target_args(p)
    p.set_defaults(func=run)


_FLAGS = (
    "params",
    "quant",
    "layers",
    "kv_heads",
    "head_dim",
    "d_model",
    "vocab",
    "heads",
    "ctx_train",
    "active_params",
)


def _spec(args):
    """(the ModelSpec predicted, the header of a model given by --config or enough flags to write its twin, or None)."""
    from ondevice.core.errors import SpecError

    given = {f: getattr(args, f) for f in _FLAGS if getattr(args, f) is not None}
    if args.config is not None:
        if args.model or set(given) - {"quant"} or args.tied:
            raise SpecError("give --config with --quant only (not MODEL or the other spec flags)")
        return _header_spec(_config_header(args.config, args.quant or "Q4_K_M"))
    if not given and not args.tied:
        from ondevice.gguf.spec import inspect
        from ondevice.models.materialize import resolve_model

        return inspect(resolve_model(args.model)), None
    if args.model:
        raise SpecError("give either MODEL or a spec (--params, --quant, ...), not both")
    from ondevice.roofline.spec import parameter_count, spec_from_flags

    kw = {f: getattr(args, f) for f in _FLAGS}
    kw.update(params=None if args.params is None else parameter_count(args.params), tied=args.tied)
    spec = spec_from_flags(**kw)  # checks every flag (SpecError naming it) whether or not a twin is written
    another_machine = args.bandwidth is not None or args.device is not None
    if args.d_model and args.vocab and not args.active_params and not another_machine:
        from ondevice.quant.hfconfig import llama_config

        names = ("params", "layers", "d_model", "vocab", "kv_heads", "head_dim", "heads", "ctx_train", "tied")
        config = llama_config(**{k: kw[k] for k in names if kw.get(k) is not None})
        return _header_spec(_config_header(config, args.quant))
    return spec, None


def _config_header(config, quant: str):
    from ondevice.quant.hfconfig import header_from_hf_config
    from ondevice.quant.twin import quantized_header

    return quantized_header(header_from_hf_config(config), quant)


def _header_spec(header):
    from ondevice.quant.twin import header_spec

    return header_spec(header), header


def _contexts(text: str | None, spec) -> tuple[int, ...]:
    from ondevice.core.errors import InvalidParameterError

    if text is None:
        limit = spec.n_ctx_train or max(DEFAULT_CONTEXTS)
        return tuple(c for c in DEFAULT_CONTEXTS if c <= limit) or (limit,)
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) <= 0:
            raise InvalidParameterError(f"--ctx takes positive integers separated by commas, not {text!r}")
        out.append(int(part))
    return tuple(out)


def run(args) -> int:
    from ondevice.api import predict
    from ondevice.core.errors import InvalidParameterError
    from ondevice.roofline.prediction import check_contexts

    spec, header = _spec(args)
    spec = spec.with_kv_cache(args.cache_type_k, args.cache_type_v)
    contexts = check_contexts(_contexts(args.ctx, spec), spec)  # before any probing (a minute on a first run)
    if args.prompt is not None and args.prompt <= 0:
        raise InvalidParameterError(f"--prompt must be a positive number of tokens, not {args.prompt}")
    if args.output is not None and args.output <= 0:
        raise InvalidParameterError(f"--output must be a positive number of tokens, not {args.output}")
    if args.plot is not None:  # before any probing: a bad destination or a missing extra is one line
        from ondevice.bench.plot import check_plot_path
        from ondevice.core.paths import check_destination

        check_destination(args.plot, force=args.force)
        check_plot_path(args.plot)
    if args.prompt is None:
        args.prompt = min(1024, spec.n_ctx_train or 1024)
    if spec.n_ctx_train and args.prompt + (args.output or 0) > spec.n_ctx_train:
        raise InvalidParameterError(
            f"--prompt {args.prompt} + --output {args.output or 0} tokens is longer than the "
            f"model's trained context of {spec.n_ctx_train} tokens"
        )
    given_bandwidth = args.bandwidth
    target, args.bandwidth = target_from_args(args)  # another machine: its bandwidth (from --device too)
    probe = _probe(args)
    timing = None
    if args.bandwidth is None and header is not None:  # a model not downloaded: its twin timed here (cached)
        timing = _header_timing(args, header, spec)
    elif args.bandwidth is None and spec.path:  # a model file: its shape timed on this machine (cached)
        timing, spec = _timing(args, spec)
    pred = predict(
        spec,
        timing=timing,
        ctx=contexts,
        probe=probe,
        bandwidth_gbs=args.bandwidth,
        prompt_tokens=args.prompt,
        output_tokens=args.output,
        target=target,
    )
    fit = fit_choice(spec, contexts, target, args) if args.fit else None
    if args.plot is not None:
        from ondevice.bench.plot import roofline_from_prediction, write_plot

        write_plot(args.plot, roofline_from_prediction(pred))
    if args.json:
        d = pred.to_dict()
        d["probe_age_s"] = probe.age_s if probe is not None else None
        d["bandwidth_source"] = _bandwidth_source(pred, given_bandwidth, args.device)
        d["fit"] = None if fit is None else {"n_ctx": fit.n_ctx, "n_gpu_layers": fit.n_gpu_layers, "reason": fit.reason}
        dump_json(d)
    else:
        label = _bandwidth_source(pred, given_bandwidth, args.device)
        print(render(pred, spec, probe, width=terminal_width(), target=target, bandwidth_label=label))
        if fit is not None:
            print(f"--fit: {fit.reason}")
    return 0


def _say(args):
    return None if args.json else (lambda m: print(f"ondevice: {m}", file=sys.stderr, flush=True))


def _bandwidth_source(pred, given, device) -> str:
    """Where the bandwidth came from: "measured", "given", or "nameplate: <device>" (--device's table)."""
    if pred.bandwidth_source == "given" and given is None and device:
        return f"nameplate: {device}"
    return pred.bandwidth_source


def fit_choice(spec, contexts, target, args):
    """--fit: the largest context (up to --ctx's largest when given, else the trained context) and offload that
    fit this machine's free memory, or the target's --memory (its RAM is not weighed then)."""
    from ondevice.core.errors import InvalidParameterError
    from ondevice.roofline.memory import fit_memory

    ctx_max = max(contexts) if args.ctx else (spec.n_ctx_train or max(contexts))
    if target is None:
        from ondevice.engine.memcheck import plan_fit

        path = spec.path if spec.path else None
        return plan_fit(path, spec, ctx_max=ctx_max, n_ubatch=None, flash_attn="auto")
    if not target.memory_bytes:
        raise InvalidParameterError("--fit for another machine needs its memory: give --memory GB")
    vram = target.memory_where == "VRAM"
    return fit_memory(
        spec,
        ctx_max=ctx_max,
        backend=target.backend or "CUDA",
        device_free_bytes=target.memory_bytes if vram else None,
        host_free_bytes=1 << 62 if vram else target.memory_bytes,
        unified=target.memory_where == "unified memory",
    )


def _probe(args):
    """The cached probe; without one (and no --bandwidth) the first-contact probe measures the bandwidth now."""
    from ondevice.api import first_contact
    from ondevice.probing import cached_probe, default_backend

    cached = cached_probe()
    if args.bandwidth is not None or cached is not None:
        return cached
    return first_contact(default_backend(), _say(args))


def _timing(args, spec):
    """(the model file's timing on this machine with the engine settings given, its spec as that engine reads it)."""
    from ondevice.engine import load
    from ondevice.probing import timing_for

    engine = load(spec.path, cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v)
    try:
        return timing_for(engine, progress=_say(args), refresh=args.refresh), engine.info.spec
    finally:
        engine.close()


def _header_timing(args, header, spec):
    """The timing of a model known by its header: its twins on this machine (cached under its shape)."""
    from ondevice.probing import timing_for_header

    kv = {"cache_type_k": args.cache_type_k, "cache_type_v": args.cache_type_v}
    return timing_for_header(header, spec, engine_args=kv, progress=_say(args), refresh=args.refresh)


def render(p, spec, probe, *, width: int | None = None, target=None, bandwidth_label: str | None = None) -> str:
    from ondevice.core.fmt import age_text

    name = spec.name or p.model
    head = p.model if p.model == name else f"{p.model}  ({name})"
    lines = [head + (f", {p.quant}" if p.quant and p.quant not in head else "")]
    lines.append(
        f"  reads {human_bytes(spec.decode_weight_bytes)} of weights per token; "
        f"KV {spec.kv_bytes_per_token} B per token of context ({'/'.join(spec.kv_cache_types)} cache)"
    )
    src = bandwidth_label or p.bandwidth_source
    src = f"measured by the probe {age_text(probe.age_s)}" if src == "measured" and probe else src
    backend = f"backend {p.backend}; " if p.backend != "given" else ""
    lines.append(f"  {backend}ceiling bandwidth {p.bandwidth_gbs:.1f} GB/s ({src})")
    lines.append("")
    rows = []
    for i, c in enumerate(p.contexts):
        e = p.estimates[i] if p.estimates else None
        rows.append(
            [
                c.n_ctx,
                human_bytes(c.kv_bytes),
                f"{c.ceiling_tok_s:.1f}",
                *([f"{e.tok_s:.1f} ({e.low_tok_s:.0f}–{e.high_tok_s:.0f})"] if e else []),
                number(c.predicted_tok_s or None),
                millis(c.predicted_step_s or None, places=((math.inf, 2),), unit=False),
            ]
        )
    est = ["estimated tok/s (range)"] if p.estimates else []
    lines.append(
        table(
            ["context", "KV read", "ceiling tok/s", *est, "predicted tok/s", "predicted ms/token"],
            rows,
            align="r" * len(rows[0]),
            width=width,
            full="--json",
        )
    )
    lines.append(
        "  ceiling: a bound decoding cannot beat"
        + ("; predicted: from the model's shape timed on this machine" if p.calibrated else "")
    )
    lines += estimate_lines(p)
    lines.append("")
    if p.ttft:
        t = p.ttft
        bound = "compute" if t.compute_s >= t.bandwidth_s else "bandwidth"
        lines.append(
            f"TTFT floor for {t.prompt_tokens} prompt tokens: {1e3 * t.floor_s:.0f} ms "
            f"({bound}-bound: {t.prefill_flops / 1e9:.1f} GFLOP at {t.compute_gflops:.1f} GFLOP/s)"
        )
    if p.request:
        lines += request_lines(p.request)
    m = p.memory
    avail = memory_where_text(m, target)
    lines.append(
        f"memory at {m.n_ctx} tokens: weights {human_bytes(m.weight_bytes)} + KV {human_bytes(m.kv_bytes)} "
        f"+ buffers ~{human_bytes(m.buffer_bytes)} = {human_bytes(m.total_bytes)} of {avail}: {m.verdict.upper()}"
    )
    lines += [f"  note: {n}" for n in p.notes]
    return fold_lines("\n".join(lines), width)


def request_lines(r) -> list[str]:
    """The request's predicted timeline: TTFT, decode, E2E, and where the wait goes."""
    what = {
        "calibrated": "predicted",
        "estimate": "estimated (decode fitted on published llama.cpp runs; TTFT a floor at the compute figure)",
    }.get(r.basis, "at best (bounds: nothing timed)")
    if r.ttft_s is None:
        if r.output_tokens is None:
            return [f"request of {r.prompt_tokens} prompt tokens: TTFT unknown (see the notes)"]
        return [
            f"request of {r.prompt_tokens} prompt + {r.output_tokens} output tokens, decode estimated (fitted on "
            "published llama.cpp runs):",
            f"  decode {_secs(r.decode_s)} ({r.output_tokens - 1} steps, TPOT {millis(r.tpot_s)}); TTFT and E2E "
            "unknown (see the notes)",
        ]
    if r.output_tokens is None:
        return [f"request of {r.prompt_tokens} prompt tokens, {what}: TTFT {_secs(r.ttft_s)}"]
    out = [
        f"request of {r.prompt_tokens} prompt + {r.output_tokens} output tokens, {what}:",
        f"  TTFT {_secs(r.ttft_s)} + decode {_secs(r.decode_s)}"
        + (f" ({r.output_tokens - 1} steps, TPOT {millis(r.tpot_s)})" if r.tpot_s else "")
        + f" = E2E {_secs(r.e2e_s)}; output {number(r.output_tok_s)} tok/s",
        f"  the wait is {100 * r.prefill_share:.0f}% prefill, {100 * (1 - r.prefill_share):.0f}% decode: "
        + (
            "a shorter prompt or a prefix cache helps most"
            if r.prefill_share >= 0.5
            else "fewer bytes per token (a smaller quant, a faster memory) helps most"
        ),
    ]
    return out


def _secs(s: float | None) -> str:
    return millis(s, places=MS_THEN_S)
