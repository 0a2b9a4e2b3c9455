"""The bench's `speculative` scenario: prompt-lookup decoding against plain decoding of the same prompt.

Each measured run is a pair, interleaved: the workload's prompt decoded plainly and with
speculative="lookup" (same seed, the KV cache cleared before each, the order swapped on odd
repeats so drift hits both alike). The speculative request is the run kept; its record holds
the SpecStats and the paired plain run's decode rate, so the speedup is measured pair by pair.
Its own columns: exact or k for speed, acceptance, accepted and drafted tokens per verify step, k,
committed tok/s against plain, measured and predicted speedup (the engine's plan, and the figure
from the k of each step and the acceptance measured), token agreement with the paired plain run
(the share of output positions where both chose the same token: 100% when exact), and the ITL
spread (tokens of one verify step arrive together: ITL p50 near 0 is that burst, not an error).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from statistics import median
from typing import Any

from ondevice.bench.runs import SPECULATIVE, RunRecord
from ondevice.core.fmt import number, table
from ondevice.core.metrics import percentile

__all__ = ["speculative_run", "spec_summary", "spec_rows", "SPEC_HEADERS", "spec_table", "token_agreement"]

SPEC_HEADERS = (
    "model",
    "workload",
    "pairs",
    "exact",
    "agree",
    "accept",
    "acc/step",
    "drafts/step",
    "k cap",
    "plain tok/s",
    "spec tok/s",
    "speedup p50",
    "predicted",
    "pred (k,a)",
    "ITL p50/p95 ms",
)


def token_agreement(spec_ids: Sequence[int], plain_ids: Sequence[int]) -> tuple[int, int]:
    """(positions where both outputs hold the same token, positions compared): every position of the
    longer output counts, so one that stops early disagrees at each position it lacks."""
    n = max(len(spec_ids), len(plain_ids))
    return sum(1 for a, b in zip(spec_ids, plain_ids) if a == b), n


def speculative_run(
    ctx: Any, workload: str, ids: Sequence[int], n_out: int, seed: int, exact: bool | None = None
) -> RunRecord:
    """One pair: plain and prompt-lookup decoding of `ids` (the order alternates with the repeat).
    exact: stream()'s exact (None: the engine's default)."""
    from ondevice.bench import scenarios as sc

    ctx.rss.reset()
    order = ("plain", "lookup") if ctx.repeat % 2 == 0 else ("lookup", "plain")
    outs = {}
    for mode in order:
        extra: dict[str, Any] = {"speculative": "lookup"} if mode == "lookup" else {}
        if mode == "lookup" and exact is not None:
            extra["exact"] = exact
        outs[mode] = sc.request(ctx, ids, n_out, seed, reuse_prefix=False, **extra)
    plain, spec = outs["plain"], outs["lookup"]
    rec = sc.record(ctx, SPECULATIVE, workload, n_out, seed, spec, prompt_tokens=len(ids))
    g = spec.generation
    stats = dict(g.speculative.to_dict()) if g is not None and g.speculative is not None else {}
    pg = plain.generation if plain.status == "ok" else None
    stats["plain_decode_tok_s"] = pg.timings.decode_tok_s if pg is not None else None
    stats["plain_status"] = plain.status
    if pg is not None and spec.status == "ok" and g is not None:
        same, compared = token_agreement(g.token_ids, pg.token_ids)
        stats.update(agree_tokens=same, compared_tokens=compared, agreement=same / compared if compared else None)
    rec = replace(rec, speculative=stats)
    if plain.status != "ok":
        rec = replace(rec, notes=rec.notes + (f"plain run {plain.status}: {plain.reason}",))
    return rec


def spec_summary(runs: Sequence[RunRecord]) -> dict[str, Any] | None:
    """The speculative columns of one cell, from its ok runs: acceptance and per-step counts pooled
    over the runs, speedups as medians of the pairs."""
    ok = [(r.timings, r.speculative) for r in runs if r.ok and r.speculative]  # (Timings, SpecStats dict)
    if not ok:
        return None
    keys = ("drafted", "accepted", "steps", "plain_steps", "agree_tokens", "compared_tokens")
    tot = {k: sum(st.get(k) or 0 for _, st in ok) for k in keys}
    pairs = [(t.decode_tok_s, st.get("plain_decode_tok_s")) for t, st in ok if t]
    speedups = [s / p for s, p in pairs if s and p]
    predicted = [st["predicted_speedup"] for _, st in ok if st.get("predicted_speedup")]
    at_acceptance = [st["speedup_at_acceptance"] for _, st in ok if st.get("speedup_at_acceptance")]
    exact = {st.get("exact") for _, st in ok}
    itl = sorted(x for t, _ in ok if t for x in t.itl_s)
    plain = [p for _, p in pairs if p]
    plain_tpot = 1.0 / median(plain) if plain else None
    return {
        "pairs": len(ok),
        "exact": exact.pop() if len(exact) == 1 else None,  # None: runs of both kinds (or an older record)
        # output positions where speculative and plain chose the same token, pooled over the pairs
        "agreement": tot["agree_tokens"] / tot["compared_tokens"] if tot["compared_tokens"] else None,
        "acceptance": tot["accepted"] / tot["drafted"] if tot["drafted"] else None,
        "mean_accepted_per_step": tot["accepted"] / tot["steps"] if tot["steps"] else None,
        "drafts_per_step": tot["drafted"] / tot["steps"] if tot["steps"] else None,
        "verify_steps": tot["steps"],
        "plain_steps": tot["plain_steps"],
        "k_cap": max(st.get("k_cap") or 0 for _, st in ok),
        "plain_decode_tok_s": median(plain) if plain else None,
        "spec_decode_tok_s": median(s for s, _ in pairs if s) if any(s for s, _ in pairs) else None,
        "speedup_p50": median(speedups) if speedups else None,
        "predicted_speedup_p50": median(predicted) if predicted else None,
        "speedup_at_acceptance_p50": median(at_acceptance) if at_acceptance else None,
        "itl_p50_s": percentile(itl, 50) if itl else None,
        "itl_p95_s": percentile(itl, 95) if itl else None,
        # gaps under a quarter of a plain step: tokens that arrived in a verify step's burst
        "burst_share": sum(1 for x in itl if x < 0.25 * plain_tpot) / len(itl) if itl and plain_tpot else None,
    }


def _x(v: float | None) -> str:
    return f"{v:.2f}x" if v else "-"


def _pct(v: float | None) -> str:
    """A share as a percentage; one decimal near 100% (99.9% is not 100%)."""
    if v is None:
        return "-"
    return f"{100 * v:.1f}%" if 0.99 <= v < 1.0 else f"{100 * v:.0f}%"


def spec_rows(results: Sequence[Any]) -> list[list[str]]:
    rows = []
    for r in results:
        s = r.speculative
        if r.scenario != SPECULATIVE or not s:
            continue
        ms = lambda v: number(v * 1000 if v is not None else None, ".1f")  # noqa: E731 - one format, used for every column
        rows.append(
            [
                r.model,
                r.workload,
                str(s["pairs"]),
                {True: "yes", False: "no"}.get(s.get("exact"), "-"),
                _pct(s.get("agreement")),
                _pct(s["acceptance"]),
                number(s["mean_accepted_per_step"], ".2f"),
                number(s["drafts_per_step"], ".2f"),
                str(s["k_cap"]),
                number(s["plain_decode_tok_s"], ".1f"),
                number(s["spec_decode_tok_s"], ".1f"),
                _x(s["speedup_p50"]),
                _x(s["predicted_speedup_p50"]),
                _x(s.get("speedup_at_acceptance_p50")),
                f"{ms(s['itl_p50_s'])}/{ms(s['itl_p95_s'])}",
            ]
        )
    return rows


def spec_table(results: Sequence[Any], width: int | None = None) -> list[str]:
    """The speculative scenario's own table, as lines; [] when the bench did not run it."""
    rows = spec_rows(results)
    if not rows:
        return []
    align = "".join("l" if h in ("model", "workload") else "r" for h in SPEC_HEADERS)
    return [
        "",
        "speculative decoding (prompt lookup) against plain decoding of the same prompts, interleaved; "
        "agree: output positions where both chose the same token",
        table(list(SPEC_HEADERS), rows, align, width=width, full="--json/--csv/--md"),
    ]
