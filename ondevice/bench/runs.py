"""What one bench run measured, kept whole: ok, failed, timed out, interrupted or skipped."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from ondevice.core.results import Timings

__all__ = [
    "RunRecord",
    "RunStatus",
    "SCENARIOS",
    "DEFAULT_SCENARIOS",
    "LOAD_SCENARIOS",
    "REQUEST_SCENARIOS",
    "SPECULATIVE",
    "RESTORE",
    "COLD_START",
]

RunStatus = Literal["ok", "failed", "timeout", "interrupted", "skipped"]

# Scenario names, in report order. "load" holds a model that never loaded. cold_start is a
# load and a request in one (ondevice.bench.coldstart): page cache dropped -> load -> first token.
COLD_LOAD, WARM_LOAD, RESIDENT, PREFIX_HIT, NO_KV_CACHE, COLD_START, LOAD = (
    "cold_load",
    "warm_load",
    "resident",
    "prefix_hit",
    "no_kv_cache",
    "cold_start",
    "load",
)
SPECULATIVE = "speculative"  # prompt-lookup decoding paired with plain decoding of the same prompt (bench.speculative)
RESTORE = "restore"  # a conversation resumed from its KV state on disk, against recompute and the hit (bench.restore)
LOAD_SCENARIOS = (COLD_LOAD, WARM_LOAD)
REQUEST_SCENARIOS = (RESIDENT, PREFIX_HIT, NO_KV_CACHE, SPECULATIVE, RESTORE)
SCENARIOS = LOAD_SCENARIOS + REQUEST_SCENARIOS + (COLD_START,)
DEFAULT_SCENARIOS = (COLD_LOAD, WARM_LOAD, RESIDENT, PREFIX_HIT, COLD_START)


@dataclass(frozen=True)
class RunRecord:
    """One measured run (a load, or one request) and everything needed to audit it."""

    model: str  # model label (file name) as in the results
    scenario: str  # one of SCENARIOS, or "load" for a model that failed to load
    workload: str  # workload name ("" for load scenarios)
    repeat: int  # 0-based repeat index
    status: RunStatus  # "ok" counts in the statistics; the rest are failures kept with `reason`
    reason: str = ""  # why it is not ok (error message, "timeout after 30 s", ...)
    prompt_tokens: int = 0  # prompt length in tokens (cached + computed); 0 for load scenarios
    output_tokens_requested: int = 0  # N asked for
    cached_prompt_tokens: int = 0  # prompt tokens served from the KV cache
    finish_reason: str | None = None  # the engine's finish reason
    timings: Timings | None = None  # the request's timings (None for loads and runs that never started)
    load_s: float | None = None  # load scenarios: model file open -> engine ready, seconds
    load_call_s: float | None = None  # load scenarios, cold_start: the whole load call (ondevice.load: header,
    # checks, predictor and llama.cpp's load_s), wall-clock in the bench, seconds
    baseline_ttft_s: float | None = None  # prefix_hit: TTFT of the same-length prompt with nothing cached, seconds
    resident_before_load: float | None = (
        None  # cold_load, cold_start: share of the file in the page cache at load, 0..1
    )
    cold_start_s: float | None = (
        None  # cold_start: load call -> first token, seconds (load_s + the request's TTFT + gaps)
    )
    peak_rss_bytes: int | None = None  # peak resident set size of the process during the run, bytes
    seed: int | None = None  # sampling seed of the request
    notes: tuple[str, ...] = field(default=())  # anything odd seen during the run
    serve: dict[str, Any] | None = (
        None  # server runs (bench --url): what the client saw beyond Timings (ondevice.bench.serve.measure)
    )
    attribution: dict[str, float] | None = None  # where the request's E2E went (results.Attribution.to_dict), seconds
    other_cpu_cores: float | None = None  # CPU other processes used during the request, cores (Generation's)
    speculative: dict[str, Any] | None = (
        None  # speculative runs: SpecStats.to_dict() + the paired plain run's decode_tok_s
    )
    restore: dict[str, Any] | None = None  # restore runs: the restore, hit and recompute TTFTs and predictions

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def output_tokens(self) -> int:
        return self.timings.output_tokens if self.timings else 0

    @property
    def cold_start_rest_s(self) -> float | None:
        """cold_start: what is neither load_s, tokenize nor prefill (the work of the load call
        around llama.cpp's load, the first sample, handing the request over), seconds."""
        t = self.timings
        if self.cold_start_s is None or self.load_s is None or t is None:
            return None
        return self.cold_start_s - self.load_s - t.tokenize_s - t.prefill_s

    def to_dict(self) -> dict[str, Any]:
        t = self.timings
        return {
            "scenario": self.scenario,
            "workload": self.workload,
            "repeat": self.repeat,
            "status": self.status,
            "reason": self.reason,
            "seed": self.seed,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "output_tokens": self.output_tokens,
            "output_tokens_requested": self.output_tokens_requested,
            "finish_reason": self.finish_reason,
            "load_s": self.load_s,
            "load_call_s": self.load_call_s,
            "other_cpu_cores": self.other_cpu_cores,
            "resident_before_load": self.resident_before_load,
            **(
                {"cold_start_s": self.cold_start_s, "cold_start_rest_s": self.cold_start_rest_s}
                if self.cold_start_s is not None
                else {}
            ),
            "tokenize_s": t.tokenize_s if t else None,
            "prefill_s": t.prefill_s if t else None,
            "ttft_s": t.ttft_s if t else None,
            "ttft_visible_s": t.ttft_visible_s if t else None,
            "tpot_s": t.tpot_s if t else None,
            "e2e_s": t.e2e_s if t else None,
            "prefill_tok_s": t.prefill_tok_s if t else None,
            "decode_tok_s": t.decode_tok_s if t else None,
            "output_throughput_tok_s": t.output_throughput_tok_s if t else None,
            "prompt_tokens_computed": t.prompt_tokens_computed if t else None,
            "baseline_ttft_s": self.baseline_ttft_s,
            "ttft_saved_s": (self.baseline_ttft_s - t.ttft_s) if (t and self.baseline_ttft_s is not None) else None,
            "peak_rss_bytes": self.peak_rss_bytes,
            "notes": list(self.notes),
            "itl_s": list(t.itl_s) if t else [],
            **({"serve": self.serve} if self.serve is not None else {}),
            **({"attribution": self.attribution} if self.attribution is not None else {}),
            **({"speculative": self.speculative} if self.speculative is not None else {}),
            **({"restore": self.restore} if self.restore is not None else {}),
        }

    @classmethod
    def from_dict(cls, model: str, d: dict[str, Any]) -> RunRecord:
        """Inverse of to_dict (for compare and SLO checks on a saved file)."""
        timings = None
        if d.get("ttft_s") is not None and d.get("e2e_s") is not None:
            timings = Timings(
                tokenize_s=float(d.get("tokenize_s") or 0.0),
                prefill_s=float(d.get("prefill_s") or 0.0),
                ttft_s=float(d["ttft_s"]),
                itl_s=tuple(float(x) for x in d.get("itl_s") or ()),
                e2e_s=float(d["e2e_s"]),
                prompt_tokens_computed=int(d.get("prompt_tokens_computed") or 0),
                output_tokens=int(d.get("output_tokens") or 0),
                ttft_visible_s=d.get("ttft_visible_s"),
            )
        return cls(
            model=model,
            scenario=str(d.get("scenario", "")),
            workload=str(d.get("workload", "")),
            repeat=int(d.get("repeat", 0)),
            status=d.get("status", "ok"),
            reason=str(d.get("reason", "")),
            prompt_tokens=int(d.get("prompt_tokens") or 0),
            output_tokens_requested=int(d.get("output_tokens_requested") or 0),
            cached_prompt_tokens=int(d.get("cached_prompt_tokens") or 0),
            finish_reason=d.get("finish_reason"),
            timings=timings,
            load_s=d.get("load_s"),
            load_call_s=d.get("load_call_s"),
            baseline_ttft_s=d.get("baseline_ttft_s"),
            resident_before_load=d.get("resident_before_load"),
            cold_start_s=d.get("cold_start_s"),
            peak_rss_bytes=d.get("peak_rss_bytes"),
            seed=d.get("seed"),
            notes=tuple(d.get("notes") or ()),
            serve=d.get("serve") if isinstance(d.get("serve"), dict) else None,
            speculative=d.get("speculative") if isinstance(d.get("speculative"), dict) else None,
            restore=d.get("restore") if isinstance(d.get("restore"), dict) else None,
        )
