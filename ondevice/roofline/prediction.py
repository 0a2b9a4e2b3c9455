"""roofline.predict(): per-context ceilings and predictions, the TTFT floor, the memory verdict."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ondevice.core.errors import InvalidParameterError, ProbeError, SpecError
from ondevice.gguf.spec import ModelSpec, inspect
from ondevice.roofline.estimate import Estimate, caveats, estimated_calibration, estimates_for
from ondevice.roofline.memory import FITS_SHARE, MemoryVerdict, memory_verdict
from ondevice.roofline.model import Calibration, Predictor, chunk_flops
from ondevice.roofline.spec import positive_number
from ondevice.roofline.target import Target, ttft_compute
from ondevice.roofline.timing import ShapeTiming, TimedPredictor

__all__ = [
    "predict",
    "check_contexts",
    "Prediction",
    "ContextPrediction",
    "TTFTPrediction",
    "MemoryVerdict",
    "RequestPrediction",
    "request_prediction",
    "prefill_flops",
    "memory_verdict",
    "FITS_SHARE",
    "timing_notes",
]

DEFAULT_PROMPT_TOKENS = 1024  # the request predicted when no prompt length is given
_UNIFIED_GPU_SHARE = 0.75  # share of unified memory a GPU may wire (macOS default working-set limit)


@dataclass(frozen=True)
class ContextPrediction:
    n_ctx: int  # context length, tokens
    weight_bytes: int  # weight bytes one decode step reads
    kv_bytes: int  # KV-cache bytes one decode step reads at this context
    ceiling_step_s: float  # pure bandwidth bound on the step time, seconds
    ceiling_tok_s: float  # 1 / ceiling_step_s: measured decode tok/s never beats it
    predicted_step_s: float | None  # predicted step time, seconds (None: the model was not timed here)
    predicted_tok_s: float | None  # 1 / predicted_step_s


@dataclass(frozen=True)
class TTFTPrediction:
    prompt_tokens: int  # P
    prefill_flops: float  # 2*N_matmul*P + attention FLOPs (causal, windows capped)
    compute_gflops: float  # achievable GFLOP/s used
    compute_s: float  # prefill_flops / compute
    bandwidth_s: float  # one read of the weights (prefill reads them at least once)
    floor_s: float  # max(compute_s, bandwidth_s): TTFT is at least this


@dataclass(frozen=True)
class RequestPrediction:
    """One request of P prompt and N output tokens, predicted (the timeline of the source articles:
    TTFT = prefill, then N - 1 decode steps over the growing context)."""

    prompt_tokens: int  # P, all computed (nothing cached)
    output_tokens: int | None  # N (None: TTFT only)
    ttft_s: float | None  # predicted time to first token, seconds (None: nothing timed, and no compute figure)
    decode_s: float | None  # predicted time of the N - 1 decode steps after it, seconds
    e2e_s: float | None  # ttft_s + decode_s
    tpot_s: float | None  # decode_s / (N - 1): the mean inter-token latency (None for N < 2)
    output_tok_s: float | None  # N / e2e_s: output throughput
    prefill_share: float | None  # ttft_s / e2e_s: which side of the wait a lever can shorten
    basis: str  # "calibrated" (the model's shape timed on this machine), "estimate" (decode
    # fitted on published llama.cpp runs; TTFT a floor at the compute figure) or "bound" (both bounds)


@dataclass(frozen=True)
class Prediction:
    model: str  # file path or a description of the typed-in spec
    quant: str | None  # quant label
    backend: str  # backend the figures are for
    bandwidth_gbs: float  # bandwidth of the pure ceiling, GB/s
    bandwidth_source: str  # "measured" (probe), "given", ...
    calibrated: bool  # the predicted_* figures come from the model's shape timed on this machine
    contexts: tuple[ContextPrediction, ...]  # one per requested context
    ttft: TTFTPrediction | None  # None without a compute figure or prompt length
    memory: MemoryVerdict
    notes: tuple[str, ...] = ()  # caveats (approximations, missing data)
    estimates: tuple[Estimate, ...] = ()  # per context (same order), fitted on published runs; () when calibrated
    request: RequestPrediction | None = None  # the request of prompt_tokens (and output_tokens) predicted

    def to_dict(self) -> dict:
        d = asdict(self)
        d["contexts"] = [asdict(c) for c in self.contexts]
        d["notes"] = list(self.notes)
        d["estimates"] = [asdict(e) for e in self.estimates]
        d["request"] = asdict(self.request) if self.request else None
        return d


def predict(
    model_or_spec=None,
    *,
    ctx=(128, 2048),
    probe=None,
    bandwidth_gbs: float | None = None,
    prompt_tokens: int | str | None = "default",
    n_batch: int = 512,
    available_bytes: int | None = None,
    output_tokens: int | None = None,
    target: Target | None = None,
    timing: ShapeTiming | None = None,
) -> Prediction:
    """Ceiling, calibrated prediction, TTFT floor and memory verdict for a model.

    model_or_spec: a ModelSpec, a GGUF path or registry name (None = the default model).
    prompt_tokens: the request's prompt ("default": 1024, or the trained context when shorter; None:
    no TTFT); output_tokens: its output (decode time, E2E, the prefill share).
    probe: a ProbeResult (ondevice.predict passes this machine's cached one); needed unless
    bandwidth_gbs is given. bandwidth_gbs: a bandwidth to use instead of the measured one (a
    machine you do not own); the prediction is then the ceiling and an estimate fitted on published
    llama.cpp runs. target: that machine's backend, compute and memory (roofline.target.make_target).
    timing: the model's shape timed on this machine (probing.timing_for): the predicted figures come from it.
    """
    spec = model_or_spec if isinstance(model_or_spec, ModelSpec) else inspect(_resolve(model_or_spec))
    if not spec.decode_weight_bytes:
        raise SpecError(f"{spec.path or spec.name}: no weights to predict for")
    contexts = check_contexts(ctx, spec)
    if prompt_tokens == "default":
        prompt_tokens = min(DEFAULT_PROMPT_TOKENS, spec.n_ctx_train or DEFAULT_PROMPT_TOKENS)
    if prompt_tokens is not None:
        prompt_tokens = _positive_int("prompt tokens", prompt_tokens)
    if output_tokens is not None:
        output_tokens = _positive_int("output tokens", output_tokens)
        if prompt_tokens is None:
            raise InvalidParameterError("output tokens need a prompt length too")
    if prompt_tokens is not None and spec.n_ctx_train and prompt_tokens + (output_tokens or 0) > spec.n_ctx_train:
        raise InvalidParameterError(
            f"a prompt of {prompt_tokens} tokens + {output_tokens or 0} output tokens is longer "
            f"than the model's trained context of {spec.n_ctx_train} tokens"
        )
    if bandwidth_gbs is not None:
        bandwidth_gbs = positive_number("bandwidth", bandwidth_gbs, InvalidParameterError, unit="GB/s", most=1e5)
    if target is not None and bandwidth_gbs is None:
        raise InvalidParameterError("a target machine needs its bandwidth (bandwidth_gbs)")
    if probe is None and bandwidth_gbs is None:
        raise ProbeError(
            "no probe results: pass a probe (ondevice.predict reads this machine's cached one) or a bandwidth"
        )
    notes = list(spec.warnings)
    if bandwidth_gbs is not None:
        cal = Calibration(
            backend=(target and target.backend) or (probe.backend if probe else "given"),
            ceiling_gbs=bandwidth_gbs,
            compute_gflops=probe.compute.f32_gflops if probe and probe.compute else None,
        )
        source, calibrated = "given", False
        notes.append("bandwidth given: nothing timed (ceiling: the bound; estimate: fitted on published runs)")
        if probe is not None and target is None and probe.compute:
            notes.append("TTFT floor and memory verdict are for this machine (its measured compute and free memory)")
        elif probe is not None and target is None:
            notes.append("memory verdict is for this machine (its free memory)")
    else:
        cal = probe.calibration()
        calibrated = timing is not None
        notes += (
            timing_notes(timing)
            if timing is not None
            else ["this model's shape was not timed here: the figures are the bound and an estimate"]
        )
        source = "measured"
    gflops, compute_note = ttft_compute(cal.backend, cal.compute_gflops, probe, target)
    floor_cal = replace(cal, compute_gflops=gflops)  # the device's compute on a GPU backend (or the target's)
    pred = TimedPredictor(spec, cal, timing) if calibrated and timing is not None else Predictor(spec, floor_cal)
    rows = tuple(_context_row(pred, n, calibrated) for n in contexts)
    ttft = None
    if prompt_tokens is not None and gflops:
        ttft = _ttft(spec, prompt_tokens, gflops, floor_cal.ceiling_gbs)
    notes += [compute_note] if compute_note and prompt_tokens is not None else []
    if prompt_tokens is not None and not calibrated and not gflops and target is None:
        notes.append(NO_TTFT_HERE if bandwidth_gbs is None else NO_TTFT_GIVEN)
    request = None
    if prompt_tokens:
        decode_pred = pred if calibrated else Predictor(spec, estimated_calibration(floor_cal, spec))
        request = request_prediction(pred, prompt_tokens, output_tokens, calibrated, n_batch, decode_pred)
    if target is not None:
        where, avail = target.memory_where, available_bytes if available_bytes is not None else target.memory_bytes
    else:
        where, avail = _memory_budget(probe, cal.backend, available_bytes)
    mem_backend = (target.backend if target is not None else cal.backend) or "CPU"
    memory = memory_verdict(
        spec,
        n_ctx=max(contexts),
        n_batch=n_batch,
        available_bytes=avail,
        where=where,
        backend=mem_backend,
        n_gpu_layers=(spec.n_layer or 0) + 1 if where != "RAM" else 0,
    )
    notes += _beyond_bound_notes(rows, ttft, request, cal) if calibrated else []
    estimates = () if calibrated else estimates_for(pred, contexts, target.backend if target else cal.backend)
    notes += _estimate_notes(spec, contexts, target.backend if target else cal.backend, cal, estimates, memory)
    # nothing timed and no compute figure: a prefill would be only its weight reads, not a TTFT: none, and no E2E
    if request is not None and not calibrated and not gflops:
        request = replace(request, ttft_s=None, e2e_s=None, output_tok_s=None, prefill_share=None)
    return Prediction(
        model=spec.path or spec.name or "spec",
        quant=spec.quant,
        backend=cal.backend,
        bandwidth_gbs=cal.ceiling_gbs,
        bandwidth_source=source,
        calibrated=calibrated,
        contexts=rows,
        ttft=ttft,
        memory=memory,
        notes=tuple(notes),
        estimates=estimates,
        request=request,
    )


# the note of a model neither timed here nor given a compute figure (a first-contact probe measures no compute)
NO_TTFT_HERE = (
    "no TTFT: without a timing, a prefill's time needs this machine's compute, which was not measured; the "
    "model's config.json (predict --config), or --d-model and --vocab, time its shape here"
)
# ... and of a bandwidth given without a device or a compute figure, on a machine whose compute was not measured
NO_TTFT_GIVEN = (
    "no TTFT: no compute figure (this machine's was not measured, `ondevice probe` measures it; another machine's: "
    "--device or --compute)"
)
NOISY_CORES = 0.5  # timing_notes: other processes using this many cores while a model was timed is said
NOISY_SPREAD = 0.10  # and rounds of one point this far apart


def timing_notes(timing: ShapeTiming) -> list[str]:
    """What a reader of the figures should know about how the model was timed: twins, a busy machine."""
    notes = []
    if timing.source == "twins":
        notes.append(f"timed on twins of {' and '.join(map(str, timing.layers))} layers, extrapolated in layers")
    if timing.other_cpu_cores >= NOISY_CORES:
        notes.append(
            f"timed while other processes used {timing.other_cpu_cores:.1f} cores (rounds "
            f"{100 * timing.spread:.0f}% apart): the figures may be slow; `ondevice predict --refresh` (with the "
            "model or its --config) times it again"
        )
    elif timing.spread >= NOISY_SPREAD:  # not other processes: this machine's own speed moved between the rounds
        notes.append(
            f"timed in rounds {100 * timing.spread:.0f}% apart while other processes used "
            f"{timing.other_cpu_cores:.1f} cores: this machine's speed moved, and the figures are that uncertain"
        )
    return notes


def _beyond_bound_notes(rows, ttft, request, cal: Calibration) -> list[str]:
    """What to make of a timed prediction past a bound: faster than the decode ceiling (the probe's bandwidth is
    lower than what the timing read: a stale or disturbed probe), or a TTFT under the compute floor (the probe's
    compute figure is numpy's f32 product; llama.cpp's quantized kernels can do more)."""
    notes = []
    over = [r.n_ctx for r in rows if r.predicted_tok_s and r.predicted_tok_s > r.ceiling_tok_s]
    if over:
        notes.append(
            f"predicted faster than the ceiling at {', '.join(map(str, over))} tokens: the probe's "
            f"{cal.ceiling_gbs:.1f} GB/s is less than this machine read while timing the model; "
            "`ondevice probe --refresh` measures it again"
        )
    if ttft is not None and request is not None and request.ttft_s is not None and request.ttft_s < ttft.floor_s:
        notes.append(
            "predicted TTFT under the TTFT floor: the floor's compute figure is the probe's f32 matrix product, "
            "and llama.cpp's quantized kernels prefilled faster when timed (the timed figure stands)"
        )
    return notes


def _estimate_notes(spec, contexts, backend, cal, estimates, memory) -> list[str]:
    """What the estimate does not cover for this model and machine (roofline.estimate.caveats), and a model that
    does not fit there."""
    if not estimates:
        return []
    out = list(caveats(spec, contexts, backend, cal.ceiling_gbs, estimates))
    if memory.verdict == "does not fit":
        out.append(
            f"the model does not fit the {memory.where} there: the estimate is for a machine where it does "
            "(layers left in RAM decode at RAM speed)"
        )
    return out


def request_prediction(
    pred: Predictor,
    prompt_tokens: int,
    output_tokens: int | None,
    calibrated: bool,
    n_batch: int = 512,
    decode_pred: Predictor | None = None,
) -> RequestPrediction:
    """TTFT, decode time, E2E and the prefill share of one request (nothing cached). Without a
    timing the figures are bounds (the ceiling's steps, prefill at the host's compute)."""
    ttft = pred.ttft_s(prompt_tokens, 0, n_batch)
    decode = (decode_pred or pred).decode_s(prompt_tokens, output_tokens) if output_tokens else None
    e2e = ttft + decode if decode is not None else None
    n = output_tokens or 0
    return RequestPrediction(
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        ttft_s=ttft,
        decode_s=decode,
        e2e_s=e2e,
        tpot_s=decode / (n - 1) if decode is not None and n >= 2 else None,
        output_tok_s=n / e2e if e2e else None,
        prefill_share=ttft / e2e if e2e else None,
        basis="calibrated" if calibrated else ("estimate" if decode_pred is not None else "bound"),
    )


def _resolve(ref) -> Path:
    from ondevice.models.materialize import resolve_model

    return resolve_model(None if ref is None else str(ref))


def _positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise InvalidParameterError(f"{name} must be a positive integer, not {v!r}")
    return v


def check_contexts(ctx, spec: ModelSpec) -> tuple[int, ...]:
    """Context lengths to predict at: positive, and within the model's trained context (as load() requires)."""
    values: Iterable = (ctx,) if isinstance(ctx, int) else ctx
    out = tuple(_positive_int("context", int(c) if isinstance(c, str) and c.strip().isdigit() else c) for c in values)
    if not out:
        raise InvalidParameterError("give at least one context length")
    if spec.n_ctx_train:
        too_long = [c for c in out if c > spec.n_ctx_train]
        if too_long:
            raise InvalidParameterError(
                f"context {too_long[0]} is beyond the model's trained context of {spec.n_ctx_train} tokens"
            )
    return out


def _context_row(pred: Predictor, n: int, calibrated: bool) -> ContextPrediction:
    ceiling_s, calibrated_s = pred.step_s(n)
    return ContextPrediction(
        n_ctx=n,
        weight_bytes=pred.spec.decode_weight_bytes,
        kv_bytes=pred.kv_read_bytes(n),
        ceiling_step_s=ceiling_s,
        ceiling_tok_s=1.0 / ceiling_s,
        predicted_step_s=calibrated_s if calibrated else None,
        predicted_tok_s=1.0 / calibrated_s if calibrated else None,
    )


def prefill_flops(spec: ModelSpec, p: int) -> float:
    """2 x N_matmul x P, plus attention: per layer 4 x d_attn x sum_i min(i, window) (QK and AV, causal).
    The output head runs for the last prompt token only (llama.cpp computes logits just for the
    tokens that are output)."""
    return chunk_flops(spec, 0, p, 1)


def _ttft(spec: ModelSpec, p: int, compute_gflops: float, ceiling_gbs: float) -> TTFTPrediction:
    flops = prefill_flops(spec, p)
    compute_s = flops / (compute_gflops * 1e9)
    bandwidth_s = spec.decode_weight_bytes / (ceiling_gbs * 1e9)
    return TTFTPrediction(
        prompt_tokens=p,
        prefill_flops=flops,
        compute_gflops=compute_gflops,
        compute_s=compute_s,
        bandwidth_s=bandwidth_s,
        floor_s=max(compute_s, bandwidth_s),
    )


def _memory_budget(probe, backend: str, given: int | None) -> tuple[str, int | None]:
    host = probe.host if probe is not None else None
    if backend.upper() == "CPU" or host is None:
        if given is not None:
            return "RAM", given
        if host is None:
            import psutil

            return "RAM", psutil.virtual_memory().available
        return "RAM", host.ram_available_bytes
    if host.unified_memory:
        limit = int(_UNIFIED_GPU_SHARE * (host.ram_total_bytes or 0)) or None
        avail = min(x for x in (limit, host.ram_available_bytes) if x) if (limit or host.ram_available_bytes) else None
        return "unified memory", given if given is not None else avail
    vram = host.gpus[0].vram_free_bytes if host.gpus else None
    return "VRAM", given if given is not None else vram
