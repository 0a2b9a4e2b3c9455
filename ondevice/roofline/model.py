"""The roofline's step-time model: from a ModelSpec and a calibration, how long a decode step takes.

A decode step at context s reads the weights used for one token plus
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

__all__ = ["Calibration", "Predictor", "bits_per_weight", "effective_gbs", "attention_scores", "attention_head_dims"]

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
