"""`bench --batch 1,2,4,8`: B sequences per llama_decode, swept over B, against the roofline.

Per batch size B (docs/bench.md): one batch context (Engine.batched) of B sequences of P + N
tokens, made before anything is timed; warm-up generations that are not counted; then the
measured repeats, interleaved across the levels with the order rotated each repeat (1 2 4 8,
2 4 8 1, ...) so drift on a shared machine hits every level alike. Every run gives each
sequence a distinct exact-length prompt (suites.PromptBuilder) and ignores end-of-generation,
so each sequence makes N tokens. Failures are kept; Ctrl-C keeps what was gathered.

Per level: aggregate output tok/s (every sequence's tokens / wall time, prefill included),
aggregate decode tok/s (tokens of the decode steps / their time), per-sequence decode tok/s
(1 / TPOT), ITL p50/p95 pooled over the sequences, TTFT p50 (the shared prefill included), the
roofline's aggregate decode tok/s (Predictor.tokens_step_s: the weights once per step, every
sequence's KV) and efficiency = measured / predicted. The knee is the last B up to which each
level's gain in aggregate decode tok/s over the level before is at least half of proportional;
with SLO bounds (bench.slo), the largest B whose sequences meet them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from statistics import median
from typing import Any

from ondevice.bench.runner import Progress
from ondevice.bench.runs import RunRecord, RunStatus
from ondevice.bench.slo import Bound, SloResult, evaluate
from ondevice.bench.suites import PromptBuilder, Workload
from ondevice.core.errors import BenchError
from ondevice.core.metrics import Summary, summarize
from ondevice.engine.batch import MAX_SEQS

__all__ = [
    "SweepConfig",
    "SweepRun",
    "SweepOutcome",
    "LevelSummary",
    "SweepResult",
    "check_levels",
    "run_sweep",
    "summarize_sweep",
    "KNEE_SHARE",
    "SCENARIO",
]

KNEE_SHARE = 0.5  # a level still scales when its marginal gain is at least this share of proportional
SCENARIO = "batch"  # the scenario name of the per-sequence records the SLO check reads


@dataclass(frozen=True)
class SweepConfig:
    levels: tuple[int, ...]  # batch sizes B, ascending, distinct
    workload: Workload  # prompt length P and output length N of every sequence, tokens
    repeats: int  # measured runs per level
    warmup: int  # untimed runs per level before the measured ones
    sampling: dict[str, Any] = field(default_factory=dict)  # sampler settings (temperature, top_k, ...)
    seed: int = 0  # prompt texts and sampler seeds derive from it


@dataclass(frozen=True)
class SweepRun:
    """One measured batch generation (or why there is none)."""

    n_seqs: int  # B
    repeat: int  # 0-based repeat index
    status: RunStatus  # "ok", "failed" or "interrupted"
    reason: str = ""  # why it is not ok
    result: Any = None  # the engine's BatchGeneration when ok

    @property
    def ok(self) -> bool:
        return self.status == "ok" and self.result is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_seqs": self.n_seqs,
            "repeat": self.repeat,
            "status": self.status,
            "reason": self.reason,
            **({"result": self.result.to_dict()} if self.result is not None else {}),
        }


@dataclass
class SweepOutcome:
    config: SweepConfig
    runs: list[SweepRun]  # every measured run, in the order run
    started_at: float  # time.time() at start
    ended_at: float = 0.0  # time.time() at the end
    incomplete: bool = False  # interrupted (Ctrl-C): only part of the plan ran


def check_levels(
    levels: Sequence[int], workload: Workload, *, n_ctx: int | None = None, n_ctx_train: int | None = None
) -> tuple[int, ...]:
    """The batch sizes, ascending; BenchError (before any work) for a level below 1 or above
    llama.cpp's 256 sequences, one named twice, a sequence (P + N) past the trained context,
    or, with n_ctx (the context the batch may use), B sequences of P + N (each rounded up to 256,
    as llama.cpp allots them) that do not fit it."""
    if not levels:
        raise BenchError("--batch: name at least one batch size")
    for b in levels:
        if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_SEQS:
            raise BenchError(
                f"--batch {b}: a batch size must be a whole number from 1 to {MAX_SEQS} (llama.cpp's limit)"
            )
    if len(set(levels)) != len(levels):
        raise BenchError(f"--batch: a batch size is named twice ({', '.join(map(str, levels))})")
    seq = workload.prompt_tokens + workload.output_tokens
    if n_ctx_train and seq > n_ctx_train:
        raise BenchError(
            f"--batch: a sequence of {workload.prompt_tokens} + {workload.output_tokens} tokens runs past "
            f"the model's trained context of {n_ctx_train} tokens"
        )
    per = -(-seq // 256) * 256
    if n_ctx is not None and max(levels) * per > n_ctx:
        raise BenchError(
            f"--batch {max(levels)}: {max(levels)} sequences of {seq} tokens ({per} each, as llama.cpp "
            f"allots them) need {max(levels) * per} tokens of context; --n-ctx is {n_ctx}"
        )
    return tuple(sorted(levels))


def run_sweep(engine: Any, config: SweepConfig, *, progress: Callable[[Progress], None] | None = None) -> SweepOutcome:
    """Measure every level on `engine` (an Engine with batched()). Never raises for a failing
    level or run; KeyboardInterrupt ends it early with incomplete=True."""
    w = config.workload
    prompts = PromptBuilder(lambda text, bos: engine.tokenize(text, add_bos=bos), config.seed)
    outcome = SweepOutcome(config, [], time.time())
    total = len(config.levels) * (config.warmup + config.repeats)
    done = [0]

    def tick(desc: str) -> None:
        if progress:
            progress(Progress(done[0], total, desc))
        done[0] += 1

    def generate(ctx: Any, b: int, key: str, seed: int) -> Any:
        ids = [prompts.ids(w.prompt_tokens, f"{key}:{i}") for i in range(b)]
        return ctx.generate(ids, w.output_tokens, seed=seed, ignore_eos=True, **config.sampling)

    contexts: dict[int, Any] = {}
    broken: dict[int, str] = {}
    try:
        for b in config.levels:  # contexts first, then untimed runs, level by level
            try:
                contexts[b] = engine.batched(b, w.prompt_tokens + w.output_tokens)
                for k in range(config.warmup):
                    tick(f"B={b} warm-up {k + 1}")
                    generate(contexts[b], b, f"batch-warmup:{b}:{k}", config.seed)
            except KeyboardInterrupt:
                raise
            except Exception as exc:
                broken[b] = f"{type(exc).__name__}: {exc}"
        for r in range(config.repeats):
            shift = r % len(config.levels)
            for b in config.levels[shift:] + config.levels[:shift]:
                tick(f"B={b} #{r + 1}")
                outcome.runs.append(
                    _measure(
                        contexts.get(b),
                        b,
                        r,
                        broken.get(b),
                        lambda: generate(contexts[b], b, f"batch:{b}:{r}", config.seed + r),
                    )
                )
    except KeyboardInterrupt:
        outcome.incomplete = True
    finally:
        for ctx in contexts.values():
            ctx.close()
        outcome.ended_at = time.time()
    if progress:
        progress(Progress(total, total, "done"))
    return outcome


def _measure(ctx: Any, b: int, repeat: int, broken: str | None, fn: Callable[[], Any]) -> SweepRun:
    if ctx is None or broken:
        return SweepRun(b, repeat, "failed", broken or "no batch context")
    try:
        return SweepRun(b, repeat, "ok", result=fn())
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        return SweepRun(b, repeat, "failed", f"{type(exc).__name__}: {exc}")


@dataclass(frozen=True)
class LevelSummary:
    """One batch size over its measured runs (only ok runs enter the figures)."""

    n_seqs: int  # B
    runs: int  # measured runs, ok or not
    ok_runs: int  # runs in the figures
    output_tok_s: float | None  # median aggregate output tok/s (all sequences' tokens / wall, prefill included)
    decode_tok_s: float | None  # median aggregate decode tok/s (decode steps' tokens / their time)
    seq_decode_tok_s: float | None  # median per-sequence decode tok/s (1 / TPOT)
    itl_s: Summary  # ITL pooled over every sequence of every ok run, seconds
    ttft_s: Summary  # TTFT of every sequence (shared prefill included), seconds
    predicted_decode_tok_s: float | None  # roofline: B / predicted step time at the mid-decode context
    ceiling_decode_tok_s: float | None  # B / bandwidth-bound step time
    scaling: float | None  # gain in decode tok/s over the level before / proportional gain (None: first level)
    slo: SloResult | None  # the SLO check of its sequences, when bounds were given
    failures: tuple[str, ...]  # "#repeat status: reason" of each run not ok

    @property
    def efficiency(self) -> float | None:
        """Measured / predicted aggregate decode tok/s."""
        if self.decode_tok_s and self.predicted_decode_tok_s:
            return self.decode_tok_s / self.predicted_decode_tok_s
        return None

    def to_dict(self) -> dict[str, Any]:
        return {
            "n_seqs": self.n_seqs,
            "runs": self.runs,
            "ok_runs": self.ok_runs,
            "output_tok_s": self.output_tok_s,
            "decode_tok_s": self.decode_tok_s,
            "seq_decode_tok_s": self.seq_decode_tok_s,
            "itl_s": self.itl_s.to_dict(),
            "ttft_s": self.ttft_s.to_dict(),
            "predicted_decode_tok_s": self.predicted_decode_tok_s,
            "ceiling_decode_tok_s": self.ceiling_decode_tok_s,
            "efficiency": self.efficiency,
            "scaling": self.scaling,
            "slo": self.slo.to_dict() if self.slo is not None else None,
            "failures": list(self.failures),
        }


@dataclass(frozen=True)
class SweepResult:
    levels: tuple[LevelSummary, ...]  # ascending B
    knee: int | None  # the last B that still scales (None: fewer than two measured levels)
    slo_max_seqs: int | None  # largest B whose sequences meet the SLO (None: no bounds, or none meets them)

    def to_dict(self) -> dict[str, Any]:
        return {
            "levels": [lv.to_dict() for lv in self.levels],
            "knee": self.knee,
            "slo_max_seqs": self.slo_max_seqs,
            "knee_share": KNEE_SHARE,
        }


def _med(values: Sequence[float | None]) -> float | None:
    xs = [v for v in values if v is not None]
    return median(xs) if xs else None


def _records(run: SweepRun, label: str, workload: Workload) -> list[RunRecord]:
    """One RunRecord per sequence (a failed run: one failed record per sequence), for bench.slo."""
    base = RunRecord(
        model=label,
        scenario=SCENARIO,
        workload=workload.name,
        repeat=run.repeat,
        status=run.status,
        reason=run.reason,
        prompt_tokens=workload.prompt_tokens,
        output_tokens_requested=workload.output_tokens,
    )
    if not run.ok:
        return [base for _ in range(run.n_seqs)]  # frozen: one record can stand for every sequence
    return [replace(base, timings=g.timings, finish_reason=g.finish_reason) for g in run.result.generations]


def _level(b: int, runs: list[SweepRun], bounds: Sequence[Bound] | None, workload: Workload) -> LevelSummary:
    ok = [r.result for r in runs if r.ok]
    gens = [g for res in ok for g in res.generations]
    slo = None
    if bounds:
        slo = evaluate([rec for r in runs for rec in _records(r, f"B={b}", workload)], bounds)
    return LevelSummary(
        n_seqs=b,
        runs=len(runs),
        ok_runs=len(ok),
        output_tok_s=_med([res.output_tok_s for res in ok]),
        decode_tok_s=_med([res.decode_tok_s for res in ok]),
        seq_decode_tok_s=_med([g.timings.decode_tok_s for g in gens]),
        itl_s=summarize([x for g in gens for x in g.timings.itl_s]),
        ttft_s=summarize([g.timings.ttft_s for g in gens]),
        predicted_decode_tok_s=_med([res.predicted_decode_tok_s for res in ok]),
        ceiling_decode_tok_s=_med([res.ceiling_decode_tok_s for res in ok]),
        scaling=None,
        slo=slo,
        failures=tuple(f"#{r.repeat + 1} {r.status}: {r.reason}" for r in runs if not r.ok),
    )


def summarize_sweep(
    config: SweepConfig, runs: Sequence[SweepRun], bounds: Sequence[Bound] | None = None
) -> SweepResult:
    """Per-level figures, each level's scaling over the one before, the knee and the SLO's largest B."""
    levels = [_level(b, [r for r in runs if r.n_seqs == b], bounds, config.workload) for b in config.levels]
    out: list[LevelSummary] = []
    prev: LevelSummary | None = None
    for lv in levels:
        scaling = None
        if prev is not None and prev.decode_tok_s and lv.decode_tok_s:
            scaling = (lv.decode_tok_s / prev.decode_tok_s - 1) / (lv.n_seqs / prev.n_seqs - 1)
        out.append(replace(lv, scaling=scaling))
        if lv.decode_tok_s:
            prev = lv
    measured = [lv for lv in out if lv.decode_tok_s]
    knee = None
    if len(measured) >= 2:
        knee = measured[0].n_seqs
        for lv in measured[1:]:
            if lv.scaling is None or lv.scaling < KNEE_SHARE:
                break
            knee = lv.n_seqs
    passing = [lv.n_seqs for lv in out if lv.slo is not None and lv.slo.passed]
    return SweepResult(tuple(out), knee, max(passing) if passing else None)
