"""Does the TUI slow decoding? Decode tok/s of a 256-token answer streamed by the chat app
(headless, App.run_test) against Engine.stream alone, interleaved A B A B ... A on one engine.

    python -m benchmarks.tui_overhead [--pairs 11] [--tokens 256] [--model REF] [--json]

A: Engine.stream(prompt ids) with the very token ids the chat renders for the message,
   KV cache cleared, consumed in a bare loop in a worker thread (the TUI decodes in one).
B: the chat app (ChatApp, 120x40, Markdown streaming, stats panel, paced frames) sends the
   same message on the same engine, KV cache cleared; its Generation's timings are read.
Both: greedy, ignore_eos, no stop strings, max_tokens N, so both decode exactly N tokens (the
built-in base model, chatting through the plain User/Assistant transcript, would start the
next turn itself after a dozen tokens and stop there). Each B is held against the mean of
the two A runs around it (a steady drift of the machine cancels). Target: median of the
ratios B/A >= 0.97; the bootstrap interval printed with it says how far this machine's
noise alone moves that median. Every run, A and B, must decode exactly N tokens (else the
ratio compares different work). Exit status 1 when the target is missed or a run decoded
another number of tokens. One warm-up of each is not counted.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import threading
import time

from ondevice.tui.app import ChatApp
from ondevice.tui.session import ChatSettings

import ondevice
from benchmarks.common import add_threads_arg, print_json
from ondevice.engine.chat import ChatTemplate

MESSAGE = "Write a long, detailed story about a lighthouse keeper and a storm."
TARGET = 0.97


def run_engine_alone(engine, tokens: int) -> dict:
    """In a worker thread, as the TUI decodes: with llama.cpp's OpenMP build, decoding from
    the main thread of a busy machine can be several times slower (libgomp's active waiting),
    which would flatter the TUI."""
    out: list = []
    worker = threading.Thread(target=lambda: out.append(_engine_alone(engine, tokens)))
    worker.start()
    worker.join()
    if not out:
        raise SystemExit("the engine-alone run failed")
    return out[0]


def _engine_alone(engine, tokens: int) -> dict:
    chat = engine.chat()
    ids = chat.prompt_tokens(MESSAGE)
    engine.reset()
    stream = engine.stream(ids, max_tokens=tokens, temperature=0.0, top_p=1.0, ignore_eos=True, reuse_prefix=False)
    for _ in stream:
        pass
    return _row(stream.generation)


async def _run_tui(engine, tokens: int) -> dict:
    engine.reset()
    settings = ChatSettings(temperature=0.0, top_p=1.0, max_tokens=tokens)
    app = ChatApp(
        lambda: engine, settings=settings, store=None, model_label="bench", extra_sampling={"ignore_eos": True}
    )
    async with app.run_test(size=(120, 40)) as pilot:
        while app.controller.session is None:
            if app.controller.load_error:
                raise SystemExit(f"load failed: {app.controller.load_error}")
            await asyncio.sleep(0.01)
        prompt = app.chat_screen.query_one("#prompt")
        prompt.value = MESSAGE
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        # What Enter does. Pilot.press would go on to poll the screen every 20 ms until it
        # is idle (about 2 s here): a cost of the test harness, which a user never pays.
        await prompt.action_submit()
        while (
            not app.controller.turns or app.controller.generating
        ):  # rare plain sleeps: Pilot.pause() would force screen updates
            await asyncio.sleep(0.5)
        ui_share = (time.thread_time() - cpu0) / (time.perf_counter() - wall0)
        await pilot.pause(0.05)
        turn = app.controller.turns[0]
        shown = len(turn.assistant.text)
        g = turn.tracker.final
    row = _row(g)
    row["chars_shown"] = shown
    row["ui_cpu_share"] = ui_share  # UI (event loop) thread CPU seconds per wall second
    return row


def run_tui(engine, tokens: int) -> dict:
    return asyncio.run(_run_tui(engine, tokens))


def _bracket(before: dict, after: dict) -> dict:
    """The engine-alone figures around one TUI run: their means."""
    return {k: (before[k] + after[k]) / 2 if k in ("decode_tok_s", "ttft_s") else after[k] for k in after}


def median_interval(ratios: list[float], level: float = 0.9, draws: int = 2000) -> tuple[float, float]:
    """Bootstrap interval of the median ratio: how far the noise alone could move it."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(draws))
    tail = (1 - level) / 2
    return medians[int(tail * draws)], medians[min(draws - 1, int((1 - tail) * draws))]


def _row(g) -> dict:
    t = g.timings
    return {
        "decode_tok_s": t.decode_tok_s,
        "ttft_s": t.ttft_s,
        "tokens": t.output_tokens,
        "finish": g.finish_reason,
        "prompt_tokens": g.prompt_tokens,
        "cached": g.cached_prompt_tokens,
        "chars": len(g.text),
    }


def summarize_runs(engine, args, pairs: list, engine_runs: list) -> dict:
    """The figures, the checks and every run."""
    ratios = [b["decode_tok_s"] / a["decode_tok_s"] for a, b in pairs]
    token_counts = sorted({r["tokens"] for r in engine_runs} | {b["tokens"] for _, b in pairs})
    return {
        "model": engine.info.spec.name,
        "backend": engine.info.backend,
        "threads": engine.info.n_threads,
        "tokens": args.tokens,
        "pairs": len(pairs),
        "engine_decode_tok_s_median": statistics.median(a["decode_tok_s"] for a, _ in pairs),
        "tui_decode_tok_s_median": statistics.median(b["decode_tok_s"] for _, b in pairs),
        "engine_ttft_s_median": statistics.median(a["ttft_s"] for a, _ in pairs),
        "tui_ttft_s_median": statistics.median(b["ttft_s"] for _, b in pairs),
        "ui_cpu_share_median": statistics.median(b["ui_cpu_share"] for _, b in pairs),
        "ratio_median": statistics.median(ratios),
        "ratio_median_90pct": median_interval(ratios),
        "ratio_min": min(ratios),
        "target": TARGET,
        "token_counts": token_counts,  # output tokens of every run, both sides: [N] when all decoded N
        "same_tokens": token_counts == [args.tokens],
        "pass": statistics.median(ratios) >= TARGET and token_counts == [args.tokens],
        "runs": [{"engine": a, "tui": b, "ratio": r} for (a, b), r in zip(pairs, ratios)],
        "engine_runs": engine_runs,  # A runs in order (each "engine" above is the mean of two)
    }


def render(summary: dict, args) -> None:
    print(
        f"model {summary['model']} · {summary['backend']} · {summary['threads']} threads · {args.tokens} tokens, greedy"
    )
    print(
        f"{'pair':>4}  {'engine tok/s':>12}  {'TUI tok/s':>10}  {'ratio':>6}  {'tokens A/B':>10}  {'TTFT A/B ms':>13}"
    )
    for n, run in enumerate(summary["runs"], 1):
        a, b, r = run["engine"], run["tui"], run["ratio"]
        print(
            f"{n:>4}  {a['decode_tok_s']:>12.1f}  {b['decode_tok_s']:>10.1f}  {r:>6.3f}  "
            f"{a['tokens']:>4}/{b['tokens']:<5}  {a['ttft_s'] * 1e3:>6.1f}/{b['ttft_s'] * 1e3:<6.1f}"
        )
    verdict = "PASS" if summary["pass"] else "FAIL"
    lo, hi = summary["ratio_median_90pct"]
    print(
        f"median ratio TUI/engine {summary['ratio_median']:.3f} (90% bootstrap interval {lo:.3f}-{hi:.3f}; "
        f"min {summary['ratio_min']:.3f}); target >= {TARGET}; every run decoded {args.tokens} tokens: "
        f"{'yes' if summary['same_tokens'] else 'NO, ' + str(summary['token_counts'])} -> {verdict}"
    )
    print(
        f"median decode tok/s: engine {summary['engine_decode_tok_s_median']:.1f}, TUI {summary['tui_decode_tok_s_median']:.1f}; "
        f"UI thread CPU {summary['ui_cpu_share_median'] * 100:.1f}% of a core while streaming"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=11)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--model", default=None, help="model ref (default: the built-in model)")
    add_threads_arg(ap)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    ChatTemplate.stop = property(lambda self: ())  # no stop strings in the chat either: N tokens on both sides
    engine = ondevice.load(args.model, n_ctx=2048, n_threads=args.threads)
    try:
        run_engine_alone(engine, args.tokens), run_tui(engine, args.tokens)  # warm-up, not counted
        # A B A B ... B A: each TUI run is held against the mean of the engine runs on either
        # side of it, so a steady drift of the machine's speed cancels out.
        engine_runs = [run_engine_alone(engine, args.tokens)]
        pairs = []
        for _ in range(args.pairs):
            b = run_tui(engine, args.tokens)
            engine_runs.append(run_engine_alone(engine, args.tokens))
            pairs.append((_bracket(engine_runs[-2], engine_runs[-1]), b))
    finally:
        engine.close()

    summary = summarize_runs(engine, args, pairs, engine_runs)
    if args.json:
        print_json(summary)
        print()
    else:
        render(summary, args)
    return 0 if summary["pass"] else 1


if __name__ == "__main__":
    sys.exit(main())
