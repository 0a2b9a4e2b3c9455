"""The roofline's bound and its analytic step model: from a ModelSpec and a bandwidth, how long a step takes.

A decode step at context s reads the weights used for one token plus the KV cache of s tokens
(sliding-window layers capped). The ceiling divides those bytes by the machine's measured read
bandwidth: a bound that measured decoding never beats. A working set the caches hold is read
faster than DRAM, so the host probe's read curve over working-set sizes scales the bound of a
model that small (read_speedup).

The Predictor here is what stands in where nothing was timed: the bound itself (source "bound"),
or the estimate for a machine you do not have (source "estimate": each weight type read at the
bandwidth times an efficiency fitted on published llama.cpp runs, plus a fixed cost per token).
Prefill is then the larger of one read of the weights and the chunk's FLOPs at the given compute.
On this machine the prediction comes from timing the model's shape instead (timing.py). docs/prediction.md
explains both.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.gguf.spec import ModelSpec
from ondevice.roofline.attention import chunk_cells

__all__ = ["Calibration", "Predictor", "bits_per_weight", "effective_gbs", "read_speedup", "chunk_flops"]

_GB = 1e9
NOISE_SHARE = 0.10  # read_speedup: a working set read less than 10% faster than DRAM counts as DRAM


def bits_per_weight(type_name: str) -> float:
    """Bits per weight of a GGML tensor type, from gguf.GGML_QUANT_SIZES. KeyError if unknown."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]
    return 8.0 * size / block


@dataclass(frozen=True)
class Calibration:
    """The machine figures the bound and the analytic step model need."""

    backend: str  # "CPU", "Metal", "CUDA", ...
    ceiling_gbs: float  # bandwidth of the bound, GB/s
    type_gbs: Mapping[str, float] = field(default_factory=dict)  # weight type -> GB/s its reads reach (the estimate)
    kv_gbs: float | None = None  # GB/s reading the KV cache (None: ceiling_gbs)
    t0_s: float = 0.0  # fixed cost per token, seconds
    compute_gflops: float | None = None  # achievable GFLOP/s for prefill (None: unknown, prefill is one weight read)
    read_curve: tuple[tuple[int, float], ...] = ()  # (working-set bytes, host read GB/s), growing sizes: how much
    # faster than DRAM a working set the caches hold is read (the bound scales by it; empty: no scaling)
    source: str = "bound"  # "bound" (the ceiling itself) or "estimate" (efficiencies fitted on published runs)


def effective_gbs(weight_type: str, cal: Calibration) -> float:
    """The bandwidth a weight type is read at: its own figure, else the type nearest in bits per
    weight (ceiling_gbs without any)."""
    if weight_type in cal.type_gbs:
        return cal.type_gbs[weight_type]
    if not cal.type_gbs:
        return cal.ceiling_gbs
    try:
        bpw = bits_per_weight(weight_type)
    except KeyError:
        return min(cal.type_gbs.values())
    known = [t for t in cal.type_gbs if t in GGMLQuantizationType.__members__]
    if not known:
        return min(cal.type_gbs.values())
    return cal.type_gbs[min(known, key=lambda t: abs(bits_per_weight(t) - bpw))]


def read_speedup(curve: Sequence[tuple[int, float]], nbytes: float) -> float:
    """Read bandwidth for a working set of nbytes over the bandwidth of the curve's largest (DRAM)
    size, interpolated linearly in log(bytes); 1 past the largest size, and 1 where the curve is
    within NOISE_SHARE of DRAM (a shared machine's drift, not a cache)."""
    if not curve or nbytes <= 0 or nbytes >= curve[-1][0]:
        return 1.0
    dram = curve[-1][1]
    if nbytes <= curve[0][0]:
        gbs = curve[0][1]
    else:
        (b0, g0), (b1, g1) = next((a, b) for a, b in zip(curve, curve[1:]) if a[0] <= nbytes <= b[0])
        f = (math.log(nbytes) - math.log(b0)) / (math.log(b1) - math.log(b0)) if b1 > b0 else 0.0
        gbs = g0 + (g1 - g0) * f
    return gbs / dram if gbs > (1 + NOISE_SHARE) * dram else 1.0


def chunk_flops(spec: ModelSpec, pos: int, n_tokens: int, logits_tokens: int = 1) -> float:
    """FLOPs of one llama_decode of n_tokens after pos cached tokens: 2 x the matrix weights per token
    (the output head only for the tokens whose logits are kept) + attention, 4 x d_attn per cell
    (QK and AV, causal, windows capped)."""
    head = (spec.n_vocab or 0) * (spec.d_model or 0)
    head = head if 0 < head < spec.n_params_matmul else 0
    flops = 2.0 * (spec.n_params_matmul - head) * n_tokens + 2.0 * head * min(logits_tokens, n_tokens)
    d_attn = (spec.n_head or 0) * (spec.head_dim_k or 0) or (spec.d_model or 0)
    return flops + 4.0 * d_attn * chunk_cells(spec, pos, n_tokens)


class Predictor:
    """The bound and the analytic step model of one model on one machine; pure arithmetic (cheap per token).

    step_s(n) -> (ceiling_step_s, predicted_step_s); tokens_step_s for several tokens per llama_decode
    (a speculative verify, a batch of sequences); prefill_s / ttft_s / decode_s / e2e_s for a request.
    `basis` says where the predicted figures come from: "bound", "estimate" or (timing.TimedPredictor)
    "measured"."""

    def __init__(self, spec: ModelSpec, calibration: Calibration):
        if not calibration.ceiling_gbs > 0:
            raise ValueError("ceiling bandwidth must be positive")
        self.spec = spec
        self.calibration = calibration
        self._ceiling_bps = calibration.ceiling_gbs * _GB
        self._kv_bps = (calibration.kv_gbs or calibration.ceiling_gbs) * _GB
        self._curve = sorted(calibration.read_curve)
        self._weights_s = sum(b / (effective_gbs(t, calibration) * _GB) for t, b in spec.decode_bytes_by_type.items())
        if not spec.decode_bytes_by_type:
            self._weights_s = spec.decode_weight_bytes / self._ceiling_bps

    @property
    def basis(self) -> str:
        return self.calibration.source

    @property
    def ceiling_gbs(self) -> float:
        return self.calibration.ceiling_gbs

    def kv_read_bytes(self, n_ctx: int) -> int:
        """KV bytes one decode step reads at a context of n_ctx tokens (windows capped)."""
        return self.spec.kv_read_bytes(max(0, int(n_ctx)))

    def step_bytes(self, n_ctx: int) -> int:
        """Weight + KV (+ a recurrent model's state) bytes one decode step reads at a context of n_ctx tokens."""
        return self.spec.decode_weight_bytes + self.kv_read_bytes(n_ctx) + self.spec.state_bytes

    def cache_speedup(self, n_ctx: int) -> float:
        """How much faster than from DRAM the step's bytes are read (the read curve; 1.0 without one)."""
        return read_speedup(self._curve, self.step_bytes(n_ctx)) if self._curve else 1.0

    def ceiling_step_s(self, n_ctx: int) -> float:
        """The bound on one decode step: its bytes over the measured bandwidth (cache-scaled)."""
        return self.step_bytes(n_ctx) / self._ceiling_bps / self.cache_speedup(n_ctx)

    def predicted_step_s(self, n_ctx: int) -> float:
        """The analytic decode step: each weight type at its bandwidth, the KV cache, the fixed cost."""
        memory_s = self._weights_s + (self.kv_read_bytes(n_ctx) + self.spec.state_bytes) / self._kv_bps
        return memory_s / self.cache_speedup(n_ctx) + self.calibration.t0_s

    def step_s(self, n_ctx: int) -> tuple[float, float]:
        """(ceiling_step_s, predicted_step_s) for one decode step at a context of n_ctx tokens."""
        ceiling = self.ceiling_step_s(n_ctx)
        return ceiling, max(ceiling, self.predicted_step_s(n_ctx))

    def ceiling_tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float:
        """The bound on one llama_decode of n_tokens in each of n_seqs sequences: weights once, every sequence's KV
        (and recurrent state)."""
        b = max(1, int(n_seqs))
        per_sequence = self.kv_read_bytes(n_ctx) + self.spec.state_bytes
        return (self.spec.decode_weight_bytes + b * per_sequence) / self._ceiling_bps

    def _compute_s(self, flops: float) -> float:
        gflops = self.calibration.compute_gflops
        return flops / (gflops * 1e9) if gflops else 0.0

    def tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float:
        """One llama_decode computing n_tokens new tokens in each of n_seqs sequences at a context of
        n_ctx, logits for every token: one step's reads, every sequence's KV, each further token's FLOPs."""
        n, b, s = max(1, int(n_tokens)), max(1, int(n_seqs)), max(0, int(n_ctx))
        extra = self._compute_s(b * chunk_flops(self.spec, s, n, n) - chunk_flops(self.spec, s, 1, 1))
        return self.step_s(s)[1] + extra + (b - 1) * self.kv_read_bytes(s) / self._kv_bps

    def prefill_s(self, n_tokens: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Seconds to prefill n_tokens prompt tokens after n_cached cached ones, in llama_decode chunks
        of n_batch: per chunk the larger of one read of the weights and its FLOPs at the compute figure."""
        n, pos, chunk = max(0, int(n_tokens)), max(0, int(n_cached)), max(1, int(n_batch))
        t = 0.0
        while n > 0:
            k = min(chunk, n)
            read_s = self.predicted_step_s(pos)
            t += max(read_s, self._compute_s(chunk_flops(self.spec, pos, k, 1 if k == n else 0)))
            pos, n = pos + k, n - k
        return t

    def ttft_s(self, n_prompt: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Predicted time to first token: the prefill of what the cache does not hold (at least the last token)."""
        cached = min(max(0, int(n_cached)), max(0, int(n_prompt) - 1))
        return self.prefill_s(int(n_prompt) - cached, cached, n_batch)

    def decode_s(self, n_prompt: int, n_output: int) -> float:
        """Predicted seconds of the decode steps after the first token (contexts n_prompt + 1 to
        n_prompt + n_output - 1)."""
        return sum(self.step_s(int(n_prompt) + i)[1] for i in range(1, max(0, int(n_output))))

    def e2e_s(self, n_prompt: int, n_output: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Predicted request time: TTFT + decode of the other n_output - 1 tokens."""
        return self.ttft_s(n_prompt, n_cached, n_batch) + self.decode_s(n_prompt, n_output)
