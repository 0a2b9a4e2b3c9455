"""What `bench --url` adds to the shared reports: per level, the load figures (achieved rate,
requests in flight against λ·W, goodput, aggregate output rate) beside the latency columns that
only server runs have (first visible token, ITL per chunk), and the record's target section.

The latency table itself, the JSON/CSV/Markdown files and `bench compare` are the local
bench's (ondevice.bench.report, compare); this module only supplies the extra rows and facts.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ondevice.bench.record import build_record
from ondevice.bench.serve.load import LevelStats, level_stats
from ondevice.bench.stats import ScenarioResult

__all__ = ["level_table", "LOAD_HEADERS", "load_rows", "serve_record"]

LOAD_HEADERS = (
    "model",
    "level",
    "workload",
    "sent/ok",
    "req/s",
    "L in flight",
    "λ·W",
    "L/λW",
    "goodput req/s",
    "out tok/s",
    "TTFT p50/p95 ms",
    "visible p50 ms",
    "ITL tok/chunk p50 ms",
    "E2E p50/p95 ms",
    "tokens",
)


def level_table(serve: Any, results: Sequence[ScenarioResult], slo: dict | None = None) -> dict[tuple, LevelStats]:
    """(model, scenario, workload) -> LevelStats for every server level of the results."""
    out = {}
    for r in results:
        level = serve.levels.get(r.scenario)
        if level is None or not any(x.serve for x in r.runs):
            continue
        s = (slo or {}).get((r.model, r.scenario, r.workload))
        out[(r.model, r.scenario, r.workload)] = level_stats(
            list(r.runs),
            mode=level.mode,
            offered=level.offered,
            requests=r.repeats,
            good=s.good if s is not None else None,
        )
    return out


def _ms(v: float | None) -> str:
    return "-" if v is None or not math.isfinite(v) else f"{v * 1e3:.1f}" if v < 10 else f"{v * 1e3:.0f}"


def _num(v: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if v is None or not math.isfinite(v) else fmt.format(v)


def _sources(r: ScenarioResult) -> str:
    counts = (x.serve.get("token_count") for x in r.runs if x.serve)
    found = sorted({c for c in counts if isinstance(c, str) and c != "none"})
    return ", ".join(found) or "-"


def load_rows(results: Sequence[ScenarioResult], load: dict[tuple, LevelStats]) -> list[list[str]]:
    rows = []
    for r in results:
        s = load.get((r.model, r.scenario, r.workload))
        if s is None:
            continue
        ttft, e2e = r.summary("ttft_s"), r.summary("e2e_s")
        rate = _num(s.achieved_rps) + (f" (arr {_num(s.arrival_rps)})" if s.arrival_rps is not None else "")
        rows.append(
            [
                r.model,
                r.scenario,
                r.workload,
                f"{s.sent}/{s.ok}",
                rate,
                _num(s.mean_in_flight),
                _num(s.little_lw),
                _num(s.little_ratio, "{:.3f}"),
                _num(s.goodput_rps),
                _num(s.output_tok_s, "{:.1f}"),
                f"{_ms(ttft.p50)}/{_ms(ttft.p95)}",
                _ms(r.summary("ttft_visible_s").p50),
                f"{_ms(r.summary('itl_s').p50)}/{_ms(r.summary('itl_chunk_s').p50)}",
                f"{_ms(e2e.p50)}/{_ms(e2e.p95)}",
                _sources(r),
            ]
        )
    return rows


def serve_record(serve: Any, *, argv: Sequence[str] | None = None, digests: dict | None = None) -> dict[str, Any]:
    """The local bench's record, plus what was measured and how: the target (never the API key),
    the load settings, and the conventions of the client-side figures."""
    rec = build_record(serve.outcome, argv=argv, digests=digests)
    rec["target"] = dict(serve.target)
    rec["settings"]["load"] = {
        "levels": [{"name": x.name, "mode": x.mode, "offered": x.offered} for x in serve.levels.values()],
        "requests_per_level": serve.config.requests,
        "duration_s_per_level": serve.config.duration_s,
        "arrivals": "open loop: Poisson (first at once, then exponential gaps of mean 1/rate, seeded)",
    }
    rec["settings"]["timing"] = {
        "clock": "client side, perf_counter: a request starts when the client opens the connection to send it",
        "ttft": "first chunk carrying output text (reasoning included); visible: first text outside reasoning",
        "itl_s": "per token: a chunk's k tokens spread evenly over the gap since the previous chunk",
        "itl_chunk_s": "per chunk: gaps between chunks carrying text",
        "tpot": "(E2E - TTFT) / (T - 1), E2E at the last chunk carrying text",
        "tokens": "server usage, else the server's timings, else --tokenizer, else 1 per chunk (estimated)",
    }
    return rec
