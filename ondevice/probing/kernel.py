"""Kernel probe: decode synthetic models of known bytes through the engine, fit the step time.

Models (built once by quant's synthetic builder, quantized by llama.cpp, kept in the cache):
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

from ondevice.errors import ProbeError
from ondevice.modelspec import ModelSpec, inspect
from ondevice.probing.kernelfit import FitPoint, fit_points, fit_prefill
from ondevice.probing.result import SMALL_TERMS, KernelPoint, KernelProbe
from ondevice.roofline import bits_per_weight

__all__ = ["KernelPlan", "plan_for", "probe_kernels", "fit_points", "fit_point", "measure", "measure_pair", "measure_run",
           "attention_pairs", "probe_models",
           "fit_prefill", "prefill_observations", "measure_steps", "PROBE_TYPES", "SMALL_TERMS", "FitPoint", "ProbeRun"]

PROBE_TYPES = ("Q4_0", "Q4_K", "Q5_0", "Q6_K", "Q8_0", "F16")  # the common GGUF types: each has its own CPU kernels
_FILE_TYPE = {"Q4_K": "Q4_K_S"}  # the quantizer's file type whose matrices are (nearly all) this tensor type
_MB = 1 << 20
_SIZED_MIN = 256 * _MB  # the F16 sized model is at least this, and the Q4_0 one >= 4x the last-level cache

Progress = Callable[[str], None]  # one line describing the step now running


@dataclass(frozen=True)
class KernelPlan:
    """Shapes and sizes of the probe models, and how long to decode each."""

    d_model: int = 2048  # width of the sized models (a multiple of 256)
    n_head: int = 16  # query heads
    n_head_kv: int = 4  # KV heads
    d_ff: int = 5632  # feed-forward width
    n_layer: int = 5  # blocks of the sized models
    n_vocab: int = 512  # vocabulary of the sized models (keeps the head < 1% of the bytes)
    tiny_d_model: int = 64  # width of the tiny models (weights stay in cache)
    tiny_layers: tuple[int, int] = (2, 16)  # blocks of the two tiny models (per-layer cost)
    tiny_vocab: int = 32000  # vocabulary of the large-vocab tiny model (per-entry cost)
    attn_shapes: tuple[tuple[int, int, int, int], ...] = ((1024, 16, 4, 8), (2048, 16, 4, 8), (1024, 4, 1, 8))  # attention
    # models: d_model, heads, KV heads, blocks (head dimension 64, 128 and 256: Llama 3.2 1B's, Llama 3 8B's and
    # Qwen's, Gemma's; per score they cost 12, ~35 and 11-18 ns on an AMD EPYC VM, no line through them)
    attn_d_ff: int = 256  # feed-forward width of the attention models (small: the context's cost stands out)
    n_long: int = 2048  # prompt tokens of the attention model's long-context run (attention dominates there)
    narrow: tuple[int, int, int, int] = (640, 5, 1, 2048)  # the narrow model: d_model, heads, KV heads, d_ff (rows
    # of 640: Gemma 3 270M's width; against the sized models' 2,048 it sets the cost per matrix row)
    narrow_type: str = "Q8_0"  # its weight type (not repacked on x86, like most heads)
    narrow_layers: int = 26  # its blocks (plan_for: >= 4 x LLC of weights)
    cached: tuple[int, int, int, int] = (1024, 16, 4, 1024)  # the cached models, one per type: d_model, heads, KV heads,
    # d_ff; as many blocks as make cached_bytes (weights the caches hold: how fast each type's kernel goes from them)
    cached_bytes: int = 8 * _MB  # weights of each cached model (plan_for: at most a quarter of the LLC); large enough
    # that reading them, not the fixed costs, is most of a step
    n_prompt: int = 16  # prompt tokens before decoding (every other run)
    n_prefill: int = 512  # prompt tokens of the sized models' prefill runs: one llama_decode chunk of the engine's
    # default n_batch (a longer prompt is such chunks), so the batched rates are fitted at the chunk prompts use
    step_tokens: tuple[int, ...] = (2, 3, 4, 8, 16, 32, 64, 128)  # tokens per llama_decode timed against one (the
    # prefill runs): per token a matrix product costs more over few columns than over many (an AMD EPYC VM, sized Q5_0:
    # 4.5 ms a token at 16-64, 3.8 at 128, 3.5 at 256), so a short prompt's chunk is timed, not interpolated
    step_reps: int = 3  # timings of each up to 16 tokens, the median kept (longer steps: one per pass)
    n_tokens: int = 32  # decode steps timed per model (after n_warmup)
    n_warmup: int = 3  # decode steps dropped first (page faults, caches)
    run_budget_s: float = 4.0  # a run stops decoding after this many seconds (>= 4 timed steps kept)
    passes: int = 3  # every run is decoded this many times, round-robin; the median pass counts
    types: tuple[str, ...] = PROBE_TYPES  # weight types probed

    def layer_bytes_f16(self) -> int:
        return round(layer_bytes((self.d_model, self.n_head, self.n_head_kv, self.d_ff), "F16"))

    def row_width(self) -> float:
        """Weights per matrix row of the sized models (Calibration.batch_row_width): about 2,446 for the default shape."""
        d, kv_dim, d_ff = self.d_model, self.n_head_kv * (self.d_model // self.n_head), self.d_ff
        return (2 * d * d + 2 * kv_dim * d + 3 * d_ff * d) / (2 * d + 2 * kv_dim + 2 * d_ff + d)

    def mid_context(self, n_prompt: int) -> int:
        """The context at the middle of the timed decode steps of a run with n_prompt tokens."""
        return n_prompt + self.n_warmup + self.n_tokens // 2


def layer_bytes(shape: tuple[int, int, int, int], weight_type: str) -> float:
    """Bytes of one block of a probe model: shape (d_model, heads, KV heads, d_ff), its matrices (Q, K, V, O,
    gate, up, down) in weight_type."""
    d, heads, kv_heads, d_ff = shape
    return (2 * d * d + 2 * kv_heads * (d // heads) * d + 3 * d_ff * d) * bits_per_weight(weight_type) / 8


def plan_for(llc_bytes: int | None) -> KernelPlan:
    """Sized models that dwarf the caches: Q4_0 (4.5 bits per weight) >= 4 x LLC, F16 >= 256 MiB; the narrow
    Q8_0 model >= 4 x LLC and 128 MiB."""
    plan = KernelPlan()
    target = max(_SIZED_MIN, 4 * (llc_bytes or 0) * 16 // 4.5)
    narrow_target = max(128 * _MB, 4 * (llc_bytes or 0))
    return replace(plan, n_layer=max(1, int(-(-target // plan.layer_bytes_f16()))),
                   narrow_layers=max(1, int(-(-narrow_target // layer_bytes(plan.narrow, plan.narrow_type or "Q8_0")))),
                   cached_bytes=max(_MB, min(plan.cached_bytes, (llc_bytes or 4 * plan.cached_bytes) // 4)))


@dataclass(frozen=True)
class ProbeRun:
    """One decode run of the kernel probe."""

    weight_type: str  # main weight type of the model
    path: Path  # the model file
    n_prompt: int  # prompt tokens before the timed steps
    role: str  # "sized" (bandwidth), "narrow" (cost per row), "cached" (kernel speed from the caches),
    # "tiny" (fixed costs), "attn" (attention),
    # "prefill" (batched rate) or "narrow-prefill" (batched cost per row)

    @property
    def is_prefill(self) -> bool:
        """A prefill run (timed for its prompt only, no decode)."""
        return self.role.endswith("prefill")


# ---------- models ----------

def _synth_kwargs(plan: KernelPlan, kind: str, n_layer: int, n_vocab: int, attn_shape=None) -> dict:
    """SynthConfig fields of a sized, narrow, tiny or attention probe model (attn_shape: one of plan.attn_shapes)."""
    if kind == "cached":
        d, heads, kv_heads, d_ff = plan.cached
        return dict(d_model=d, n_head=heads, n_head_kv=kv_heads, d_ff=d_ff, n_layer=n_layer, n_vocab=n_vocab,
                    n_ctx_train=1024, seed=17, name="ondevice-probe-cached")
    if kind == "narrow":
        d, heads, kv_heads, d_ff = plan.narrow
        return dict(d_model=d, n_head=heads, n_head_kv=kv_heads, d_ff=d_ff, n_layer=n_layer, n_vocab=n_vocab,
                    n_ctx_train=1024, seed=13, name="ondevice-probe-narrow")
    if kind == "tiny":
        d = plan.tiny_d_model if n_vocab <= 512 else plan.tiny_d_model // 4  # a thin head: the vocabulary's
        # per-entry cost (logits, sampling) more than the head's cache-speed matmul
        return dict(d_model=d, n_head=max(1, d // 32), n_head_kv=1, d_ff=2 * d, n_layer=n_layer,
                    n_vocab=n_vocab, n_ctx_train=1024, seed=7, name="ondevice-probe-tiny")
    if kind == "attn":
        d, heads, kv_heads, blocks = attn_shape
        return dict(d_model=d, n_head=heads, n_head_kv=kv_heads, d_ff=plan.attn_d_ff, n_layer=blocks, n_vocab=n_vocab,
                    n_ctx_train=max(1024, 2 * plan.n_long), seed=5, name="ondevice-probe-attn")
    return dict(d_model=plan.d_model, n_head=plan.n_head, n_head_kv=plan.n_head_kv, d_ff=plan.d_ff, n_layer=n_layer,
                n_vocab=n_vocab, n_ctx_train=1024, seed=11, name="ondevice-probe")


def _model_path(model_dir: Path, kind: str, cfg: dict, weight_type: str) -> Path:
    tag = f"{kind}-d{cfg['d_model']}-l{cfg['n_layer']}-f{cfg['d_ff']}-v{cfg['n_vocab']}-h{cfg['n_head']}x{cfg['n_head_kv']}"
    return model_dir / f"{tag}-{weight_type}.gguf"


def _ensure(model_dir: Path, kind: str, cfg: dict, weight_type: str, progress: Progress) -> Path:
    """The F16 model for cfg (built if missing), quantized to weight_type (if missing)."""
    from ondevice.quant.synth import SynthConfig, build_synthetic_model

    f16 = _model_path(model_dir, kind, cfg, "F16")
    if not f16.exists():
        progress(f"building {f16.name}")
        build_synthetic_model(SynthConfig(dtype="F16", **cfg), f16)
    if weight_type == "F16":
        return f16
    out = _model_path(model_dir, kind, cfg, weight_type)
    if not out.exists():
        from ondevice.quant.quantize import quantize

        progress(f"quantizing {out.name}")
        quantize(f16, out, _FILE_TYPE.get(weight_type, weight_type))
    return out


def probe_models(plan: KernelPlan, model_dir: Path, progress: Progress) -> list[ProbeRun]:
    """Every run the plan decodes, building the models that are missing."""
    model_dir.mkdir(parents=True, exist_ok=True)
    runs: list[ProbeRun] = []
    cfg = _synth_kwargs(plan, "sized", plan.n_layer, plan.n_vocab)
    for t in plan.types:
        runs.append(ProbeRun(t, _ensure(model_dir, "sized", cfg, t, progress), plan.n_prompt, "sized"))
    if plan.narrow_type:
        narrow = _ensure(model_dir, "narrow", _synth_kwargs(plan, "narrow", plan.narrow_layers, plan.n_vocab),
                         plan.narrow_type, progress)
        runs.append(ProbeRun(plan.narrow_type, narrow, plan.n_prompt, "narrow"))
    if plan.cached:
        for t in plan.types:
            blocks = max(1, round(plan.cached_bytes / layer_bytes(plan.cached, t)))
            cfg = _synth_kwargs(plan, "cached", blocks, plan.n_vocab)
            runs.append(ProbeRun(t, _ensure(model_dir, "cached", cfg, t, progress), plan.n_prompt, "cached"))
    tiny = [(plan.tiny_layers[0], 512, t) for t in plan.types]
    tiny += [(plan.tiny_layers[1], 512, "F16"), (plan.tiny_layers[0], plan.tiny_vocab, "F16")]
    for n_layer, n_vocab, t in tiny:
        runs.append(ProbeRun(t, _ensure(model_dir, "tiny", _synth_kwargs(plan, "tiny", n_layer, n_vocab), t, progress),
                             plan.n_prompt, "tiny"))
    prefill_role = {"sized": "prefill", "narrow": "narrow-prefill"}
    runs += [ProbeRun(r.weight_type, r.path, plan.n_prefill, prefill_role[r.role]) for r in runs if r.role in prefill_role]
    for shape in plan.attn_shapes:
        attn = _ensure(model_dir, "attn", _synth_kwargs(plan, "attn", shape[3], 512, shape), "F16", progress)
        runs += [ProbeRun("F16", attn, plan.n_prompt, "attn"), ProbeRun("F16", attn, plan.n_long, "attn")]
    return runs


# ---------- measuring ----------

def probe_prompt(n_vocab: int, n_tokens: int) -> list[int]:
    """A probe run's prompt: BOS, then ids spread over the vocabulary (specials and byte tokens skipped)."""
    return [1] + [3 + (i * 97) % (n_vocab - 3) for i in range(n_tokens - 1)]


def measure(path: Path, plan: KernelPlan, *, n_prompt: int, n_threads: int | None,
            n_gpu_layers, decode: bool = True) -> tuple[float, str, int, ModelSpec, float]:
    """(median decode step s, backend, threads, spec, prefill s of the n_prompt tokens) of one
    model run through the engine. decode=False: the prefill only (timed after a short request has
    faulted the weights in), step s is 0."""
    from ondevice.engine import load
    from ondevice.engine.loader import MIN_N_CTX

    spec = inspect(path)
    n_ctx = max(MIN_N_CTX, n_prompt + plan.n_warmup + plan.n_tokens + 8)  # load() refuses less than llama.cpp's smallest
    eng = load(path, n_ctx=n_ctx, n_threads=n_threads, n_gpu_layers=n_gpu_layers, n_batch=512)
    try:
        vocab = spec.n_vocab or 512
        prompt = probe_prompt(vocab, n_prompt)
        if not decode:
            eng.generate(prompt[:_FAULT_IN_TOKENS], max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
            g = eng.generate(prompt, max_tokens=1, ignore_eos=True, seed=0, reuse_prefix=False)
            return 0.0, eng.info.backend, eng.info.n_threads, spec, g.timings.prefill_s
        stream = eng.stream(prompt, max_tokens=plan.n_warmup + plan.n_tokens + 1, ignore_eos=True, seed=0,
                            reuse_prefix=False)
        t_first = None
        for event in stream:  # a busy machine must not stretch the probe without bound
            if t_first is None:
                t_first = time.perf_counter()
            elif event.index > plan.n_warmup + 4 and time.perf_counter() - t_first > plan.run_budget_s:
                break
        stream.close()
        itl = stream.generation.timings.itl_s[plan.n_warmup:]
        if not itl:
            raise ProbeError(f"kernel probe: {path.name} produced no decode steps")
        return statistics.median(itl), eng.info.backend, eng.info.n_threads, spec, stream.generation.timings.prefill_s
    finally:
        eng.close()


def measure_pair(path: Path, plan: KernelPlan, n_prompts: tuple[int, int], *, n_threads: int | None,
                 n_gpu_layers) -> tuple[tuple[float, float], tuple[float, float], str, int, ModelSpec]:
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
        streams = [eng.stream(probe_prompt(vocab, n), max_tokens=steps,
                              ignore_eos=True, seed=0, reuse_prefix=False) for eng, n in zip(engines, n_prompts)]
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
        return ((statistics.median(times[0]), statistics.median(times[1])), (prefills[0], prefills[1]),
                info.backend, info.n_threads, spec)
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


def measure_run(runs: list[ProbeRun], i: int, pairs: dict[int, int], plan: KernelPlan, *, n_threads: int | None,
                n_gpu_layers) -> tuple[list[tuple[int, float, float]], str, int, ModelSpec | None]:
    """Run i measured ([(run index, step s, prefill s)], backend, threads, spec): with its partner when it
    opens a pair, nothing when a pair's second run (its partner measured it), else alone."""
    run = runs[i]
    if i in pairs.values():
        return [], "", 0, None
    if i in pairs:
        j = pairs[i]
        (step_i, step_j), (prefill_i, prefill_j), backend, threads, spec = measure_pair(
            run.path, plan, (run.n_prompt, runs[j].n_prompt), n_threads=n_threads, n_gpu_layers=n_gpu_layers)
        return [(i, step_i, prefill_i), (j, step_j, prefill_j)], backend, threads, spec
    step_s, backend, threads, spec, prefill_s = measure(run.path, plan, n_prompt=run.n_prompt, n_threads=n_threads,
                                                        n_gpu_layers=n_gpu_layers, decode=not run.is_prefill)
    return [(i, step_s, prefill_s)], backend, threads, spec


def fit_point(run: ProbeRun, spec: ModelSpec, step_s: float, plan: KernelPlan) -> FitPoint:
    from ondevice.roofline import attention_head_dims, attention_scores

    n = plan.mid_context(run.n_prompt)
    step_bytes = spec.decode_weight_bytes + spec.kv_read_bytes(n)
    return FitPoint(run.role, run.weight_type, 0 if run.role == "tiny" else step_bytes, spec.n_layer or 0,
                    spec.n_vocab or 0, attention_scores(spec, n), attention_head_dims(spec), step_s,
                    sum(spec.decode_rows_by_type.values()))  # tiny: in cache, 0 B


def probe_kernels(plan: KernelPlan, model_dir: Path, *, n_threads: int | None = None, n_gpu_layers="auto",
                  progress: Progress | None = None) -> KernelProbe:
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
            measured, backend, threads, spec = measure_run(runs, i, pairs, plan, n_threads=n_threads,
                                                           n_gpu_layers=n_gpu_layers)
            for j, step_s, prefill_s in measured:
                steps[j].append(step_s)
                prefills[j].append(prefill_s)
                specs[j] = spec
            if run.role == "prefill" and plan.step_tokens:
                ratios[run.weight_type].append(measure_steps(run.path, plan, n_threads=n_threads,
                                                             n_gpu_layers=n_gpu_layers))
    decode_runs = [i for i, run in enumerate(runs) if not run.is_prefill]
    fit_in = [fit_point(runs[i], specs[i], statistics.median(steps[i]), plan) for i in decode_runs]
    points = [KernelPoint(runs[i].weight_type, specs[i].decode_weight_bytes, fp.step_bytes - specs[i].decode_weight_bytes if
                          runs[i].role != "tiny" else specs[i].kv_read_bytes(plan.mid_context(runs[i].n_prompt)), fp.step_s,
                          plan.n_tokens, plan.mid_context(runs[i].n_prompt), fp.attn_scores, fp.head_dims, runs[i].role,
                          fp.rows)
              for i, fp in zip(decode_runs, fit_in)]
    fit = fit_points(fit_in, plan.types)
    step_ratios = {t: {n: statistics.median(p[n] for p in passes) for n in passes[0]}
                   for t, passes in ratios.items() if passes}
    prefill_in = prefill_observations(runs, specs, [statistics.median(p) for p in prefills], plan)
    points += [KernelPoint(wt, spec.decode_weight_bytes, 0, t, n, n, 0, 0, "prefill" if kind == "sized" else f"{kind}-prefill",
                           sum(spec.decode_rows_by_type.values())) for spec, wt, n, t, kind in prefill_in]
    rates = fit_prefill(prefill_in, {**fit, "step_ratios": step_ratios}, backend=backend, row_width=plan.row_width())
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
        cpu_buffers=cpu_buffer_verdict().mode,
        type_gflops=rates["type_gflops"],
        attn_gflops=rates["attn_gflops"],
        batch_row_s=rates["batch_row_s"],
        batch_row_width=plan.row_width(),
        step_ratios=step_ratios,
    )


def prefill_observations(runs: list[ProbeRun], specs: list, prefill_s: list[float],
                         plan: KernelPlan) -> list[tuple[ModelSpec, str, int, float, str]]:
    """What fit_prefill takes from the runs: the prefill runs (kind "sized" or "narrow"), and the attention
    models' long prompts (kind "attn")."""
    kinds = {"prefill": "sized", "narrow-prefill": "narrow"}
    return [(spec, run.weight_type, run.n_prompt, t, kinds.get(run.role, "attn")) for run, spec, t in zip(runs, specs, prefill_s)
            if run.is_prefill or (run.role == "attn" and run.n_prompt == plan.n_long)]
