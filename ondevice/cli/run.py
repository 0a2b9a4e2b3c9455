"""`ondevice run [MODEL] PROMPT` (alias `generate`): stream a completion, then one line of timings.

The text goes to stdout as it streams; the timings line goes to stderr, so
`ondevice run "..." > out.txt` keeps only the text. PROMPT "-" reads stdin.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from ondevice.cli.engine_args import add_engine_args, add_retime_arg, engine_kwargs, say_fit, settings_text
from ondevice.cli.progress import resolve_model_with_bar
from ondevice.cli.sampling_args import add_sampling_args, sampling_settings
from ondevice.core.errors import DestinationError, InvalidParameterError, StateFileError
from ondevice.core.fmt import MS_THEN_S, millis, number, rate
from ondevice.engine.sampling import DEFAULTS

__all__ = [
    "register",
    "run",
    "timings_line",
    "explain_text",
    "add_speculative_args",
    "speculative_kwargs",
    "speculative_text",
    "add_spec_exact_arg",
    "parse_spec_exact",
]


def register(sub) -> None:
    p = sub.add_parser(
        "run",
        aliases=["generate"],
        help="generate text from a prompt and show its timings",
        description="Generate a completion for PROMPT with MODEL (default: the built-in model).",
    )
    p.add_argument(
        "args",
        nargs="+",
        metavar="[MODEL] PROMPT",
        help="optional model (registry name or .gguf path), then the prompt ('-' = stdin)",
    )
    p.add_argument(
        "-n",
        "--max-tokens",
        type=int,
        default=DEFAULTS.max_tokens,
        help=f"output tokens at most (default {DEFAULTS.max_tokens})",
    )
    add_sampling_args(p)
    p.add_argument("--seed", type=int, default=None, help="sampling seed (default: the engine's)")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true", help="keep generating past end-of-sequence")
    p.add_argument(
        "-c",
        "--n-ctx",
        type=int,
        default=None,
        help="context window in tokens, 256 up to the model's trained context; 0 = the trained context "
        "(default 4096, or the trained context when smaller)",
    )
    p.add_argument("--threads", type=int, default=None, help="CPU threads (default: physical cores)")
    p.add_argument("--n-gpu-layers", default="auto", help="'auto' (all when the build can offload), or a count")
    p.add_argument("--no-predict", action="store_true", help="skip the roofline prediction")
    p.add_argument(
        "--explain",
        action="store_true",
        help="after the timings, where the request's time went (tokenize, prefill, decode, sampling, ...)",
    )
    p.add_argument(
        "--prompt-cache",
        metavar="FILE",
        default=None,
        help="KV state file: restored when it was saved for this model, build, context and prompt prefix, "
        "else the prompt is computed; saved after the run either way",
    )
    add_retime_arg(p)
    add_speculative_args(p)
    add_engine_args(p)
    p.set_defaults(func=run, late_positionals="args")  # `run MODEL -n 2 PROMPT` works (cli.main)


def run(args) -> int:
    from ondevice.api import load

    if args.prompt_cache:
        _check_prompt_cache_path(Path(args.prompt_cache))
    if len(args.args) > 2:
        raise InvalidParameterError("expected [MODEL] PROMPT; quote a prompt that has spaces")
    model, prompt = (None, args.args[0]) if len(args.args) == 1 else args.args
    spec = speculative_kwargs(args)  # bad settings or a missing draft file: one line, before any work
    sampling = sampling_settings(args)
    if prompt == "-":
        prompt = _read_stdin()
    model = resolve_model_with_bar(model)  # the default model's first use assembles it: a bar on a terminal
    layers = args.n_gpu_layers if args.n_gpu_layers == "auto" else _int_arg("--n-gpu-layers", args.n_gpu_layers)
    engine = load(
        model,
        n_ctx=args.n_ctx,
        n_threads=args.threads,
        n_gpu_layers=layers,
        predictor=None if args.no_predict else "auto",
        retime=args.retime,
        progress=_say,
        **engine_kwargs(args),
    )
    say_fit(engine.info)
    try:
        if args.prompt_cache:
            prompt = engine.tokenize(prompt) if isinstance(prompt, str) else prompt
            _restore_prompt_cache(engine, Path(args.prompt_cache), prompt)
        stream = engine.stream(
            prompt,
            max_tokens=args.max_tokens,
            **sampling,
            seed=args.seed,
            stop=args.stop,
            ignore_eos=args.ignore_eos,
            **spec,
        )
        interrupted = False
        try:
            for ev in stream:
                if ev.text:
                    sys.stdout.write(ev.text)
                    sys.stdout.flush()
        except KeyboardInterrupt:  # the text so far stays printed; its timings follow when there are any
            interrupted = True
            stream.close()
        sys.stdout.write("\n")
        sys.stdout.flush()
        g = stream.generation
        if g is not None:
            from ondevice.roofline import Predictor as RooflinePredictor

            basis = engine.predictor.basis if isinstance(engine.predictor, RooflinePredictor) else None
            print(
                f"{timings_line(g, engine.info.load_s, engine.info.backend, basis)} | {settings_text(engine.info)}",
                file=sys.stderr,
            )
            if args.explain and g.attribution is not None:
                print(explain_text(g), file=sys.stderr)
            _say_drift(engine.predictor, g)
        if interrupted or (g is not None and g.finish_reason == "cancelled"):
            _say("interrupted: the text above is what was generated" + ("" if g else " (no timings: no token yet)"))
            return 130
        if args.prompt_cache and g is not None:
            n_bytes = engine.save_state(args.prompt_cache)
            _say(f"prompt cache {args.prompt_cache}: saved {engine.kv_cache_tokens} tokens ({n_bytes} bytes)")
        return 0
    finally:
        engine.close()


def _say_drift(predictor, g) -> None:
    """After a run predicted from a cached timing: say so when the last runs all missed it one way (probing.drift)."""
    from ondevice.probing.drift import note_predicted_run

    drift = note_predicted_run(predictor, g)
    if drift is not None:
        _say(f"{drift.describe()}; --retime times it again")


def _check_prompt_cache_path(path: Path) -> None:
    """Before any work: a directory, device or other special file, or a file that is not a state file, is
    refused (one line, exit 2), so nothing that is not ours is overwritten."""
    from ondevice.engine.state import MAGIC

    if not path.exists() and not path.is_symlink():
        return
    if not path.is_file() or path.is_symlink() and not Path(os.path.realpath(path)).is_file():
        raise DestinationError(f"--prompt-cache {path}: not a regular file")
    with open(path, "rb") as f:
        if f.read(len(MAGIC)) != MAGIC:
            raise StateFileError(f"--prompt-cache {path}: not an ondevice KV state file; not overwriting it")


def _restore_prompt_cache(engine, path: Path, ids: list[int]) -> None:
    """Restore the saved state when it fits this engine and shares a prefix with the prompt; else say why."""
    if not path.exists():
        _say(f"prompt cache {path}: none yet; computing the prompt")
        return
    try:
        engine.load_state(path)
    except StateFileError as exc:
        _say(f"{exc}; computing the prompt")
        return
    n_shared = engine.cached_prefix(ids)
    if n_shared == 0:
        engine.reset()
        _say(f"prompt cache {path}: saved for another prompt; computing the prompt")
        return
    _say(f"prompt cache {path}: restored, {n_shared} of {len(ids)} prompt tokens from it")


def add_speculative_args(p) -> None:
    """--speculative, --draft, --spec-k (run and chat)."""
    p.add_argument(
        "--speculative",
        choices=("lookup", "draft"),
        default=None,
        help="speculative decoding: draft tokens by prompt lookup, or with --draft MODEL; the model "
        "verifies every draft, so the output is plain decoding's",
    )
    p.add_argument(
        "--draft",
        default=None,
        metavar="MODEL",
        help="draft model (a smaller GGUF with the same vocabulary) for --speculative draft",
    )
    p.add_argument(
        "--spec-k",
        type=int,
        default=None,
        metavar="K",
        help="most drafted tokens per step, 0-64 (default 16; the engine picks k per step)",
    )
    add_spec_exact_arg(p)


def add_spec_exact_arg(p) -> None:
    """--spec-exact on|off (run and bench)."""
    from ondevice.engine.speculative import DEFAULT_EXACT

    p.add_argument(
        "--spec-exact",
        default=None,
        metavar="on|off",
        help="on: k capped where a verify batch gives single-token logits bit for bit (output identical to "
        "plain decoding); off: k chosen for speed (the model's greedy choice under batched arithmetic); "
        f"default {'on' if DEFAULT_EXACT else 'off'}",
    )


def parse_spec_exact(value: str | None) -> bool | None:
    """--spec-exact's value: on -> True, off -> False, absent -> None; anything else InvalidParameterError."""
    if value is None:
        return None
    words = {"on": True, "off": False}
    if value.lower() not in words:
        raise InvalidParameterError(f"--spec-exact must be on or off, not {value!r}")
    return words[value.lower()]


def speculative_kwargs(args) -> dict:
    """The stream() keyword arguments of the speculative flags, checked (a draft model must exist)."""
    from ondevice.engine.speculative import spec_settings

    exact = parse_spec_exact(args.spec_exact)
    if exact is not None and args.speculative is None and args.draft is None:
        raise InvalidParameterError("--spec-exact needs --speculative lookup or --draft MODEL")
    settings = spec_settings(args.speculative, args.draft, args.spec_k, exact)
    if settings is None:
        return {}
    if settings.draft is not None:
        from ondevice.models.materialize import resolve_model

        resolve_model(settings.draft)  # ModelNotFoundError: one line, exit 2
    return {"speculative": settings.mode, "draft": settings.draft, "spec_k": args.spec_k, "exact": settings.exact}


def speculative_text(s, committed_tok_s: float | None) -> str:
    """The speculative line: "speculative lookup: acceptance 81% (52/64 drafted), 2.6 accepted/step, k 2 (cap 2),
    committed 31.0 tok/s, predicted 1.9x"."""
    if s.acceptance_rate is None:
        acc = "nothing drafted"
    else:
        acc = (
            f"acceptance {100 * s.acceptance_rate:.0f}% ({s.accepted}/{s.drafted} drafted), "
            f"{s.mean_accepted_per_step:.1f} accepted/step"
        )
    pred = f", predicted {s.predicted_speedup:.2f}x plain" if s.predicted_speedup else ""
    if s.speedup_at_acceptance:
        pred += f" ({s.speedup_at_acceptance:.2f}x at the acceptance measured)"
    exact = "exact" if s.exact else "k for speed"
    return (
        f"speculative {s.mode}: {exact}, {acc}, {s.steps} verify + {s.plain_steps} plain steps, "
        f"k {s.k_final} (cap {s.k_cap}), "
        f"committed {rate(committed_tok_s)}{pred}"
    )


def _say(line: str) -> None:
    print(f"ondevice: {line}", file=sys.stderr, flush=True)


def _read_stdin() -> str:
    """The prompt from stdin, read as bytes whatever the locale: invalid UTF-8 becomes U+FFFD."""
    from ondevice.core.textclean import clean_text, decode_utf8

    buffer = getattr(sys.stdin, "buffer", None)
    return decode_utf8(buffer.read()) if buffer is not None else clean_text(sys.stdin.read())


def _int_arg(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise InvalidParameterError(f"{name} must be 'auto' or an integer, not {value!r}") from None


# prediction basis -> the words beside a rate and beside a time (a bound caps a rate and floors a time)
_BASIS = {"estimate": ("estimated", "estimated"), "bound": ("at most", "at least")}
NOT_TIMED = "this model was not timed here"


def timings_line(g, load_s: float | None = None, backend: str | None = None, basis: str | None = None) -> str:
    """One line: TTFT, TPOT, decode and prefill rates, E2E and output throughput, token counts,
    finish reason, each measured figure with its prediction beside it when there is one, and the CPU other
    processes took meanwhile. basis: the predictor's ("measured", "estimate", "bound")."""
    t = g.timings
    cached = f", {g.cached_prompt_tokens} cached" if g.cached_prompt_tokens else ""
    decode = f"decode {rate(t.decode_tok_s)}"
    rate_word, word = _BASIS.get(basis or "", ("predicted", "predicted"))
    if g.predicted_tok_s:
        ceiling = f"ceiling {number(g.ceiling_tok_s)}"
        if basis == "bound":
            decode += f" ({ceiling}; {NOT_TIMED})"
        elif basis in _BASIS:
            decode += f" ({ceiling}, {rate_word} {number(g.predicted_tok_s)}; {NOT_TIMED})"
        else:
            decode += f" (predicted {number(g.predicted_tok_s)}, {ceiling})"
    parts = [
        f"TTFT {millis(t.ttft_s)}{_beside(g.predicted_ttft_s, word)}",
        f"TPOT {millis(t.tpot_s)}",
        decode,
        f"prefill {rate(t.prefill_tok_s)}",
        f"E2E {_secs(t.e2e_s)}{_beside(g.predicted_e2e_s, word)}",
        f"output {rate(t.output_throughput_tok_s)}",
        f"tokens {g.prompt_tokens} prompt{cached} + {t.output_tokens} output",
        f"finish {g.finish_reason}",
    ]
    if g.other_cpu_cores is not None:
        parts.append(f"other processes used {g.other_cpu_cores:.1f} cores")
    if g.speculative is not None:
        parts.append(speculative_text(g.speculative, t.decode_tok_s))
    if load_s is not None:
        parts.append(f"load {load_s:.2f} s" + (f" on {backend}" if backend else ""))
    return " | ".join(parts)


def _secs(s: float | None) -> str:
    return millis(s, places=MS_THEN_S)


def _beside(predicted_s: float | None, word: str = "predicted") -> str:
    return f" ({word} {_secs(predicted_s)})" if predicted_s else ""


_PARTS = (
    ("tokenize_s", "tokenize"),
    ("prefill_s", "prefill"),
    ("first_sample_s", "first sample"),
    ("decode_s", "llama_decode"),
    ("sample_s", "sampling"),
    ("detokenize_s", "detokenize + stop checks"),
    ("consumer_s", "this program (printing)"),
    ("overhead_s", "other"),
)


def explain_text(g) -> str:
    """Where the request's E2E went (Generation.attribution), one row per part, and the split
    between prefill (TTFT) and decode: which side of the wait a lever can shorten."""
    from ondevice.core.fmt import table

    a = g.attribution
    shares = a.shares()
    rows = [[label, millis(getattr(a, key)), f"{100 * shares[key]:.1f}%"] for key, label in _PARTS]
    rows.append(["E2E", millis(a.e2e_s), "100.0%"])
    ttft_share = g.timings.ttft_s / a.e2e_s if a.e2e_s > 0 else 0.0
    head = (
        f"where the time went: TTFT {100 * ttft_share:.1f}% of E2E (prefill side), "
        f"decode {100 * (1 - ttft_share):.1f}% (decode side)"
    )
    return head + "\n" + table(["part", "time", "share"], rows, align="lrr")
