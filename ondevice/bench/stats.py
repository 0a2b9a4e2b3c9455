"""Per-scenario statistics from the runs (docs/metrics.md, docs/bench.md).

Only ok runs enter the statistics; every other run is listed in `failures` with its reason
and stays in `runs`. ITLs are pooled over all tokens of all ok runs; TPOT, TTFT, E2E and the
rates are per request. The roofline is read at the scenario's mid-decode context
(P + N/2): its step time is linear in the context, so that is the run's mean step.
Percentiles (ondevice.core.metrics.summarize) interpolate linearly between order statistics: numpy's
default method, Hyndman-Fan type 7, statistics.quantiles(method="inclusive"); std is the sample
standard deviation (n - 1).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from ondevice.bench.coldstart import ColdStartPrediction, predict_cold_start
from ondevice.bench.restore import restore_summary
from ondevice.bench.runs import (
    COLD_START,
    LOAD,
    LOAD_SCENARIOS,
    NO_KV_CACHE,
    PREFIX_HIT,
    RESIDENT,
    RESTORE,
    SCENARIOS,
    SPECULATIVE,
    WARM_LOAD,
    RunRecord,
)
from ondevice.bench.speculative import spec_summary
from ondevice.core.metrics import Summary, summarize
from ondevice.engine.interface import Predictor, PredictsDecode, PredictsTTFT

__all__ = ["ScenarioResult", "scenario_results", "METRICS", "EXTRA_METRICS", "clean"]

# Summaries every request scenario carries, in the JSON layout's order.
METRICS = ("ttft_s", "itl_s", "tpot_s", "e2e_s", "prefill_tok_s", "decode_tok_s")
# Summaries a cell carries only when its runs measured them: time to the first visible token
# (reasoning models, server runs), the gaps between streamed chunks (server runs), and the cold
# start's figure and parts (cold_start: load_s is in every cell's layout already).
COLD_START_PARTS = ("cold_start_s", "tokenize_s", "prefill_s", "cold_start_rest_s")
EXTRA_METRICS = ("ttft_visible_s", "itl_chunk_s", "load_call_s") + COLD_START_PARTS
_ORDER = {name: i for i, name in enumerate((LOAD,) + SCENARIOS)}


@dataclass(frozen=True)
class ScenarioResult:
    """One (model, scenario, workload) cell of the bench."""

    model: str  # model label
    scenario: str  # runs.SCENARIOS or "load"
    workload: str  # workload name ("" for load scenarios)
    prompt_tokens: int  # P (0 for load scenarios)
    output_tokens: int  # N asked for (0 for load scenarios)
    repeats: int  # runs of this cell, ok or not
    ok_runs: int  # runs that count in the statistics
    summaries: dict[str, Summary]  # METRICS (+ "load_s", "ttft_saved_s") -> summary over ok runs
    ceiling_tok_s: float | None  # roofline bound at P + N/2 (no probe: None)
    predicted_tok_s: float | None  # calibrated roofline prediction at P + N/2
    efficiency: float | None  # decode_tok_s p50 / predicted_tok_s
    predicted_ttft_s: float | None  # roofline TTFT for P prompt tokens (the median cached share not computed)
    ttft_efficiency: float | None  # predicted_ttft_s / ttft_s p50 (1 = as predicted, below 1 = slower)
    predicted_e2e_s: float | None  # predicted TTFT + the N - 1 decode steps over the growing context
    peak_rss_bytes: int | None  # largest peak RSS over the runs, bytes
    kv_bytes: int | None  # f16 K+V bytes of the context at a run's end (windowed layers capped)
    cached_prompt_tokens: float | None  # median prompt tokens served from the KV cache
    kv_cache_speedup: float | None  # no_kv_cache: its ITL p50 / the resident ITL p50 of the same workload
    failures: tuple[dict[str, Any], ...]  # {repeat, status, reason} of every run that is not ok
    notes: tuple[str, ...]  # distinct notes of the runs
    runs: tuple[RunRecord, ...] = field(default=(), repr=False)  # every run, in order
    speculative: dict[str, Any] | None = (
        None  # speculative scenario: acceptance, per-step counts, speedups (bench.speculative)
    )
    cold_start: ColdStartPrediction | None = None  # cold_start: the predicted cold start and its parts
    restore: dict[str, Any] | None = None  # restore: TTFTs restored, hit and recomputed, with predictions
    other_cpu_cores: float | None = None  # median over the runs of the CPU other processes used meanwhile, cores

    def summary(self, metric: str) -> Summary:
        return self.summaries.get(metric) or summarize(())

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "model": self.model,
            "scenario": self.scenario,
            "workload": self.workload,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "repeats": self.repeats,
            "ok_runs": self.ok_runs,
        }
        for m in METRICS + ("load_s", "ttft_saved_s"):
            d[m] = self.summary(m).to_dict()
        for m in EXTRA_METRICS:
            if m in self.summaries:
                d[m] = self.summaries[m].to_dict()
        d.update(
            ceiling_tok_s=self.ceiling_tok_s,
            predicted_tok_s=self.predicted_tok_s,
            efficiency=self.efficiency,
            predicted_ttft_s=self.predicted_ttft_s,
            ttft_efficiency=self.ttft_efficiency,
            predicted_e2e_s=self.predicted_e2e_s,
            peak_rss_bytes=self.peak_rss_bytes,
            kv_bytes=self.kv_bytes,
            cached_prompt_tokens=self.cached_prompt_tokens,
            kv_cache_speedup=self.kv_cache_speedup,
            other_cpu_cores=self.other_cpu_cores,
            failures=list(self.failures),
            notes=list(self.notes),
            runs=[r.to_dict() for r in self.runs],
        )
        if self.speculative is not None:
            d["speculative"] = self.speculative
        if self.cold_start is not None:
            d["cold_start_predicted"] = self.cold_start.to_dict()
        if self.restore is not None:
            d["restore"] = self.restore
        return clean(d)


def clean(obj: Any) -> Any:
    """NaN/inf -> None, recursively, so the JSON is standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [clean(v) for v in obj]
    return obj


def _values(runs: Iterable[RunRecord], metric: str) -> list[float | None]:
    out: list[float | None] = []
    for r in runs:
        t = r.timings
        if metric in ("load_s", "load_call_s"):
            out.append(getattr(r, metric))
        elif t is None:
            out.append(None)
        elif metric == "itl_s":
            out.extend(t.itl_s)
        elif metric == "itl_chunk_s":
            out.extend((r.serve or {}).get("itl_chunk_s") or ())
        elif metric in ("cold_start_s", "cold_start_rest_s"):
            out.append(getattr(r, metric))
        elif metric == "ttft_saved_s":
            out.append(r.baseline_ttft_s - t.ttft_s if r.baseline_ttft_s is not None else None)
        else:
            out.append(getattr(t, metric))
    return out


def _roofline(predictor: Predictor | None, scenario: str, p: int, n: int) -> tuple[float | None, float | None]:
    if predictor is None or scenario not in (RESIDENT, PREFIX_HIT, SPECULATIVE) or n < 2:
        return None, None
    try:
        ceiling_s, calibrated_s = predictor.step_s(p + n // 2)
    except Exception:  # a predictor that cannot answer leaves the columns empty
        return None, None
    return (1.0 / ceiling_s if ceiling_s > 0 else None), (1.0 / calibrated_s if calibrated_s > 0 else None)


def _request_prediction(
    predictor: Predictor | None, scenario: str, p: int, n: int, cached: float | None
) -> tuple[float | None, float | None]:
    """(predicted TTFT, predicted E2E) of the cell's request; None where the predictor has no prefill model."""
    ttft = _predicted_ttft(predictor, p, int(cached or 0)) if scenario in (RESIDENT, PREFIX_HIT) else None
    if ttft is None:
        return None, None
    try:
        return ttft, (ttft + predictor.decode_s(p, n) if isinstance(predictor, PredictsDecode) and n >= 1 else None)
    except Exception:  # a predictor that cannot answer leaves the columns empty
        return ttft, None


def build_result(
    runs: Sequence[RunRecord],
    *,
    spec: Any = None,
    predictor: Predictor | None = None,
    prompt_tokens: int = 0,
    output_tokens: int = 0,
) -> ScenarioResult:
    """Summarise the runs of one cell (all of the same model, scenario and workload)."""
    first = runs[0]
    ok = [r for r in runs if r.ok]
    metrics = ("load_s",) if first.scenario in LOAD_SCENARIOS else METRICS + ("ttft_saved_s",)
    summaries = {m: summarize(_values(ok, m)) for m in metrics}
    if first.scenario != PREFIX_HIT:
        summaries.pop("ttft_saved_s", None)
    if first.scenario == COLD_START:
        summaries.update({m: summarize(_values(ok, m)) for m in ("load_s",) + COLD_START_PARTS})
    if any(r.load_call_s is not None for r in ok):
        summaries["load_call_s"] = summarize(_values(ok, "load_call_s"))
    if any(r.timings is not None and r.timings.ttft_visible_s is not None for r in ok):
        summaries["ttft_visible_s"] = summarize(_values(ok, "ttft_visible_s"))
    if any(r.serve for r in runs):
        summaries["itl_chunk_s"] = summarize(_values(ok, "itl_chunk_s"))
    ceiling, predicted = _roofline(predictor, first.scenario, prompt_tokens, output_tokens)
    decode_p50 = summaries.get("decode_tok_s", summarize(())).p50
    efficiency = decode_p50 / predicted if predicted and decode_p50 and math.isfinite(decode_p50) else None
    cached = median(r.cached_prompt_tokens for r in ok) if ok and first.scenario not in LOAD_SCENARIOS else None
    predicted_ttft, predicted_e2e = _request_prediction(predictor, first.scenario, prompt_tokens, output_tokens, cached)
    ttft_p50 = summaries.get("ttft_s", summarize(())).p50
    ttft_eff = predicted_ttft / ttft_p50 if predicted_ttft and ttft_p50 and math.isfinite(ttft_p50) else None
    rss = [r.peak_rss_bytes for r in runs if r.peak_rss_bytes]
    kv = None
    if spec is not None and first.scenario not in LOAD_SCENARIOS + (LOAD,) and spec.kv_bytes_per_token_by_layer:
        kv = int(spec.kv_read_bytes(prompt_tokens + output_tokens))
    notes: list[str] = []
    for r in runs:
        notes += [n for n in r.notes if n and n not in notes]
    return ScenarioResult(
        model=first.model,
        scenario=first.scenario,
        workload=first.workload,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        repeats=len(runs),
        ok_runs=len(ok),
        summaries=summaries,
        ceiling_tok_s=ceiling,
        predicted_tok_s=predicted,
        efficiency=efficiency,
        predicted_ttft_s=predicted_ttft,
        ttft_efficiency=ttft_eff,
        predicted_e2e_s=predicted_e2e,
        peak_rss_bytes=max(rss) if rss else None,
        kv_bytes=kv,
        cached_prompt_tokens=cached,
        kv_cache_speedup=None,
        other_cpu_cores=median(others)
        if (others := [r.other_cpu_cores for r in ok if r.other_cpu_cores is not None])
        else None,
        failures=tuple({"repeat": r.repeat, "status": r.status, "reason": r.reason} for r in runs if not r.ok),
        notes=tuple(notes),
        runs=tuple(runs),
        speculative=spec_summary(runs) if first.scenario == SPECULATIVE else None,
        restore=restore_summary(runs) if first.scenario == RESTORE else None,
    )


def scenario_results(outcome: Any) -> list[ScenarioResult]:
    """Group a BenchOutcome's runs into cells, in model then scenario order."""
    plans = {p.label: p for p in outcome.models}
    cells: dict[tuple[str, str, str], list[RunRecord]] = {}
    for r in outcome.runs:
        cells.setdefault((r.model, r.scenario, r.workload), []).append(r)
    model_order = {p.label: i for i, p in enumerate(outcome.models)}
    results = []
    for (model, scenario, workload), runs in cells.items():
        plan = plans.get(model)
        w = next((w for w in plan.suite.workloads if w.name == workload), None) if plan else None
        p_tok = w.prompt_tokens if w else 0
        n_tok = w.output_tokens if w else 0
        if scenario in (NO_KV_CACHE, COLD_START) and runs:
            n_tok = runs[0].output_tokens_requested
        results.append(
            build_result(
                runs,
                spec=plan.spec if plan else None,
                predictor=plan.predictor if plan else None,
                prompt_tokens=p_tok,
                output_tokens=n_tok,
            )
        )
    wl_order = {w.name: i for p in outcome.models for i, w in enumerate(p.suite.workloads)}
    results.sort(
        key=lambda r: (
            model_order.get(r.model, 0),
            r.scenario not in LOAD_SCENARIOS + (LOAD,),
            wl_order.get(r.workload, -1),
            _ORDER.get(r.scenario, 99),
        )
    )
    return _with_cold_start(_with_speedups(results), plans)


def _with_cold_start(results: list[ScenarioResult], plans: dict[str, Any]) -> list[ScenarioResult]:
    """Each cold_start cell with its prediction (ondevice.bench.coldstart): the disk read of the
    model file, the same bench's warm load call p50 as the load overhead, the predictor's TTFT."""
    from dataclasses import replace

    warm = {
        r.model: (r.summaries.get("load_call_s") or r.summary("load_s")).p50
        for r in results
        if r.scenario == WARM_LOAD and r.ok_runs
    }
    out = []
    for r in results:
        if r.scenario == COLD_START:
            p = plans.get(r.model)
            r = replace(
                r,
                cold_start=predict_cold_start(
                    file_bytes=getattr(getattr(p, "spec", None), "file_bytes", None),
                    disk_read_gbs=getattr(p, "disk_read_gbs", None),
                    load_overhead_s=warm.get(r.model),
                    ttft_s=_predicted_ttft(getattr(p, "predictor", None), r.prompt_tokens),
                    notes=[n for n in (getattr(p, "disk_note", ""),) if n],
                ),
            )
        out.append(r)
    return out


def _predicted_ttft(predictor: object, n_prompt: int, n_cached: int = 0) -> float | None:
    """The predictor's TTFT of a prompt (n_cached of it in the KV cache); None where it has no
    prefill model (older predictors, fakes) or cannot answer."""
    if not isinstance(predictor, PredictsTTFT) or n_prompt < 1:
        return None
    try:
        value = float(predictor.ttft_s(n_prompt, n_cached))
    except Exception:  # a predictor that cannot answer leaves the part empty
        return None
    return value if math.isfinite(value) and value >= 0 else None


def _with_speedups(results: list[ScenarioResult]) -> list[ScenarioResult]:
    from dataclasses import replace

    resident = {(r.model, r.workload): r.summary("itl_s").p50 for r in results if r.scenario == RESIDENT}
    out = []
    for r in results:
        base = resident.get((r.model, r.workload))
        itl = r.summary("itl_s").p50
        if r.scenario == NO_KV_CACHE and base and itl and math.isfinite(base) and math.isfinite(itl):
            r = replace(r, kv_cache_speedup=itl / base)
        out.append(r)
    return out
