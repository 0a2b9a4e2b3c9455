"""Kernel probe: decode synthetic models of known bytes through the engine, fit the step time.

Models (plan.py: built once by quant's synthetic builder, quantized by llama.cpp, kept in the cache):
one llama shape large enough to dwarf the caches per weight type (F16, and Q8_0/Q4_0
quantized from it); tiny models (weights of a few hundred KB, so ~0 bytes read from
memory) with few/many layers and a small/large vocabulary; and three small attention models
(head dimension 64, 128 and 256) decoded after a short and after a long prompt, the two in
alternating bursts (measure_pair: their difference is the attention). Each run goes through
`ondevice.engine` on the backend the engine uses; its median inter-token latency is one point. The fit gives

    step_s = sum_type bytes_type / bw_type + t0 + n_layer * layer_s + n_vocab * vocab_s
             + attn_scores * score_s(head_dims)

(each term set by the runs that carry its signal: see fit_points).
bw_type is the effective bandwidth the runtime's kernels reach on that weight type (the KV
cache, f16, counts as F16 bytes); t0 the fixed per-token cost (graph, launches, Python);
layer_s the per-layer cost (op dispatch, thread barriers, kernel launches); vocab_s the
per-vocabulary-entry cost (logits, sampling); score_s the cost per attention score (one
query head against one cached token in one layer: what GQA does not save on a CPU), measured
at each attention model's head (key + value dimensions: the dot product and the weighted sum)
and interpolated between them (roofline.score_s): heads of 64, 128 and 256, the common lengths.
A run's weight bytes are all counted as its main type (norms and the small head are < 1%).

Prefill (more than one token per llama_decode) is fitted apart, after the decode fit: each
sized model prefills n_prefill tokens in one chunk, and what that takes beyond the decode
step's terms is its matrix products, at type_gflops (GFLOP/s per weight type); the attention
models' long prompts (n_long tokens, whose attention is a large share) give attn_gflops.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path

from ondevice.core.errors import ProbeError
from ondevice.gguf.spec import ModelSpec, inspect
from ondevice.probing.kernelfit import FitPoint, fit_points, fit_prefill
from ondevice.probing.plan import PROBE_TYPES, KernelPlan, ProbeRun, Progress, plan_for, probe_models
from ondevice.probing.result import SMALL_TERMS, KernelPoint, KernelProbe

__all__ = [
    "KernelPlan",
    "plan_for",
    "probe_kernels",
    "fit_points",
    "fit_point",
    "measure",
    "measure_pair",
    "measure_run",
    "attention_pairs",
    "probe_models",
    "repacked_types",
    "fit_prefill",
    "prefill_observations",
    "measure_steps",
    "PROBE_TYPES",
    "SMALL_TERMS",
    "FitPoint",
    "ProbeRun",
]

# ---------- measuring ----------


def probe_prompt(n_vocab: int, n_tokens: int) -> list[int]:
    """A probe run's prompt: BOS, then ids spread over the vocabulary (specials and byte tokens skipped)."""
    return [1] + [3 + (i * 97) % (n_vocab - 3) for i in range(n_tokens - 1)]


def measure(
    path: Path, plan: KernelPlan, *, n_prompt: int, n_threads: int | None, n_gpu_layers, decode: bool = True
) -> tuple[float, str, int, ModelSpec, float]:
    """(median decode step s, backend, threads, spec, prefill s of the n_prompt tokens) of one
    model run through the engine. decode=False: the prefill only (timed after a short request has
    faulted the weights in), step s is 0."""
    from ondevice.engine import load
    from ondevice.engine.loader import MIN_N_CTX

    spec = inspect(path)
    n_ctx = max(
        MIN_N_CTX, n_prompt + plan.n_warmup + plan.n_tokens + 8
    )  # load() refuses less than llama.cpp's smallest
    eng = load(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_batch=512)
    try:
        vocab = spec.n_vocab or 512
        prompt = probe_prompt(vocab, n_prompt)
        if not decode:
            eng.generate(prompt[:_FAULT_IN_TOKENS], max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
            g = eng.generate(prompt, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
            return 0.0, eng.info.backend, eng.info.n_threads, spec, g.timings.prefill_s
        stream = eng.stream(
            prompt, max_tokens=plan.n_warmup + plan.n_tokens + 1, ignore_eos=True, seed=0, reuse_prefix=False
        )
        t_first = None
        for event in stream:  # a busy machine must not stretch the probe without bound
            if t_first is None:
                t_first = time.perf_counter()
            elif event.index > plan.n_warmup + 4 and time.perf_counter() - t_first > plan.run_budget_s:
                break
        stream.close()
        itl = stream.generation.timings.itl_s[plan.n_warmup :]
        if not itl:
            raise ProbeError(f"kernel probe: {path.name} produced no decode steps")
        return statistics.median(itl), eng.info.backend, eng.info.n_threads, spec, stream.generation.timings.prefill_s
    finally:
        eng.close()


def measure_pair(
    path: Path, plan: KernelPlan, n_prompts: tuple[int, int], *, n_threads: int | None, n_gpu_layers
) -> tuple[tuple[float, float], tuple[float, float], str, int, ModelSpec]:
    """One model decoded after two prompt lengths at once, in alternating bursts of PAIR_BURST steps
    (two contexts on the same weights): ((median step s), (prefill s), backend, threads, spec) per
    length. What the longer context adds is then measured in the same moments as what it adds to: on
    an AMD EPYC VM the difference of separate runs (the attention model at 16 and 2,048 tokens) spread
    0.8-2.7 ms over six tries, in alternating bursts 1.5-1.9 ms."""
    from ondevice.engine import load
    from ondevice.engine.loader import MIN_N_CTX

    spec = inspect(path)
    vocab = spec.n_vocab or 512
    bursts = max(1, -(-plan.n_tokens // PAIR_BURST))
    steps = plan.n_warmup + 1 + bursts * PAIR_BURST
    n_ctx = max(MIN_N_CTX, max(n_prompts) + steps + 8)
    engines = [load(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_batch=512) for _ in n_prompts]
    try:
        streams = [
            eng.stream(probe_prompt(vocab, n), max_tokens=steps, ignore_eos=True, seed=0, reuse_prefix=False)
            for eng, n in zip(engines, n_prompts)
        ]
        for stream in streams:  # the prompt, then the warm-up steps
            for _ in range(plan.n_warmup + 1):
                next(stream)
        times: tuple[list[float], list[float]] = ([], [])
        t_start = time.perf_counter()
        for burst in range(bursts):  # a busy machine must not stretch the probe without bound
            if burst >= 2 and time.perf_counter() - t_start > 2 * plan.run_budget_s:
                break
            for stream, taken in zip(streams, times):
                for _ in range(PAIR_BURST):
                    t = time.perf_counter()
                    next(stream)
                    taken.append(time.perf_counter() - t)
        prefills = []
        for stream in streams:
            stream.close()
            prefills.append(stream.generation.timings.prefill_s)
        info = engines[0].info
        return (
            (statistics.median(times[0]), statistics.median(times[1])),
            (prefills[0], prefills[1]),
            info.backend,
            info.n_threads,
            spec,
        )
    finally:
        for eng in engines:
            eng.close()


PAIR_BURST = 4  # measure_pair: decode steps of one context before switching to the other
_FAULT_IN_TOKENS = 8  # measure: the short request before a timed prefill (every matrix is read, the weights faulted in)
_LONG_STEP = 16  # measure_steps: a step of more tokens is timed once per call (a long, steady timing)


def measure_steps(path: Path, plan: KernelPlan, *, n_threads: int | None, n_gpu_layers) -> dict[int, float]:
    """{n: time of one llama_decode of n new tokens / time of one of 1 token} for n in plan.step_tokens,
    after a cached prompt of plan.n_prompt tokens: what a matrix product over n columns costs
    against one (CPU kernels change code paths with the column count: two columns can cost
    nearly two single steps, sixteen far less than sixteen). The short cached prompt keeps the
    attention, which the roofline prices apart, a small share of each step."""
    from ondevice.engine import load
    from ondevice.engine.loader import MIN_N_CTX

    spec = inspect(path)
    vocab = spec.n_vocab or 512
    n_ctx = max(MIN_N_CTX, plan.n_prompt + max(plan.step_tokens) + 8)
    eng = load(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_batch=512)
    try:
        prompt = probe_prompt(vocab, plan.n_prompt)
        eng.generate(prompt, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
        times: dict[int, list[float]] = {}
        calls = 0
        for rep in range(plan.step_reps):
            for n in (1,) + tuple(n for n in plan.step_tokens if rep == 0 or n <= _LONG_STEP):
                calls += 1  # each call's new tokens start differently: only the prompt is reused
                extra = [3 + (calls * 31 + j * 7) % (vocab - 3) for j in range(n)]
                g = eng.generate(prompt + extra, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=True)
                times.setdefault(n, []).append(g.timings.prefill_s)
        one = statistics.median(times.pop(1))
        return {n: statistics.median(t) / one for n, t in times.items()}
    finally:
        eng.close()


def attention_pairs(runs: list[ProbeRun]) -> dict[int, int]:
    """Index of each attention model's first run -> its other run's: the two are measured together
    (measure_pair)."""
    first: dict[Path, int] = {}
    pairs: dict[int, int] = {}
    for i, run in enumerate(runs):
        if run.role == "attn":
            if run.path in first:
                pairs[first[run.path]] = i
            else:
                first[run.path] = i
    return pairs


def measure_run(
    runs: list[ProbeRun], i: int, pairs: dict[int, int], plan: KernelPlan, *, n_threads: int | None, n_gpu_layers
) -> tuple[list[tuple[int, float, float]], str, int, ModelSpec | None]:
    """Run i measured ([(run index, step s, prefill s)], backend, threads, spec): with its partner when it
    opens a pair, nothing when a pair's second run (its partner measured it), else alone."""
    run = runs[i]
    if i in pairs.values():
        return [], "", 0, None
    if i in pairs:
        j = pairs[i]
        (step_i, step_j), (prefill_i, prefill_j), backend, threads, spec = measure_pair(
            run.path, plan, (run.n_prompt, runs[j].n_prompt), n_threads=n_threads, n_gpu_layers=n_gpu_layers
        )
        return [(i, step_i, prefill_i), (j, step_j, prefill_j)], backend, threads, spec
    step_s, backend, threads, spec, prefill_s = measure(
        run.path, plan, n_prompt=run.n_prompt, n_threads=n_threads, n_gpu_layers=n_gpu_layers, decode=not run.is_prefill
    )
    return [(i, step_s, prefill_s)], backend, threads, spec


def fit_point(run: ProbeRun, spec: ModelSpec, step_s: float, plan: KernelPlan) -> FitPoint:
    from ondevice.roofline import attention_head_dims, attention_scores

    n = plan.mid_context(run.n_prompt)
    step_bytes = spec.decode_weight_bytes + spec.kv_read_bytes(n)
    return FitPoint(
        run.role,
        run.weight_type,
        0 if run.role == "tiny" else step_bytes,
        spec.n_layer or 0,
        spec.n_vocab or 0,
        attention_scores(spec, n),
        attention_head_dims(spec),
        step_s,
        sum(spec.decode_rows_by_type.values()),
    )  # tiny: in cache, 0 B


def probe_kernels(
    plan: KernelPlan,
    model_dir: Path,
    *,
    n_threads: int | None = None,
    n_gpu_layers="auto",
    progress: Progress | None = None,
) -> KernelProbe:
    """Build (or reuse) the probe models, run each (plan.passes times, round-robin; the
    median pass counts: the prediction is for a typical generation, and one busy or lucky
    pass moves it no more than a middle one), fit the step-time model, then the prefill rates."""
    from ondevice.llama.guard import cpu_buffer_verdict

    say = progress or (lambda _msg: None)
    t_start = time.perf_counter()
    runs = probe_models(plan, model_dir, say)
    steps: list[list[float]] = [[] for _ in runs]  # step_s of each pass, per run (0 for prefill runs)
    prefills: list[list[float]] = [[] for _ in runs]  # prefill_s of each pass, per run
    specs: list[ModelSpec | None] = [None] * len(runs)
    ratios: dict[str, list[dict[int, float]]] = {t: [] for t in plan.types}  # per pass: n -> step ratio
    backend, threads = "CPU", 0
    pairs = attention_pairs(runs)
    for k in range(plan.passes):
        for i, run in enumerate(runs):
            if i in pairs.values():
                continue  # measured with its partner
            what = "prefilling" if run.is_prefill else "decoding"
            after = f"{run.n_prompt} and {runs[pairs[i]].n_prompt} (alternating)" if i in pairs else str(run.n_prompt)
            say(f"{what} {run.path.name} after {after} prompt tokens (pass {k + 1} of {plan.passes})")
            measured, backend, threads, spec = measure_run(
                runs, i, pairs, plan, n_threads=n_threads, n_gpu_layers=n_gpu_layers
            )
            for j, step_s, prefill_s in measured:
                steps[j].append(step_s)
                prefills[j].append(prefill_s)
                specs[j] = spec
            if run.role == "prefill" and plan.step_tokens:
                ratios[run.weight_type].append(
                    measure_steps(run.path, plan, n_threads=n_threads, n_gpu_layers=n_gpu_layers)
                )
    decode_runs = [i for i, run in enumerate(runs) if not run.is_prefill]
    fit_in = [fit_point(runs[i], specs[i], statistics.median(steps[i]), plan) for i in decode_runs]
    points = [
        KernelPoint(
            runs[i].weight_type,
            specs[i].decode_weight_bytes,
            fp.step_bytes - specs[i].decode_weight_bytes
            if runs[i].role != "tiny"
            else specs[i].kv_read_bytes(plan.mid_context(runs[i].n_prompt)),
            fp.step_s,
            plan.n_tokens,
            plan.mid_context(runs[i].n_prompt),
            fp.attn_scores,
            fp.head_dims,
            runs[i].role,
            fp.rows,
        )
        for i, fp in zip(decode_runs, fit_in)
    ]
    fit = fit_points(fit_in, plan.types)
    step_ratios = {
        t: {n: statistics.median(p[n] for p in passes) for n in passes[0]} for t, passes in ratios.items() if passes
    }
    prefill_in = prefill_observations(runs, specs, [statistics.median(p) for p in prefills], plan)
    points += [
        KernelPoint(
            wt,
            spec.decode_weight_bytes,
            0,
            t,
            n,
            n,
            0,
            0,
            "prefill" if kind == "sized" else f"{kind}-prefill",
            sum(spec.decode_rows_by_type.values()),
        )
        for spec, wt, n, t, kind in prefill_in
    ]
    rates = fit_prefill(prefill_in, {**fit, "step_ratios": step_ratios}, backend=backend, row_width=plan.row_width())
    cpu_buffers = cpu_buffer_verdict().mode
    return KernelProbe(
        backend=backend,
        n_threads=threads,
        n_gpu_layers=-1 if backend != "CPU" else 0,
        type_gbs=fit["type_gbs"],
        type_cached_gbs=fit["type_cached_gbs"],
        **{name: fit[name] for name in SMALL_TERMS},
        fit_rms_rel=fit["rms_rel_error"],
        points=tuple(points),
        elapsed_s=time.perf_counter() - t_start,
        pass_spread=statistics.median([max(st) / min(st) - 1 for run, st in zip(runs, steps) if run.role == "sized"]),
        cpu_buffers=cpu_buffers,
        type_gflops=rates["type_gflops"],
        attn_gflops=rates["attn_gflops"],
        batch_row_s=rates["batch_row_s"],
        batch_row_width=plan.row_width(),
        repacked_types=repacked_types(runs, backend, cpu_buffers),
        step_ratios=step_ratios,
    )


def repacked_types(runs: list[ProbeRun], backend: str, cpu_buffers: str) -> tuple[str, ...]:
    """The weight types whose sized model llama.cpp places in CPU_REPACK here (its tiled kernels: Q4_0 and
    Q4_K on an x86 CPU with AVX2); () off the CPU or when the crash guard's verdict (cpu_buffers) is "none".
    The narrow model's per-row cost (Q8_0, never repacked) measures the plain kernels, so these types do not
    pay it (replaying run 22 on an AMD EPYC VM: a 50 MB Q4_0 model's 128-token TTFT, predicted +31% over
    measured with it, came to +14% without)."""
    from ondevice.llama.model import repack_plan

    if backend.upper() != "CPU" or cpu_buffers == "none":
        return ()
    return tuple(r.weight_type for r in runs if r.role == "sized" and repack_plan(r.path))


def prefill_observations(
    runs: list[ProbeRun], specs: list, prefill_s: list[float], plan: KernelPlan
) -> list[tuple[ModelSpec, str, int, float, str]]:
    """What fit_prefill takes from the runs: the prefill runs (kind "sized" or "narrow"), and the attention
    models' long prompts (kind "attn")."""
    kinds = {"prefill": "sized", "narrow-prefill": "narrow"}
    return [
        (spec, run.weight_type, run.n_prompt, t, kinds.get(run.role, "attn"))
        for run, spec, t in zip(runs, specs, prefill_s)
        if run.is_prefill or (run.role == "attn" and run.n_prompt == plan.n_long)
    ]
