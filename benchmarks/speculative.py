"""Prompt-lookup speculative decoding against plain decoding, interleaved, on grounded and open prompts.

One engine (the default model unless --model), greedy, end-of-generation honoured. Every prompt
of benchmarks/data/speculative_prompts.json runs --repeats rounds: plain decoding and
speculative="lookup" of the same prompt, the KV cache cleared before each, the order rotated
each repeat so drift hits every side alike. A pair's speedup is committed tok/s (1 / TPOT: decode
wall time with drafting, verifying and rollback) over the plain run's; a prompt's is the median
of its pairs, a set's the median of its prompts. Also shown: acceptance (accepted / drafted),
accepted and drafted tokens per verify step, the engine's k cap, ITL p50/p95 (tokens of one
verify step arrive together) and the engine's predicted speedup (SpecStats.predicted_speedup).
The verify cost behind it is measured first: one decode of n tokens with logits at every
position (what a verify step needs) against one of 1 token, beside logits at the last position
only (what llama-bench's prompt figures measure).

Two speculative sides run beside plain decoding, the three interleaved: exact=True (k capped
where verify logits equal single-token decoding's bit for bit) and exact=False (k chosen for
speed); each with its token agreement with the plain run of the same repeat (the share of
output positions holding the same token) and the speedup predicted from the k of each verify
step and the acceptance measured (SpecStats.speedup_at_acceptance) beside the one the engine
planned before each step.

Checks per side (exit 1 when one fails): grounded median >= 2.0x, open median >= 0.95x,
predicted (k, acceptance) within 15% of measured per set; exact: every output token for token
the plain one.

With --chat each prompt is one user turn in the model's chat template (an instruct model answers it rather
than continuing it). A prompt whose plain or speculative runs all stopped before a second token has no decode
speed: it is listed as skipped, not counted.

    python -m benchmarks.speculative [--repeats 2] [--max-tokens 96] [--model REF] [--threads N] [--modes exact,fast]
                                     [--chat]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from benchmarks.common import StopCounter, add_model_arg, cpu_description

PROMPTS = Path(__file__).resolve().parent / "data" / "speculative_prompts.json"
GROUNDED_MIN, OPEN_MIN, PREDICTION_TOL = 2.0, 0.95, 0.15


def verify_costs(engine, sizes=(1, 2, 3, 4, 8, 16), reps: int = 5) -> dict[int, tuple[float, float]]:
    """n -> (decode of n tokens with logits at every position, ... at the last only), in single-token decodes.
    Diagnostic: reaches into the engine's llama.cpp handle."""
    from ondevice.llama.model import fill_batch

    h, lib = engine._h, engine._h.lib
    ids = engine.tokenize(json.loads(PROMPTS.read_text())["grounded"][0])
    engine.reset()
    batch = lib.llama_batch_init(max(len(ids), max(sizes)), 0, 1)
    try:
        fill_batch(batch, ids, 0, lambda i: i == len(ids) - 1)
        lib.llama_decode(h.ctx, batch)
        times: dict[tuple[int, bool], list[float]] = {}
        for _ in range(reps):
            for n in sizes:
                for every in (True, False):
                    lib.llama_memory_seq_rm(h.memory, 0, len(ids), -1)
                    fill_batch(batch, ids[:n], len(ids), (lambda i: True) if every else (lambda i, n=n: i == n - 1))
                    t0 = time.perf_counter()
                    lib.llama_decode(h.ctx, batch)
                    times.setdefault((n, every), []).append(time.perf_counter() - t0)
    finally:
        lib.llama_batch_free(batch)
        engine.reset()
    med = {key: statistics.median(v) for key, v in times.items()}
    return {n: (med[(n, True)] / med[(1, True)], med[(n, False)] / med[(1, False)]) for n in sizes}


MODES = {"exact": True, "fast": False}  # stream()'s exact for each speculative side of a run
MAX_TRIES = 6  # a round the process was stopped in is run again, this many times at most
rerun_rounds = [0, 0]  # rounds run again because the process was stopped; rounds kept although it was


def one_prompt(
    engine, prompt: str | list[int], repeats: int, max_tokens: int, modes: tuple[str, ...], stops: StopCounter
) -> dict[str, dict | None]:
    """Per speculative mode: its runs paired with the plain run of the same repeat (the order rotates). A round
    during which the process was stopped and continued is run again (its timings hold the pause)."""
    sides = ("plain",) + modes
    runs: dict[str, list] = {m: [] for m in sides}
    for r in range(repeats):
        for attempt in range(MAX_TRIES):
            before, got = stops.count, {}
            for mode in sides[r % len(sides) :] + sides[: r % len(sides)]:
                kw = {"speculative": "lookup", "exact": MODES[mode]} if mode != "plain" else {}
                got[mode] = engine.generate(prompt, max_tokens=max_tokens, temperature=0, reuse_prefix=False, **kw)
            if stops.count == before:
                break
            rerun_rounds[attempt == MAX_TRIES - 1] += 1
        for mode, g in got.items():
            runs[mode].append(g)
    return {m: _pairs(runs["plain"], runs[m]) for m in modes}


def _pairs(plains: list, specs: list) -> dict | None:
    """A prompt's figures for one side; None when no pair of runs decoded (each stopped at its first token)."""
    from ondevice.bench.speculative import token_agreement

    pairs = [
        (spec.timings.decode_tok_s / plain.timings.decode_tok_s, plain, spec)
        for plain, spec in zip(plains, specs)
        if plain.timings.decode_tok_s and spec.timings.decode_tok_s
    ]
    if not pairs:
        return None
    agree = [token_agreement(spec.token_ids, plain.token_ids) for plain, spec in zip(plains, specs)]
    s = [p[2].speculative for p in pairs]
    return {
        "speedup": statistics.median(p[0] for p in pairs),
        "predicted": statistics.median(x.predicted_speedup for x in s if x.predicted_speedup),
        "at_acceptance": statistics.median(x.speedup_at_acceptance for x in s if x.speedup_at_acceptance),
        "plain_tok_s": statistics.median(p[1].timings.decode_tok_s for p in pairs),
        "spec_tok_s": statistics.median(p[2].timings.decode_tok_s for p in pairs),
        "drafted": sum(x.drafted for x in s),
        "accepted": sum(x.accepted for x in s),
        "steps": sum(x.steps for x in s),
        "plain_steps": sum(x.plain_steps for x in s),
        "k_cap": s[0].k_cap,
        "itl": [v for p in pairs for v in p[2].timings.itl_s],
        "tokens": len(pairs[0][2].token_ids),
        "same": sum(a for a, _ in agree),
        "compared": sum(n for _, n in agree),
    }


def _pct(xs: list[float], q: float) -> float:
    from ondevice.core.metrics import percentile

    return percentile(sorted(xs), q)


def report_set(name: str, all_rows: list[dict | None]) -> dict:
    print(f"\n{name} prompts")
    skipped = [i for i, r in enumerate(all_rows) if r is None]
    if skipped:
        print(f"skipped (stopped before a second token, no decode speed): prompt {', '.join(map(str, skipped))}")
    rows = [r for r in all_rows if r is not None]
    print(
        f"{'#':>2}  {'tokens':>6}  {'plain tok/s':>11}  {'spec tok/s':>10}  {'speedup':>7}  {'pred (k,a)':>10}  "
        f"{'planned':>7}  {'accept':>6}  {'acc/step':>8}  {'drafts/step':>11}  {'verify/plain steps':>18}  agree"
    )
    for i, r in enumerate(all_rows):
        if r is None:
            continue
        acc = f"{100 * r['accepted'] / r['drafted']:.0f}%" if r["drafted"] else "-"
        per = f"{r['accepted'] / r['steps']:.2f}" if r["steps"] else "-"
        dps = f"{r['drafted'] / r['steps']:.2f}" if r["steps"] else "-"
        print(
            f"{i:>2}  {r['tokens']:>6}  {r['plain_tok_s']:>11.1f}  {r['spec_tok_s']:>10.1f}  {r['speedup']:>6.2f}x  "
            f"{r['at_acceptance']:>9.2f}x  {r['predicted']:>6.2f}x  {acc:>6}  {per:>8}  {dps:>11}  "
            f"{r['steps']:>8}/{r['plain_steps']:<9}  {100 * r['same'] / r['compared']:.1f}%"
        )
    measured = statistics.median(r["speedup"] for r in rows)
    predicted = statistics.median(r["at_acceptance"] for r in rows)
    planned = statistics.median(r["predicted"] for r in rows)
    drafted, accepted = sum(r["drafted"] for r in rows), sum(r["accepted"] for r in rows)
    same, compared = sum(r["same"] for r in rows), sum(r["compared"] for r in rows)
    itl = [v for r in rows for v in r["itl"]]
    print(
        f"{name}: median speedup {measured:.2f}x, predicted from k and acceptance {predicted:.2f}x "
        f"(predicted/measured {predicted / measured:.2f}; planned before each step {planned:.2f}x); "
        f"acceptance {100 * accepted / drafted if drafted else 0:.0f}% of {drafted} drafted; k cap {rows[0]['k_cap']}; "
        f"agreement with plain {100 * same / compared:.1f}% of {compared} tokens; "
        f"speculative ITL p50 {1e3 * _pct(itl, 50):.1f} ms, p95 {1e3 * _pct(itl, 95):.1f} ms"
    )
    plain = statistics.median(r["plain_tok_s"] for r in rows)
    spec = statistics.median(r["spec_tok_s"] for r in rows)
    return {"measured": measured, "predicted": predicted, "agreement": same / compared, "plain": plain, "spec": spec}


def summary_table(results: dict[str, dict[str, dict]]) -> list[str]:
    """mode -> set -> report_set's figures, as one Markdown table: each side against plain decoding."""
    lines = [
        "| side | prompts | plain tok/s | spec tok/s | speedup (median) | predicted (k, a) | agreement with plain |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for mode, sets in results.items():
        for name, r in sets.items():
            lines.append(
                f"| {mode} (exact={MODES[mode]}) | {name} | {r['plain']:.1f} | {r['spec']:.1f} | {r['measured']:.2f}x "
                f"| {r['predicted']:.2f}x | {100 * r['agreement']:.1f}% |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_arg(ap)
    ap.add_argument("--repeats", type=int, default=2, help="interleaved plain/lookup pairs per prompt")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--modes", default="exact,fast", help="speculative sides: exact (exact=True), fast (exact=False)")
    ap.add_argument("--chat", action="store_true", help="each prompt as one user turn in the model's chat template")
    args = ap.parse_args(argv)
    if args.repeats < 1 or args.max_tokens < 2:
        ap.error("--repeats must be at least 1 and --max-tokens at least 2")
    modes = tuple(m.strip() for m in args.modes.split(",") if m.strip())
    if not modes or set(modes) - set(MODES):
        ap.error(f"--modes takes a comma-separated subset of {', '.join(MODES)}")
    from ondevice.api import load

    prompts = json.loads(PROMPTS.read_text())
    stops = StopCounter()
    eng = load(args.model, n_ctx=2048, n_threads=args.threads)  # with this machine's predictor, as `ondevice run`
    try:
        costs = verify_costs(eng)
        tss = getattr(eng.predictor, "tokens_step_s", None)
        predicted_costs = {n: tss(256, n) / tss(256, 1) for n in costs} if tss else {}
        for m in modes:  # warm-up, and the batch check exact=True needs
            eng.generate(prompts["open"][0], max_tokens=8, temperature=0, speculative="lookup", exact=MODES[m])
        if args.chat:
            from ondevice.engine.chat import Chat

            prompts = {name: [Chat(eng).prompt_tokens(p) for p in prompts[name]] for name in ("grounded", "open")}
        rows = {
            name: [one_prompt(eng, p, args.repeats, args.max_tokens, modes, stops) for p in prompts[name]]
            for name in ("grounded", "open")
        }
    finally:
        eng.close()
    i = eng.info
    print(cpu_description())
    print(
        f"speculative decoding (prompt lookup): {i.spec.name} on {i.backend}, {i.n_threads} threads, CPU buffers "
        f"{i.cpu_buffers}, greedy, {args.repeats} interleaved pairs per prompt, up to {args.max_tokens} tokens"
        + (", each prompt a user turn in the model's chat template" if args.chat else "")
    )
    print(
        "verify cost measured, one decode of n tokens (logits at every position) / one of 1 token: "
        + ", ".join(f"n={n}: {every:.2f} (logits at the last only {last:.2f})" for n, (every, last) in costs.items())
    )
    if predicted_costs:
        print(
            "verify cost predicted (Predictor.tokens_step_s at 256 tokens of context): "
            + ", ".join(f"n={n}: {r:.2f}" for n, r in predicted_costs.items())
        )
    checks, summary = [], {}
    for m in modes:
        print(f"\n=== {m} (exact={MODES[m]}) ===")
        res = summary[m] = {name: report_set(f"{m} {name}", [r[m] for r in rs]) for name, rs in rows.items()}
        checks += [
            (f"{m}: grounded median >= {GROUNDED_MIN}x", res["grounded"]["measured"] >= GROUNDED_MIN),
            (f"{m}: open median >= {OPEN_MIN}x", res["open"]["measured"] >= OPEN_MIN),
        ] + [
            (
                f"{m} {name}: predicted (k, acceptance) within {PREDICTION_TOL:.0%} of measured",
                abs(r["predicted"] / r["measured"] - 1) <= PREDICTION_TOL,
            )
            for name, r in res.items()
        ]
        if MODES[m]:
            checks.append((f"{m}: output identical to plain decoding", all(r["agreement"] == 1 for r in res.values())))
    print(
        f"rounds run again because the process was stopped (SIGSTOP/SIGCONT) during them: {rerun_rounds[0]}; "
        f"kept although stopped after {MAX_TRIES} tries: {rerun_rounds[1]}"
    )
    print("\nsummary: median over the prompts of each set (a prompt's figure: the median of its pairs)")
    print("\n".join(summary_table(summary)))
    print()
    for label, ok in checks:
        print(f"{'met    ' if ok else 'NOT met'}  {label}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
