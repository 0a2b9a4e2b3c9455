"""Run a bench: plan (ondevice.bench.plan: resolve, inspect, fit the suite to each model's context), then measure.

Several models are interleaved by repeat (repeat 0 of every model, then repeat 1, ..., the
order reversed on odd repeats: A B B A ...), so drift on a shared machine hits them alike.
Within a repeat, per model: the load scenarios
(cold: page cache dropped first; warm: file already cached), warm-up requests that are not
counted, then per workload the resident and prefix-hit requests (and the no-KV-cache
ablation for the shortest workload), and last the cold start (ondevice.bench.coldstart: page
cache dropped, load, the first request's first token). Failures are kept; Ctrl-C keeps what
was gathered.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

from ondevice.bench import scenarios as sc
from ondevice.bench.coldstart import disk_read_for, prompt_for
from ondevice.bench.oscache import PeakRss
from ondevice.bench.plan import DEFAULT_SAMPLING, BenchConfig, ModelPlan, plan_bench
from ondevice.bench.restore import remove_state, restore_run
from ondevice.bench.runs import (
    COLD_LOAD,
    COLD_START,
    LOAD,
    NO_KV_CACHE,
    PREFIX_HIT,
    RESIDENT,
    RESTORE,
    SPECULATIVE,
    WARM_LOAD,
    RunRecord,
    RunStatus,
)
from ondevice.bench.speculative import speculative_run
from ondevice.bench.suites import PromptBuilder, Suite, Workload
from ondevice.core import paths
from ondevice.core.pagecache import evict_files
from ondevice.engine.interface import StreamingEngine
from ondevice.gguf.reader import model_files

__all__ = [
    "BenchConfig",
    "ModelPlan",
    "BenchOutcome",
    "Progress",
    "plan_bench",
    "run_bench",
    "load_plan",
    "DEFAULT_SAMPLING",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Progress:
    done: int  # steps finished
    total: int  # steps planned
    description: str  # what runs next


@dataclass
class BenchOutcome:
    config: BenchConfig
    models: list[ModelPlan]  # in the order given
    runs: list[RunRecord]  # every run, in the order measured
    started_at: float  # time.time() at start
    ended_at: float = 0.0  # time.time() at the end
    incomplete: bool = False  # interrupted (Ctrl-C): only part of the plan ran
    rss_method: str = ""  # how peak RSS was measured


def _steps(plans: Sequence[ModelPlan], config: BenchConfig) -> int:
    per = 0
    for p in plans:
        if p.error:
            continue
        per += sum(s in config.scenarios for s in (COLD_LOAD, WARM_LOAD))
        per += len(p.suite.workloads) * sum(s in config.scenarios for s in (RESIDENT, PREFIX_HIT, SPECULATIVE, RESTORE))
        per += NO_KV_CACHE in config.scenarios
        per += COLD_START in config.scenarios
    return per * config.suite.repeats


def run_bench(
    config: BenchConfig,
    plans: list[ModelPlan] | None = None,
    *,
    load_fn: Callable[..., StreamingEngine] | None = None,
    progress: Callable[[Progress], None] | None = None,
) -> BenchOutcome:
    """Measure every model in `plans` (default: plan_bench(config)). Never raises for a
    failing model or request; KeyboardInterrupt ends it early with incomplete=True.
    load_fn(path, **engine settings) gives the engine (default: ondevice.load with the full timing plan)."""
    if plans is None:
        plans = plan_bench(config)
    load_fn = load_fn or _default_load()
    rss = PeakRss()
    outcome = BenchOutcome(config, plans, [], time.time(), rss_method=rss.method)
    total, done = _steps(plans, config), [0]

    def tick(desc: str) -> None:
        if progress:
            progress(Progress(done[0], total, desc))
        done[0] += 1

    for p in plans:
        if p.error:
            outcome.runs.append(RunRecord(p.label, LOAD, "", 0, "failed", reason=p.error))
    try:
        for repeat in range(config.suite.repeats):
            for p in plans if repeat % 2 == 0 else plans[::-1]:  # A B, B A, ...: order effects cancel
                if not p.error:
                    _model_repeat(config, p, repeat, load_fn, rss, outcome.runs, tick)
                    if len(plans) > 1:
                        _close(p)
    except KeyboardInterrupt:
        outcome.incomplete = True
    finally:
        for p in plans:
            _close(p)
        outcome.ended_at = time.time()
    if progress:
        progress(Progress(total, total, "done"))
    return outcome


def load_plan(config: BenchConfig, p: ModelPlan, load_fn: Callable[..., Any] | None = None) -> Any:
    """Load p's engine as run_bench does (the engine settings of config); sets p.engine, engine_info, predictor."""
    p.engine = _load(config, p, load_fn or _default_load())
    return p.engine


def _default_load() -> Callable[..., Any]:
    """ondevice.load with the full timing plan: a model the bench meets untimed is timed at every chunk size,
    in three rounds, with batched steps (imported here: importing llama.cpp is slow)."""
    from ondevice.api import load

    return functools.partial(load, timing="full")


def _close(p: ModelPlan) -> None:
    if p.engine is not None:
        engine, p.engine = p.engine, None
        try:
            engine.close()
        except Exception as exc:  # a close that fails must not hide the runs gathered
            log.warning("closing %s: %s", p.label, exc)


def _load(config: BenchConfig, p: ModelPlan, load_fn) -> Any:
    engine = load_fn(
        str(p.path),
        n_ctx=p.n_ctx,
        n_threads=config.n_threads,
        n_batch=config.n_batch,
        n_ubatch=config.n_ubatch,
        n_gpu_layers=config.n_gpu_layers,
        flash_attn=config.flash_attn,
        seed=config.seed,
        cache_type_k=config.cache_type_k,
        cache_type_v=config.cache_type_v,
        **({"fit": True} if config.fit else {}),
    )
    p.warmed = False
    if not p.engine_info:
        p.engine_info = _info_dict(engine.info)
        p.predictor = engine.predictor
    return engine


def _info_dict(info: Any) -> dict[str, Any]:
    keys = (
        "backend",
        "n_gpu_layers",
        "n_threads",
        "n_batch",
        "n_ubatch",
        "n_ctx",
        "flash_attn",
        "flash_attn_used",
        "cache_type_k",
        "cache_type_v",
        "cpu_buffers",
        "cpu_buffers_reason",
        "fit_reason",
        "memory_need_bytes",
        "llama_cpp_version",
        "seed",
    )
    return {k: getattr(info, k, None) for k in keys}


def _model_repeat(config: BenchConfig, p: ModelPlan, repeat: int, load_fn, rss: PeakRss, runs: list, tick) -> None:
    """One repeat of one model: loads, warm-up, then every workload's request scenarios."""
    try:
        if not _loads(config, p, repeat, load_fn, rss, runs, tick):
            return
        if p.engine is None:
            p.engine = _load(config, p, load_fn)
    except KeyboardInterrupt:
        raise
    except Exception as exc:
        runs.append(RunRecord(p.label, LOAD, "", repeat, "failed", reason=f"{type(exc).__name__}: {exc}"))
        p.error = f"{type(exc).__name__}: {exc}"
        return
    ctx = sc.RequestContext(p.engine, p.label, repeat, config.sampling, config.timeout_s, rss)
    prompts = PromptBuilder(lambda text, bos: p.engine.tokenize(text, add_bos=bos), config.seed)
    if not p.warmed:
        _warmup(ctx, p.suite, prompts, repeat)
        p.warmed = True
    seed = config.seed + repeat
    for w in p.suite.workloads:
        if RESIDENT in config.scenarios:
            tick(f"{p.label} {w.name} resident #{repeat + 1}")
            _guard(
                runs,
                ctx,
                RESIDENT,
                w,
                lambda: sc.resident_run(
                    ctx, w.name, prompts.ids(w.prompt_tokens, f"{w.name}:resident:{repeat}"), w.output_tokens, seed
                ),
            )
        if PREFIX_HIT in config.scenarios:
            tick(f"{p.label} {w.name} prefix hit #{repeat + 1}")
            _guard(runs, ctx, PREFIX_HIT, w, lambda: _prefix(ctx, w, prompts, repeat, seed))
        if SPECULATIVE in config.scenarios:
            tick(f"{p.label} {w.name} speculative #{repeat + 1}")
            _guard(
                runs,
                ctx,
                SPECULATIVE,
                w,
                lambda: speculative_run(
                    ctx,
                    w.name,
                    prompts.ids(w.prompt_tokens, f"{w.name}:speculative:{repeat}"),
                    w.output_tokens,
                    seed,
                    exact=config.spec_exact,
                ),
            )
        if RESTORE in config.scenarios:
            tick(f"{p.label} {w.name} restore #{repeat + 1}")
            _guard(runs, ctx, RESTORE, w, lambda: _restore(config, p, ctx, w, prompts, repeat, seed))
    if NO_KV_CACHE in config.scenarios:
        w = min(p.suite.workloads, key=lambda x: x.prompt_tokens)
        n = min(w.output_tokens, p.suite.ablation_tokens)
        tick(f"{p.label} {w.name} no KV cache #{repeat + 1}")
        _guard(
            runs,
            ctx,
            NO_KV_CACHE,
            w,
            lambda: sc.no_kv_cache_run(
                ctx, w.name, prompts.ids(w.prompt_tokens, f"{w.name}:ablation:{repeat}"), n, seed
            ),
        )
    if COLD_START in config.scenarios:
        w = min(p.suite.workloads, key=lambda x: x.prompt_tokens)
        tick(f"{p.label} cold start #{repeat + 1}")
        _guard(runs, ctx, COLD_START, w, lambda: _cold_start(config, p, w, prompts, ctx, load_fn, seed))


def _cold_start(
    config: BenchConfig, p: ModelPlan, w: Workload, prompts: PromptBuilder, ctx: sc.RequestContext, load_fn, seed: int
) -> RunRecord:
    """Close the engine, then the cold start (its prompt built once, with the engine still loaded)."""
    if p.cold_prompt is None:
        p.cold_prompt, p.cold_prompt_note = prompt_for(p.engine, prompts.ids(w.prompt_tokens, f"{w.name}:cold-start"))
        p.disk_read_gbs, p.disk_note = disk_read_for(p.path, p.engine_info.get("backend"))  # for the prediction
    _close(p)
    rec, p.engine = sc.cold_start_run(
        ctx,
        w.name,
        p.path,
        lambda: _load(config, p, load_fn),
        p.cold_prompt,
        w.prompt_tokens,
        seed,
        notes=(p.cold_prompt_note,),
    )
    return rec


def _guard(runs: list, ctx: sc.RequestContext, scenario: str, w: Workload, fn) -> None:
    """Run one scenario and keep its record; an unexpected error (prompt building, ...) is a
    failed run, and Ctrl-C leaves an "interrupted" run behind before it ends the bench."""

    def lost(status: RunStatus, reason: str) -> RunRecord:
        return RunRecord(
            ctx.model,
            scenario,
            w.name,
            ctx.repeat,
            status,
            reason=reason,
            prompt_tokens=w.prompt_tokens,
            output_tokens_requested=w.output_tokens,
        )

    try:
        runs.append(fn())
    except KeyboardInterrupt:
        runs.append(lost("interrupted", "interrupted by the user (Ctrl-C)"))
        raise
    except Exception as exc:
        runs.append(lost("failed", f"{type(exc).__name__}: {exc}"))


def _prefix(ctx: sc.RequestContext, w: Workload, prompts: PromptBuilder, repeat: int, seed: int) -> RunRecord:
    if w.prompt_tokens < 2:
        return RunRecord(
            ctx.model,
            PREFIX_HIT,
            w.name,
            repeat,
            "skipped",
            reason="a prefix hit needs a prompt of 2 tokens or more",
            prompt_tokens=w.prompt_tokens,
            output_tokens_requested=w.output_tokens,
        )
    s = sc.suffix_tokens(w.prompt_tokens)
    prefix = prompts.ids(w.prompt_tokens - s, f"{w.name}:prefix:{repeat}")
    a = prompts.ids(s, f"{w.name}:suffix-a:{repeat}", add_bos=False)
    b = prompts.ids(s, f"{w.name}:suffix-b:{repeat}", add_bos=False)
    return sc.prefix_hit_run(ctx, w.name, prefix, a, b, w.output_tokens, seed)


def _restore(
    config: BenchConfig,
    p: ModelPlan,
    ctx: sc.RequestContext,
    w: Workload,
    prompts: PromptBuilder,
    repeat: int,
    seed: int,
) -> RunRecord:
    """The restore scenario (ondevice.bench.restore): history and turn as the prefix hit's prefix and suffix; the
    state file written under config.state_dir and removed after."""
    if w.prompt_tokens < 2:
        return RunRecord(
            ctx.model,
            RESTORE,
            w.name,
            repeat,
            "skipped",
            reason="a resumed conversation needs a prompt of 2 tokens or more",
            prompt_tokens=w.prompt_tokens,
            output_tokens_requested=w.output_tokens,
        )
    folder = config.state_dir or paths.cache_dir() / "bench" / "states"
    folder.mkdir(parents=True, exist_ok=True)
    if p.state_disk is None:
        p.state_disk = disk_read_for(folder, p.engine_info.get("backend"))
    s = sc.suffix_tokens(w.prompt_tokens)
    history = prompts.ids(w.prompt_tokens - s, f"{w.name}:history:{repeat}")
    turn = prompts.ids(s, f"{w.name}:turn:{repeat}", add_bos=False)
    state_path = folder / f"restore-{os.getpid()}-{repeat}.kv"
    try:
        rec = restore_run(
            ctx,
            w.name,
            history,
            turn,
            w.output_tokens,
            seed,
            state_path=state_path,
            predictor=p.predictor,
            disk_read_gbs=p.state_disk[0],
        )
    finally:
        remove_state(state_path)
    return replace(rec, notes=rec.notes + ((p.state_disk[1],) if p.state_disk[1] else ()))


def _warmup(ctx: sc.RequestContext, suite: Suite, prompts: PromptBuilder, repeat: int) -> None:
    """Untimed requests after each load: fault in the weights, start the threads."""
    w = min(suite.workloads, key=lambda x: x.prompt_tokens)
    for i in range(suite.warmup):
        ids = prompts.ids(min(w.prompt_tokens, 64), f"warmup:{repeat}:{i}")
        sc.request(ctx, ids, min(w.output_tokens, 8), 0, reuse_prefix=False)


def _loads(config: BenchConfig, p: ModelPlan, repeat: int, load_fn, rss: PeakRss, runs: list, tick) -> bool:
    """The load scenarios; leaves p.engine loaded (or None). False when the model cannot load."""
    for scenario in (COLD_LOAD, WARM_LOAD):
        if scenario not in config.scenarios:
            continue
        tick(f"{p.label} {scenario.replace('_', ' ')} #{repeat + 1}")
        _close(p)
        before = None
        if scenario == COLD_LOAD:
            ev = evict_files(model_files(p.file()))  # a split model: every file
            if not ev.evicted:
                runs.append(RunRecord(p.label, COLD_LOAD, "", repeat, "skipped", reason=ev.note))
                continue
            before = ev.resident_after
        rss.reset()
        t0 = time.perf_counter()
        try:
            p.engine = _load(config, p, load_fn)
        except KeyboardInterrupt:
            raise
        except Exception as exc:
            reason = f"{type(exc).__name__}: {exc}"
            runs.append(RunRecord(p.label, scenario, "", repeat, "failed", reason=reason))
            p.error = reason
            return False
        call_s = time.perf_counter() - t0
        notes = (ev.note,) if scenario == COLD_LOAD and ev.note else ()
        runs.append(
            RunRecord(
                p.label,
                scenario,
                "",
                repeat,
                "ok",
                load_s=float(p.engine.info.load_s),
                load_call_s=call_s,
                resident_before_load=before,
                peak_rss_bytes=rss.read_bytes(),
                notes=notes,
            )
        )
    return True
