"""What a bench will measure: its settings (BenchConfig), and each model resolved, inspected and given the suite
fitted to its context (ModelPlan, plan_bench). ondevice.bench.runner runs the plans."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ondevice.bench.runs import SCENARIOS
from ondevice.bench.suites import Suite, fit_suite
from ondevice.core.errors import BenchError
from ondevice.engine.interface import Predictor
from ondevice.engine.sampling import DEFAULTS
from ondevice.gguf.spec import ModelSpec, inspect
from ondevice.models.materialize import resolve_model

__all__ = ["BenchConfig", "ModelPlan", "plan_bench", "DEFAULT_SAMPLING"]

DEFAULT_SAMPLING = DEFAULTS.sampler_settings()  # the engine's defaults; --temperature may change one


@dataclass(frozen=True)
class BenchConfig:
    models: tuple[str | None, ...]  # model references (None = the default model)
    suite: Suite  # workloads, repeats, warm-up
    scenarios: tuple[str, ...]  # subset of runs.SCENARIOS
    cap_to_context: bool = True  # built-in suites cap long prompts; custom -p/-n beyond the context is an error
    n_ctx: int | None = None  # context size, tokens (None: the smallest multiple of 256 that fits the suite)
    n_threads: int | None = None  # None: the engine's default
    n_batch: int | None = None  # prompt tokens per llama_decode call (None: llama.cpp's default)
    n_gpu_layers: int | str = "auto"  # layers offloaded
    flash_attn: bool | str = "auto"  # llama.cpp flash attention: "auto" (its default), True, False
    n_ubatch: int | None = None  # tokens per compute pass inside a call (None: llama.cpp's default)
    cache_type_k: str = "f16"  # K cache element type
    cache_type_v: str = "f16"  # V cache element type
    fit: bool = False  # choose the context and offload that fit the free memory (ondevice.load's fit)
    sampling: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SAMPLING))  # sampler settings
    seed: int = 0  # prompt text and sampling seeds derive from it
    timeout_s: float | None = None  # per request, seconds
    spec_exact: bool | None = None  # the speculative scenario's exact setting (None: the engine's default)
    state_dir: Path | None = None  # the restore scenario's state files (None: <cache dir>/bench/states)


@dataclass
class ModelPlan:
    """One model to measure (mutable while the bench runs: engine, info)."""

    ref: str | None  # as given on the command line
    label: str  # file name, unique within the bench
    path: Path | None  # resolved GGUF path
    spec: ModelSpec | None  # from the file header
    n_ctx: int  # context the engine is loaded with, tokens
    suite: Suite  # the suite fitted to this model's context
    error: str = ""  # why it cannot run (a file that is not a usable GGUF)
    engine_info: dict[str, Any] = field(default_factory=dict)  # backend, threads, ... from the first load
    predictor: Predictor | None = None  # the engine's roofline predictor, or None
    engine: Any = None  # the loaded Engine, while loaded
    warmed: bool = False  # the loaded engine has had its warm-up requests
    disk_read_gbs: float | None = None  # the probe's disk read (cold-start prediction), GB/s; None: not probed
    disk_note: str = ""  # what to know about that figure (another file system, ...)
    cold_prompt: Any = None  # the cold start's prompt (text, or ids), built once
    cold_prompt_note: str = ""  # said when the prompt had to be ids
    state_disk: tuple[float | None, str] | None = None  # restore: the probe's disk read where states go (GB/s, note)

    def file(self) -> Path:
        """The resolved GGUF path; BenchError for a plan that has none (its `error` says why)."""
        if self.path is None:
            raise BenchError(f"{self.label}: no model file ({self.error or 'not resolved'})")
        return self.path


def plan_bench(config: BenchConfig) -> list[ModelPlan]:
    """Resolve and inspect every model and fit the suite to its context.

    Raises BenchError/ModelNotFoundError on bad input (unknown model, -p/-n beyond the
    context, unknown scenario). A file that exists but is not a usable GGUF becomes a
    failed model, so the others still run.
    """
    unknown = [s for s in config.scenarios if s not in SCENARIOS]
    if unknown:
        raise BenchError(f"unknown scenario {unknown[0]!r} (known: {', '.join(SCENARIOS)})")
    if config.n_ctx is not None and config.n_ctx < 2:
        raise BenchError(f"--n-ctx {config.n_ctx}: must be at least 2")
    plans: list[ModelPlan] = []
    labels: set[str] = set()
    for ref in config.models:
        path = resolve_model(ref)
        label = path.name
        while label in labels:
            label = f"{label}#{len(labels)}"
        labels.add(label)
        try:
            spec = inspect(path)
        except Exception as exc:  # GGUFFormatError, OSError: a failed model, not bad input
            plans.append(
                ModelPlan(ref, label, path, None, config.n_ctx or 0, config.suite, error=f"{type(exc).__name__}: {exc}")
            )
            continue
        n_ctx, suite = _fit(config, spec)
        plans.append(ModelPlan(ref, label, path, spec, n_ctx, suite))
    return plans


def _fit(config: BenchConfig, spec: ModelSpec) -> tuple[int, Suite]:
    limit = config.n_ctx or spec.n_ctx_train or 4096
    if config.n_ctx and spec.n_ctx_train and config.n_ctx > spec.n_ctx_train:
        raise BenchError(
            f"--n-ctx {config.n_ctx} exceeds {spec.name or spec.path}'s trained context of {spec.n_ctx_train} tokens"
        )
    suite = fit_suite(config.suite, limit, cap=config.cap_to_context)
    if config.n_ctx:
        return config.n_ctx, suite
    need = max(w.prompt_tokens + w.output_tokens for w in suite.workloads)
    return min(limit, -(-need // 256) * 256), suite
