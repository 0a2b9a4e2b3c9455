"""The roofline: from a ModelSpec and a machine's bandwidth, how fast decoding can go.

DESIGN.md section 5. A decode step at context s reads the weights used for one token plus
the KV cache of s tokens (sliding-window layers capped). The pure ceiling divides those
bytes by the machine's best measured read bandwidth (a bound: measured must never beat
it). The calibrated prediction uses what the runtime's own kernels reach per weight type
(kernel probe) and the fixed costs the probe fitted:

    t(s) = sum_type bytes_type / bw_type + kv_bytes(s) / bw_kv
           + attn_scores(s) * (attn_s + (head_dim_k + head_dim_v) * attn_dim_s)
           + t0 + n_layer * layer_s + n_vocab * vocab_s

(attn_scores: query heads x context tokens x layers, the attention work over the context,
which on a CPU costs more than its bytes: a softmax entry (attn_s, per score) and a dot
product and a weighted sum as long as the head (attn_dim_s, per score and head dimension).
llama.cpp keeps every token in sliding-window layers by default and masks the window, so the
calibrated KV and attention terms span the whole context there; the ceiling counts the window.)

Weight types the kernel probe did not measure borrow a bandwidth interpolated linearly in
bits per weight between the two nearest probed types (clamped at the ends): Q4_K (4.5
bpw) reads like Q4_0, Q6_K lies between Q4_0 and Q8_0, F32 like F16.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.modelspec import ModelSpec

__all__ = ["Calibration", "Predictor", "default_predictor", "bits_per_weight", "effective_gbs", "attention_scores",
           "attention_head_dims", "predict", "Prediction", "ContextPrediction", "TTFTPrediction", "MemoryVerdict"]

_GB = 1e9


def bits_per_weight(type_name: str) -> float:
    """Bits per weight of a GGML tensor type, from gguf.GGML_QUANT_SIZES. KeyError if unknown."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return 8.0 * size / block


@dataclass(frozen=True)
class Calibration:
    """What the probes measured that the step-time model needs."""

    backend: str  # "CPU", "Metal", "CUDA", ...
    ceiling_gbs: float  # bandwidth of the pure bound, GB/s
    type_gbs: Mapping[str, float] = field(default_factory=dict)  # weight type -> effective GB/s in decode
    kv_gbs: float | None = None  # effective GB/s reading the KV cache (None: ceiling_gbs)
    t0_s: float = 0.0  # fixed per-token cost, seconds
    layer_s: float = 0.0  # per-block per-token cost, seconds
    vocab_s: float = 0.0  # per-vocabulary-entry per-token cost, seconds
    attn_s: float = 0.0  # cost per attention score (query head x context token x layer), seconds
    attn_dim_s: float = 0.0  # ... plus this per score and head dimension (key + value dims), seconds
    swa_full: bool = True  # the runtime attends over every cached token in sliding-window layers, masked
    # (llama.cpp's default swa_full, which ondevice.engine keeps): the calibrated KV and attention
    # terms then span the whole context; the pure ceiling always counts only the window
    compute_gflops: float | None = None  # achievable GFLOP/s for the TTFT floor (None: unknown)


def effective_gbs(weight_type: str, cal: Calibration) -> float:
    """Effective bandwidth for a weight type; unprobed types interpolate in bits per weight."""
    if weight_type in cal.type_gbs:
        return cal.type_gbs[weight_type]
    if not cal.type_gbs:
        return cal.ceiling_gbs
    try:
        bpw = bits_per_weight(weight_type)
    except KeyError:
        return min(cal.type_gbs.values())
    known = sorted((bits_per_weight(t), gbs) for t, gbs in cal.type_gbs.items())
    if bpw <= known[0][0]:
        return known[0][1]
    if bpw >= known[-1][0]:
        return known[-1][1]
    for (b0, g0), (b1, g1) in zip(known, known[1:]):
        if b0 <= bpw <= b1:
            return g0 + (g1 - g0) * (bpw - b0) / (b1 - b0) if b1 > b0 else g0
    return known[-1][1]  # pragma: no cover - the loop always finds the bracket


def attention_scores(spec: ModelSpec, n_ctx: int, *, windowed: bool = True) -> int:
    """Attention scores of one decode step at a context of n_ctx tokens: every query head
    scores every cached token, in every layer (n_head x span per layer; a score is a dot
    product of head_dim, a softmax entry and a weighted sum of values). Windowed layers span
    at most the window, unless windowed=False (a runtime that masks instead)."""
    if not spec.n_head or not spec.n_layer:
        return 0
    swa = set(spec.swa_layers) if spec.sliding_window and windowed else set()
    n_swa = sum(1 for i in range(spec.n_layer) if i in swa)
    span_swa = min(n_ctx, spec.sliding_window) if spec.sliding_window else n_ctx
    return spec.n_head * ((spec.n_layer - n_swa) * n_ctx + n_swa * span_swa)


def attention_head_dims(spec: ModelSpec) -> int:
    """Head dimensions one attention score works through: the key's (dot product) plus the
    value's (weighted sum); 0 when unknown."""
    return (spec.head_dim_k or 0) + (spec.head_dim_v or 0)


class Predictor:
    """Step-time model of one model on one machine; step_s() is pure arithmetic (cheap per token)."""

    def __init__(self, spec: ModelSpec, calibration: Calibration):
        if not calibration.ceiling_gbs > 0:
            raise ValueError("ceiling bandwidth must be positive")
        self.spec = spec
        self.calibration = calibration
        self._ceiling_bps = calibration.ceiling_gbs * _GB
        self._kv_bps = (calibration.kv_gbs or calibration.ceiling_gbs) * _GB
        self._weight_ceiling_s = spec.decode_weight_bytes / self._ceiling_bps
        self._weight_calibrated_s = sum(
            b / (effective_gbs(t, calibration) * _GB) for t, b in spec.decode_bytes_by_type.items()
        )
        self._fixed_s = (calibration.t0_s + (spec.n_layer or 0) * calibration.layer_s
                         + (spec.n_vocab or 0) * calibration.vocab_s)
        swa = set(spec.swa_layers) if spec.sliding_window else set()
        per_layer = spec.kv_bytes_per_token_by_layer
        self._kv_full = sum(b for i, b in enumerate(per_layer) if i not in swa)  # bytes per context token
        self._kv_window = sum(b for i, b in enumerate(per_layer) if i in swa)  # bytes per token, up to the window
        self._window = spec.sliding_window or 0
        # calibrated: per context token, KV seconds and attention seconds (all layers span it
        # when the runtime masks sliding windows; else windowed layers are capped as above)
        self._cal_window = 0 if calibration.swa_full else self._window
        full_kv, window_kv = (self._kv_full + self._kv_window, 0) if calibration.swa_full else (self._kv_full, self._kv_window)
        self._cal_full_s = full_kv / self._kv_bps
        self._cal_window_s = window_kv / self._kv_bps
        if (calibration.attn_s or calibration.attn_dim_s) and spec.n_layer:
            per = (spec.n_head or 0) * (calibration.attn_s + attention_head_dims(spec) * calibration.attn_dim_s)
            n_swa = 0 if calibration.swa_full else sum(1 for i in range(spec.n_layer) if i in swa)
            self._cal_full_s += per * (spec.n_layer - n_swa)
            self._cal_window_s += per * n_swa

    def kv_read_bytes(self, n_ctx: int) -> int:
        """Same figure as ModelSpec.kv_read_bytes, from precomputed sums."""
        span = min(n_ctx, self._window) if self._window else n_ctx
        return self._kv_full * n_ctx + self._kv_window * span

    def step_bytes(self, n_ctx: int) -> int:
        """Weight + KV bytes one decode step reads at a context of n_ctx tokens."""
        return self.spec.decode_weight_bytes + self.kv_read_bytes(n_ctx)

    def step_s(self, n_ctx: int) -> tuple[float, float]:
        """(ceiling_step_s, calibrated_step_s) for one decode step at a context of n_ctx tokens."""
        n = max(0, int(n_ctx))
        ceiling = self._weight_ceiling_s + self.kv_read_bytes(n) / self._ceiling_bps
        span = min(n, self._cal_window) if self._cal_window else n
        calibrated = self._weight_calibrated_s + self._cal_full_s * n + self._cal_window_s * span + self._fixed_s
        return ceiling, max(calibrated, ceiling)


def default_predictor(spec: ModelSpec, backend: str) -> Predictor | None:
    """A Predictor from this machine's CACHED probe for `backend`; None when none is cached.

    Never runs a probe (that takes up to a minute): `ondevice probe` does.
    """
    if not spec.decode_weight_bytes:
        return None
    from ondevice.probing.cache import load_cached

    result = load_cached(backend=backend)
    cal = result.calibration() if result is not None else None
    return Predictor(spec, cal) if cal is not None else None


# ---------- predictions ----------

@dataclass(frozen=True)
class ContextPrediction:
    n_ctx: int  # context length, tokens
    weight_bytes: int  # weight bytes one decode step reads
    kv_bytes: int  # KV-cache bytes one decode step reads at this context
    ceiling_step_s: float  # pure bandwidth bound on the step time, seconds
    ceiling_tok_s: float  # 1 / ceiling_step_s: measured decode tok/s never beats it
    predicted_step_s: float | None  # calibrated step time, seconds (None: no kernel probe)
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
class MemoryVerdict:
    weight_bytes: int  # all weights (every expert)
    kv_bytes: int  # KV cache at n_ctx, every layer holding n_ctx cells (llama.cpp's default)
    buffer_bytes: int  # compute buffers, estimated: 4 B x n_batch x max(n_vocab + d, n_head x n_ctx + 4d)
    total_bytes: int  # sum of the three
    n_ctx: int  # context the KV cache is sized for, tokens
    available_bytes: int | None  # free RAM (CPU) or VRAM (GPU) when known
    where: str  # "RAM", "VRAM", "unified memory"
    verdict: str  # "fits" (<= 80% of available), "tight" (<= 100%), "does not fit", "unknown"


@dataclass(frozen=True)
class Prediction:
    model: str  # file path or a description of the typed-in spec
    quant: str | None  # quant label
    backend: str  # backend the figures are for
    bandwidth_gbs: float  # bandwidth of the pure ceiling, GB/s
    bandwidth_source: str  # "measured" (probe), "given", ...
    calibrated: bool  # a kernel probe calibrated predicted_* figures
    contexts: tuple[ContextPrediction, ...]  # one per requested context
    ttft: TTFTPrediction | None  # None without a compute figure or prompt length
    memory: MemoryVerdict
    notes: tuple[str, ...] = ()  # caveats (approximations, missing data)

    def to_dict(self) -> dict:
        from dataclasses import asdict

        d = asdict(self)
        d["contexts"] = [asdict(c) for c in self.contexts]
        d["notes"] = list(self.notes)
        return d


def predict(model_or_spec=None, *, ctx=(128, 2048), probe=None, bandwidth_gbs: float | None = None,
            prompt_tokens: int | None = 1024, n_batch: int = 512, available_bytes: int | None = None) -> Prediction:
    """Ceiling, calibrated prediction, TTFT floor and memory verdict for a model on this machine.

    model_or_spec: a ModelSpec, a GGUF path or registry name (None = the default model).
    probe: a ProbeResult; None uses the cached probe unless bandwidth_gbs is given.
    bandwidth_gbs: a bandwidth to use instead of the measured one (a machine you do not own);
    the prediction is then the pure ceiling only.
    """
    from ondevice.roofline_predict import run_predict

    return run_predict(model_or_spec, ctx=ctx, probe=probe, bandwidth_gbs=bandwidth_gbs,
                       prompt_tokens=prompt_tokens, n_batch=n_batch, available_bytes=available_bytes)
