"""The bench's `restore` scenario: a conversation resumed from its KV state on disk, against recomputing it and
against the in-memory prefix hit, each beside its prediction.

One run of a workload of P prompt tokens: a history of P - s tokens and a new turn of s (s as the prefix-hit
scenario's suffix). The history is prefilled (one output token, nothing cached) and its state saved with
Engine.save_state; then, all with the same prompt (history + turn) and the same seed:

- hit: the turn with the history still in memory (prefix reuse), the fastest a resume can be;
- restore: the cache emptied, the state file dropped from the page cache (so it is read from the disk), then
  Engine.load_state and the request with prefix reuse; its TTFT is load_state's time plus the request's;
- recompute: the whole prompt prefilled (reuse_prefix=False), what a resume without a state costs.

Restore and recompute alternate their order with the repeat, so drift hits both alike. The restore request is
the run kept (its timings with the load_state time added to TTFT and E2E); its `restore` dict holds the three
TTFTs and the predictions: restore = state bytes / the probe's disk read + the turn's prefill after the
history; recompute = the prefill of the whole prompt; hit = the turn's prefill. `choice` is what the chat would
pick from those figures (ondevice.engine.state.choose_resume: restore when its read is predicted below the
history's recompute), `faster` what was measured, so the table shows whether the prediction picks the faster.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from statistics import median
from typing import Any

from ondevice.bench.runs import RESTORE, RunRecord
from ondevice.core.fmt import ms_cell, number, table
from ondevice.core.pagecache import evict_page_cache
from ondevice.engine.state import choose_resume

__all__ = ["restore_run", "restore_predictions", "restore_summary", "restore_rows", "RESTORE_HEADERS", "restore_table"]

RESTORE_HEADERS = (
    "model",
    "workload",
    "history",
    "turn",
    "runs",
    "state MB",
    "restore ms",
    "restore pred",
    "hit ms",
    "hit pred",
    "recompute ms",
    "recompute pred",
    "restore/hit",
    "predicted choice",
    "measured faster",
    "right",
)


def restore_predictions(
    predictor: Any, n_prompt: int, n_history: int, state_bytes: int, disk_read_gbs: float | None
) -> dict[str, Any]:
    """Predicted TTFTs (seconds, None where a figure is missing) and the choice the chat would make."""
    hit = _ttft(predictor, n_prompt, n_history)
    recompute = _ttft(predictor, n_prompt, 0)
    read = state_bytes / (disk_read_gbs * 1e9) if disk_read_gbs and disk_read_gbs > 0 else None
    history = recompute - hit if recompute is not None and hit is not None else None
    choice = choose_resume(state_bytes, disk_read_gbs, history)
    return {
        # both sides predicted: the choice is a prediction (else choose_resume's fallback, restore, unjudged)
        "choice_predicted": read is not None and history is not None,
        "predicted_read_s": read,
        "predicted_restore_s": read + hit if read is not None and hit is not None else None,
        "predicted_hit_s": hit,
        "predicted_recompute_s": recompute,
        "choice": "restore" if choice.restore else "recompute",
        "choice_text": choice.text(),
    }


def _ttft(predictor: Any, n_prompt: int, n_cached: int) -> float | None:
    fn = getattr(predictor, "ttft_s", None)
    if not callable(fn):
        return None
    try:
        value = float(fn(n_prompt, n_cached))
    except Exception:  # a predictor that cannot answer leaves the figure empty
        return None
    return value if math.isfinite(value) and value >= 0 else None


def restore_run(
    ctx: Any,
    workload: str,
    history: Sequence[int],
    turn: Sequence[int],
    n_out: int,
    seed: int,
    *,
    state_path: Path,
    predictor: Any = None,
    disk_read_gbs: float | None = None,
) -> RunRecord:
    """One run (module docstring): save the history's state to state_path, then hit, restore and recompute."""
    from ondevice.bench import scenarios as sc

    ctx.rss.reset()
    ids = list(history) + list(turn)
    prime = sc.request(ctx, history, 1, seed, reuse_prefix=False)
    if prime.status != "ok":
        return sc.record(ctx, RESTORE, workload, n_out, seed, prime, prompt_tokens=len(ids))
    state_bytes = ctx.engine.save_state(state_path)
    hit = sc.request(ctx, ids, n_out, seed, reuse_prefix=True)
    order = ("restore", "recompute") if ctx.repeat % 2 == 0 else ("recompute", "restore")
    outs: dict[str, Any] = {}
    for side in order:
        if side == "recompute":
            outs[side] = sc.request(ctx, ids, n_out, seed, reuse_prefix=False)
        else:
            outs[side] = _restored_request(ctx, ids, n_out, seed, state_path)
    restored, load_s, eviction = outs["restore"]
    rec = sc.record(ctx, RESTORE, workload, n_out, seed, restored, prompt_tokens=len(ids))
    if restored.status == "ok" and rec.timings is not None:
        t = rec.timings
        rec = replace(rec, timings=replace(t, ttft_s=t.ttft_s + load_s, e2e_s=t.e2e_s + load_s))
    figures = {
        "history_tokens": len(history),
        "turn_tokens": len(turn),
        "state_bytes": state_bytes,
        "load_state_s": load_s,
        "restore_ttft_s": rec.timings.ttft_s if restored.status == "ok" and rec.timings else None,
        "hit_ttft_s": _ttft_of(hit),
        "recompute_ttft_s": _ttft_of(outs["recompute"]),
        "hit_cached_tokens": hit.generation.cached_prompt_tokens if hit.generation else None,
        "disk_read_gbs": disk_read_gbs,
        "page_cache_dropped": eviction.evicted,
        **restore_predictions(predictor, len(ids), len(history), state_bytes, disk_read_gbs),
    }
    r, c = figures["restore_ttft_s"], figures["recompute_ttft_s"]
    figures["faster"] = None if r is None or c is None else ("restore" if r < c else "recompute")
    notes = [n for n in (eviction.note,) if n]
    for side, out in (("hit", hit), ("recompute", outs["recompute"])):
        if out.status != "ok":
            notes.append(f"{side} run {out.status}: {out.reason}")
    if restored.status == "ok" and rec.cached_prompt_tokens < len(history):
        notes.append(f"only {rec.cached_prompt_tokens} of {len(history)} history tokens came from the state")
    return replace(rec, restore=figures, notes=rec.notes + tuple(notes))


def _ttft_of(out: Any) -> float | None:
    g = out.generation
    return g.timings.ttft_s if out.status == "ok" and g is not None else None


def _restored_request(ctx: Any, ids: list[int], n_out: int, seed: int, state_path: Path) -> tuple[Any, float, Any]:
    """Empty the cache, drop the state file from the page cache, restore it and run the request;
    (outcome, load_state seconds, the eviction)."""
    from ondevice.bench import scenarios as sc

    ctx.engine.reset()
    eviction = evict_page_cache(state_path)
    t0 = time.perf_counter()
    ctx.engine.load_state(state_path, prompt=ids)
    load_s = time.perf_counter() - t0
    return sc.request(ctx, ids, n_out, seed, reuse_prefix=True), load_s, eviction


def remove_state(path: Path) -> None:
    """Remove a state file the scenario wrote; never raises."""
    try:
        os.unlink(path)
    except OSError:
        pass


def restore_summary(runs: Sequence[RunRecord]) -> dict[str, Any] | None:
    """The restore columns of one cell from its ok runs: medians of the TTFTs and predictions, and how often the
    predicted choice was the faster side."""
    ok = [r.restore for r in runs if r.ok and r.restore]
    if not ok:
        return None

    def med(key: str) -> float | None:
        values = [x[key] for x in ok if x.get(key) is not None]
        return median(values) if values else None

    judged = [x for x in ok if x.get("faster") is not None and x.get("choice_predicted")]
    choices = {x.get("choice") if x.get("choice_predicted") else f"{x.get('choice')} (no prediction)" for x in ok}
    restore, hit = med("restore_ttft_s"), med("hit_ttft_s")
    return {
        "runs": len(ok),
        "history_tokens": ok[0]["history_tokens"],
        "turn_tokens": ok[0]["turn_tokens"],
        "state_bytes": med("state_bytes"),
        "load_state_s": med("load_state_s"),
        "restore_ttft_s": restore,
        "hit_ttft_s": hit,
        "recompute_ttft_s": med("recompute_ttft_s"),
        "predicted_read_s": med("predicted_read_s"),
        "predicted_restore_s": med("predicted_restore_s"),
        "predicted_hit_s": med("predicted_hit_s"),
        "predicted_recompute_s": med("predicted_recompute_s"),
        "disk_read_gbs": med("disk_read_gbs"),
        "restore_over_hit": restore / hit if restore and hit else None,
        "choice": choices.pop() if len(choices) == 1 else "mixed",
        "measured_runs": sum(1 for x in ok if x.get("faster") is not None),
        "restore_faster_runs": sum(1 for x in ok if x.get("faster") == "restore"),
        # runs whose choice was predicted (both figures known) and how many of them chose the faster side
        "choice_right_runs": sum(1 for x in judged if x["faster"] == x.get("choice")),
        "judged_runs": len(judged),
        "page_cache_dropped_runs": sum(1 for x in ok if x.get("page_cache_dropped")),
    }


def restore_rows(results: Sequence[Any]) -> list[list[str]]:
    rows = []
    for r in results:
        s = r.restore
        if r.scenario != RESTORE or not s:
            continue
        n, faster, measured_n = s["judged_runs"], s["restore_faster_runs"], s["measured_runs"]
        measured = f"restore {faster}/{measured_n}" if 0 < faster < measured_n else "restore" if faster else "recompute"
        rows.append(
            [
                r.model,
                r.workload,
                str(s["history_tokens"]),
                str(s["turn_tokens"]),
                f"{s['runs']}/{r.repeats}",
                number(s["state_bytes"] / 1e6 if s["state_bytes"] is not None else None, ".1f"),
                ms_cell(s["restore_ttft_s"]),
                ms_cell(s["predicted_restore_s"]),
                ms_cell(s["hit_ttft_s"]),
                ms_cell(s["predicted_hit_s"]),
                ms_cell(s["recompute_ttft_s"]),
                ms_cell(s["predicted_recompute_s"]),
                f"{s['restore_over_hit']:.2f}x" if s["restore_over_hit"] else "-",
                s["choice"],
                measured if measured_n else "-",
                f"{s['choice_right_runs']}/{n}" if n else "-",
            ]
        )
    return rows


def restore_table(results: Sequence[Any], width: int | None = None) -> list[str]:
    """The restore scenario's own table, as lines; [] when the bench did not run it."""
    rows = restore_rows(results)
    if not rows:
        return []
    text_columns = ("model", "workload", "predicted choice", "measured faster")
    align = "".join("l" if h in text_columns else "r" for h in RESTORE_HEADERS)
    disk = next((r.restore.get("disk_read_gbs") for r in results if r.scenario == RESTORE and r.restore), None)
    read = f"{disk:.2f} GB/s" if disk else "unknown (`ondevice probe` measures it)"
    return [
        "",
        f"restore: TTFT of a resumed conversation (history + new turn): its KV state read from disk (page cache "
        f"dropped), recomputed, or still in memory (hit); each beside its prediction (disk read {read}); "
        "predicted choice: restore when the read is predicted below the history's recompute",
        table(list(RESTORE_HEADERS), rows, align, width=width, full="--json/--csv/--md"),
    ]
