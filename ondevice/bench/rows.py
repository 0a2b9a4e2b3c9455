"""The rows the bench shows, shared by the terminal table and the Markdown report (ondevice.bench.report):
the main table's headers and cells, each cell's notes, the facts above the table, the cold-start notes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ondevice.bench.runs import COLD_START, LOAD, LOAD_SCENARIOS, NO_KV_CACHE, PREFIX_HIT
from ondevice.bench.stats import ScenarioResult
from ondevice.core.fmt import ms_cell, number

__all__ = ["HEADERS", "OTHER_CPU_SAID", "table_rows", "header_facts", "cold_notes"]


HEADERS = (
    "model",
    "scenario",
    "workload",
    "P",
    "N",
    "runs",
    "TTFT p50/p95 ms",
    "TTFT pred ms",
    "TTFT eff",
    "ITL p50/p95/p99 ms",
    "TPOT p50 ms",
    "decode tok/s",
    "prefill tok/s",
    "ceiling/pred tok/s",
    "eff",
    "E2E p50/pred s",
    "out tok/s",
    "notes",
)


OTHER_CPU_SAID = 0.1  # a cell's note says how much CPU other processes used from this many cores on


def _notes(r: ScenarioResult, slo: Any) -> str:
    parts = []
    if r.scenario in LOAD_SCENARIOS and r.ok_runs:
        s = r.summary("load_s")
        parts.append(f"load p50 {s.p50:.3f} s, p95 {s.p95:.3f} s")
        if "load_call_s" in r.summaries:
            parts.append(f"the whole load call p50 {r.summary('load_call_s').p50:.3f} s")
        resident = [x.resident_before_load for x in r.runs if x.resident_before_load is not None]
        if resident:
            parts.append(f"{100 * max(resident):.0f}% cached at load")
    if r.scenario == PREFIX_HIT and r.ok_runs:
        parts.append(f"cached {r.cached_prompt_tokens:.0f} tok, TTFT saved {ms_cell(r.summary('ttft_saved_s').p50)} ms")
    if r.scenario == COLD_START and r.ok_runs:
        parts.append(
            f"page cache dropped -> load -> first token p50 {r.summary('cold_start_s').p50:.3f} s (cold-start table)"
        )
    if r.scenario == NO_KV_CACHE and r.kv_cache_speedup:
        parts.append(f"{r.kv_cache_speedup:.1f}x the resident ITL")
    if slo is not None:
        rate = f"{slo.goodput_rps:.3g} req/s" if slo.goodput_rps is not None else "- req/s"
        parts.append(
            f"SLO {'pass' if slo.passed else 'FAIL'}, goodput {rate} ({100 * slo.good_share:.0f}% of requests)"
        )
    if r.other_cpu_cores is not None and r.other_cpu_cores >= OTHER_CPU_SAID:
        parts.append(f"other processes used {r.other_cpu_cores:.1f} cores")
    if r.failures:
        reasons = sorted({f["reason"] for f in r.failures})
        parts.append(f"{len(r.failures)} not ok: {reasons[0]}" + (" ..." if len(reasons) > 1 else ""))
    parts += list(r.notes)
    return "; ".join(parts)


def _output_tok_s(r: ScenarioResult) -> float | None:
    """Median over the ok runs of output tokens / E2E (the output throughput, not decode tok/s)."""
    from statistics import median

    values = [
        x.timings.output_throughput_tok_s for x in r.runs if x.ok and x.timings and x.timings.output_throughput_tok_s
    ]
    return median(values) if values else None


def table_rows(results: Sequence[ScenarioResult], slo: dict | None = None) -> list[list[str]]:
    rows = []
    for r in results:
        ttft, itl, tpot = r.summary("ttft_s"), r.summary("itl_s"), r.summary("tpot_s")
        request = r.scenario not in LOAD_SCENARIOS + (LOAD,)
        roof = f"{number(r.ceiling_tok_s, '.0f')}/{number(r.predicted_tok_s, '.0f')}" if r.ceiling_tok_s else "-"
        rows.append(
            [
                r.model,
                r.scenario,
                r.workload or "-",
                str(r.prompt_tokens) if request else "-",
                str(r.output_tokens) if request else "-",
                f"{r.ok_runs}/{r.repeats}",
                f"{ms_cell(ttft.p50)}/{ms_cell(ttft.p95)}" if request else "-",
                ms_cell(r.predicted_ttft_s) if r.predicted_ttft_s else "-",
                number(r.ttft_efficiency, ".2f"),
                f"{ms_cell(itl.p50)}/{ms_cell(itl.p95)}/{ms_cell(itl.p99)}" if request else "-",
                ms_cell(tpot.p50) if request else "-",
                number(r.summary("decode_tok_s").p50) if request else "-",
                number(r.summary("prefill_tok_s").p50, ".0f") if request else "-",
                roof,
                number(r.efficiency, ".2f"),
                f"{number(r.summary('e2e_s').p50, '.2f')}/{number(r.predicted_e2e_s, '.2f')}" if request else "-",
                number(_output_tok_s(r)) if request else "-",
                _notes(r, (slo or {}).get((r.model, r.scenario, r.workload))),
            ]
        )
    return rows


def header_facts(record: dict[str, Any]) -> list[tuple[str, Any]]:
    host = record.get("host") or {}
    models = record.get("models") or []
    eng: dict[str, Any] = next((m.get("engine") for m in models if m.get("engine")), {}) or {}
    probe = record.get("probe") or {}
    target = record.get("target")
    facts = [
        ("started", record.get("started_at")),
        ("host", f"{host.get('cpu_model') or '?'}, {host.get('os') or '?'}"),
    ]
    if eng or not target:
        facts.append(
            (
                "engine",
                f"{eng.get('backend', '?')}, {eng.get('n_threads', '?')} threads, offload "
                f"{eng.get('n_gpu_layers', '?')}, "
                f"n_batch {eng.get('n_batch', '?')}/{eng.get('n_ubatch', '?')}, flash attention "
                f"{eng.get('flash_attn_used', eng.get('flash_attn', '?'))}, KV {eng.get('cache_type_k', 'f16')}/"
                f"{eng.get('cache_type_v', 'f16')}, CPU buffers {eng.get('cpu_buffers', '?')}",
            )
        )
    if target:
        facts.append(
            (
                "server",
                f"{target.get('endpoint')}, model {target.get('model') or '(not named)'}, tokenizer "
                f"{target.get('tokenizer') or 'none (tokens estimated unless the server reports them)'}",
            )
        )
    facts += [
        ("llama-cpp-python", (record.get("versions") or {}).get("llama_cpp_python")),
        (
            "probe",
            probe.get("note")
            or f"{probe.get('ceiling_gbs', 0):.1f} GB/s ceiling, {probe.get('age_s', 0) / 3600:.1f} h old",
        ),
    ]
    facts += [
        (
            f"model {m['label']}",
            f"{m.get('quant') or '?'}, n_ctx {m.get('n_ctx')}, sha256 {(m.get('sha256') or '?')[:16]}…",
        )
        for m in models
        if m.get("path") or not target
    ]
    if record.get("incomplete"):
        facts.append(("INCOMPLETE", "interrupted: only the runs gathered so far"))
    return facts


def cold_notes(results: Sequence[ScenarioResult]) -> list[str]:
    out: list[str] = []
    for r in results:
        if r.scenario == COLD_START and r.cold_start is not None:
            out += [f"{r.model}: {n}" for n in r.cold_start.notes if f"{r.model}: {n}" not in out]
    return out
