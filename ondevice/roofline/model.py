"""The roofline's step-time model: from a ModelSpec and a calibration, how long a decode step takes.

A decode step at context s reads the weights used for one token plus the KV cache of s tokens
(sliding-window layers capped). The pure ceiling divides those
bytes by the machine's best measured read bandwidth (a bound: measured must never beat
it). The calibrated prediction uses what the runtime's own kernels reach per weight type
(kernel probe) and the fixed costs the probe fitted:

    t(s) = sum_type (bytes_type / bw_type + rows_type * row_s) + kv_bytes(s) / bw_kv
           + attn_scores(s) * score_s(head_dim_k + head_dim_v)
           + t0 + n_layer * layer_s + n_vocab * vocab_s

(rows_type: the matrix rows of that type, each a dot product with its own set-up, row_s apiece:
narrow matrices read slower. On an AMD EPYC VM, Q8_0 of width 640 decoded at 23-24 GB/s where
width 2,048 ran at 29-31: about 7.5 ns a row; Gemma 3 270M computes 386,560 rows a token.)

(attn_scores: query heads x context tokens x layers. score_s, the seconds of one score (a dot
product, a softmax entry, a weighted sum), is what the probe's attention models measured at their
head dimensions, linear between them and clamped: on a CPU it is no line in the head's length
(that VM, 2,048 tokens: 12 ns at heads of 64, ~35 at 128, 11-18 at 256 with one KV head).
llama.cpp keeps every token in sliding-window layers (swa_full) but its flash attention skips the
masked cells: on Gemma 3 at 4,096 tokens decode ran 5% below the windowed prediction and 25% above
the whole-context one, so the window counts; Calibration.swa_full=True counts every token.)

Weight types the kernel probe did not measure borrow a bandwidth interpolated linearly in
bits per weight between the two nearest probed types (clamped at the ends): Q4_K (4.5
bpw) reads like Q4_0, Q6_K lies between Q4_0 and Q8_0, F32 like F16.

More than one token per llama_decode (a prompt chunk, a speculative verify, a batch of
sequences) reads the weights once and computes every token: each weight type's matrix products
over n columns cost its one-token time times the probe's measured step ratio at n (up to 128
columns), past that each further token its products at the batched rate the probe measured
(type_gflops, interpolated like the bandwidths). Those are the sized models' rows (2,446 weights
long); each token past the first also costs batch_row_s per row beyond what rows that long would
hold: rows of 640 multiply slower per weight than rows of 2,048 (an AMD EPYC VM, Q8_0: 4.4-4.8 ps
more per weight and column at 16, 128 and 256 columns alike). Then its attention over its context
(attn_gflops), and, per extra sequence, that sequence's KV read:

    t(s, n tokens, B seqs) = t(s) + (n*B - 1) * (2 * matmul elements / rate + excess rows * batch_row_s)
                             + B * n * attention FLOPs at s / attn rate (minus the first token's)
                             + (B - 1) * kv_bytes(s) / bw_kv

A working set the caches hold reads faster than DRAM: the probe's read-bandwidth curve over
working-set sizes (read_curve) scales the ceiling by read_speedup(bytes of the step). The calibrated
step takes the share h of the bytes the caches serve (what the curve's speed-up implies) at what
each type's kernel reached on cached weights (type_cached_gbs: Q4_0 computes, ~1.2x its DRAM rate
where a plain read ran 3x), the rest at its DRAM rate (kernel_speedup), and only for a step the
caches hold (cache_bytes: the curve's knee). Past it the kernels gain less than that share gives: a
51 MB Q4_0 model decoded ~6% faster than no speed-up predicts and ~6% slower than the full share
(nine runs, benchmarks/replay_accuracy.py), so they keep the share x knee / step bytes: an
interpolation chosen on those runs (continuous at the knee, fading with size), not a cache model.

Prefill is chunks of n_batch such steps (logits, so the head, for the last token only); TTFT =
prefill of the tokens not already cached; E2E = TTFT + the decode steps over the growing context.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ondevice.gguf.spec import ModelSpec
from ondevice.roofline.attention import attention_head_dims, causal_spans, score_s

__all__ = [
    "Calibration",
    "Predictor",
    "bits_per_weight",
    "effective_gbs",
    "effective_gflops",
    "read_speedup",
    "cache_bytes",
]

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
    row_s: float = 0.0  # per matrix row per token (one dot product's set-up and sum), seconds
    vocab_s: float = 0.0  # per-vocabulary-entry per-token cost, seconds
    attn_score_s: tuple[tuple[int, float], ...] = ()  # (key + value head dims, seconds per attention score
    # (query head x context token x layer)), growing dims: the probe's attention models (score_s interpolates)
    swa_full: bool = False  # sliding-window layers: False, the calibrated KV and attention terms count the
    # window (llama.cpp skips masked cells); True, every cached token (a runtime that masks without skipping)
    compute_gflops: float | None = None  # achievable GFLOP/s for the TTFT floor (None: unknown)
    type_gflops: Mapping[str, float] = field(default_factory=dict)  # weight type -> batched matrix-product GFLOP/s
    # (prefill chunks; kernel probe). Empty: compute_gflops for every type
    attn_gflops: float | None = None  # GFLOP/s of batched attention (QK and AV) in prefill (None: the matmul rate)
    batch_row_s: float = 0.0  # in a step of several tokens, each matrix row beyond what rows of batch_row_width
    # elements would hold costs this per token past the first, seconds: narrow matrices multiply slower per weight
    # than the probe's sized models, whose step ratios and rates are measured (the kernel probe's narrow model)
    batch_row_width: float = 0.0  # elements per matrix row of the probe's sized models (0: every row pays batch_row_s)
    repacked_types: tuple[str, ...] = ()  # weight types llama.cpp re-laid out for its tiled kernels (CPU_REPACK) in the
    # probe's loads: they pay no batch_row_s, which the narrow model measured on the plain kernels (older: none)
    step_ratios: Mapping[str, tuple[tuple[int, float], ...]] = field(default_factory=dict)  # weight type ->
    # ((n tokens, time of one llama_decode of n / of 1), ...): what a matrix product over n columns costs
    type_cached_gbs: Mapping[str, float] = field(
        default_factory=dict
    )  # weight type -> GB/s its decode kernel reached on
    # weights the caches hold (kernel probe): the most a cache can speed that type up (empty: the read curve alone)
    read_curve: tuple[tuple[int, float], ...] = ()  # (working-set bytes, host read GB/s), growing sizes: how much
    # faster than DRAM a working set that the caches hold is read (step times scale by it; empty: no scaling)
    source: str = "kernel"  # where the figures come from: "kernel" (this machine's kernel probe), "estimate"
    # (the host's bandwidth times an efficiency fitted on published measurements), "bound" (the ceiling itself)


def effective_gbs(weight_type: str, cal: Calibration) -> float:
    """Effective bandwidth for a weight type; unprobed types interpolate in bits per weight."""
    return _per_type(weight_type, cal.type_gbs, cal.ceiling_gbs)


def effective_gflops(weight_type: str, cal: Calibration) -> float | None:
    """Batched matrix-product rate for a weight type, GFLOP/s; an unprobed type interpolates in
    bits per weight like effective_gbs, but in seconds per FLOP (so a prefill's time stays linear
    in the probed rates' inverses, which kernel.fit_prefill solves for); compute_gflops when the
    probe measured none; None when neither is known."""
    if not cal.type_gflops:
        return cal.compute_gflops
    inverse = {t: 1.0 / g for t, g in cal.type_gflops.items()}
    return 1.0 / _per_type(weight_type, inverse, None, unknown=max)


def _per_type(weight_type: str, table: Mapping[str, float], default, unknown=min):
    """table[weight_type], else interpolated linearly in bits per weight between the nearest
    entries (clamped at the ends; unknown(values) for an unknown type); default for an empty table."""
    if weight_type in table:
        return table[weight_type]
    if not table:
        return default
    try:
        bpw = bits_per_weight(weight_type)
    except KeyError:
        return unknown(table.values())
    known = sorted((bits_per_weight(t), gbs) for t, gbs in table.items())
    if bpw <= known[0][0]:
        return known[0][1]
    if bpw >= known[-1][0]:
        return known[-1][1]
    for (b0, g0), (b1, g1) in zip(known, known[1:]):
        if b0 <= bpw <= b1:
            f = (bpw - b0) / (b1 - b0) if b1 > b0 else 0.0
            return g0 * (1.0 - f) + g1 * f  # a convex mix: no cancellation when one end is tiny
    return known[-1][1]  # pragma: no cover - the loop always finds the bracket


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


def cache_bytes(curve: Sequence[tuple[int, float]]) -> int:
    """The largest working set the caches hold, read off the curve: its biggest size read at least
    halfway from DRAM's speed to the all-cached one (measured: the size the OS reports for the
    last-level cache is no guide in a VM). 0 without a curve."""
    if not curve:
        return 0
    half = (curve[0][1] + curve[-1][1]) / 2
    return max((b for b, gbs in curve if gbs >= half), default=0)


NOISE_SHARE = 0.10  # read_speedup: a working set read less than 10% faster than DRAM counts as DRAM


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
        self._weight_calibrated_s = sum(self._type_read_s(t, b) for t, b in spec.decode_bytes_by_type.items())
        self._fixed_s = (
            calibration.t0_s + (spec.n_layer or 0) * calibration.layer_s + (spec.n_vocab or 0) * calibration.vocab_s
        )
        swa = set(spec.swa_layers) if spec.sliding_window else set()
        per_layer = spec.kv_bytes_per_token_by_layer
        self._kv_full = sum(b for i, b in enumerate(per_layer) if i not in swa)  # bytes per context token
        self._kv_window = sum(b for i, b in enumerate(per_layer) if i in swa)  # bytes per token, up to the window
        self._window = spec.sliding_window or 0
        # calibrated: per context token, KV seconds and attention seconds (all layers span it
        # when the runtime masks sliding windows; else windowed layers are capped as above)
        self._cal_window = 0 if calibration.swa_full else self._window
        full_kv, window_kv = (
            (self._kv_full + self._kv_window, 0) if calibration.swa_full else (self._kv_full, self._kv_window)
        )
        self._kv_full_s = full_kv / self._kv_bps  # KV read seconds per context token (memory: cache-scaled)
        self._kv_window_s = window_kv / self._kv_bps
        self._attn_full_s = self._attn_window_s = 0.0  # attention seconds per context token (compute)
        if calibration.attn_score_s and spec.n_layer:
            per = (spec.n_head or 0) * score_s(sorted(calibration.attn_score_s), attention_head_dims(spec))
            n_swa = 0 if calibration.swa_full else sum(1 for i in range(spec.n_layer) if i in swa)
            self._attn_full_s = per * (spec.n_layer - n_swa)
            self._attn_window_s = per * n_swa
        self._curve = sorted(calibration.read_curve)
        self._cache_bytes = cache_bytes(self._curve)
        self._init_compute(spec, calibration, swa)

    def _type_read_s(self, weight_type: str, nbytes: int) -> float:
        """Seconds of one matrix-vector pass over a weight type's bytes: the bytes at the type's
        bandwidth and each of its rows' set-up (row_s)."""
        cal = self.calibration
        return (
            nbytes / (effective_gbs(weight_type, cal) * _GB)
            + self.spec.decode_rows_by_type.get(weight_type, 0) * cal.row_s
        )

    def cache_speedup(self, n_ctx: int) -> float:
        """How much faster than from DRAM the step's bytes (weights + KV at n_ctx) are read, from the
        probe's read-bandwidth curve over working-set sizes (1.0 without one, or past the caches)."""
        return read_speedup(self._curve, self.step_bytes(n_ctx)) if self._curve else 1.0

    def kernel_speedup(self, n_ctx: int, memory: float | None = None) -> float:
        """The cache speed-up of the calibrated step's memory terms. The read curve's speed-up S at the
        step's bytes says what share h of them the caches serve (S = 1 / (h / S_max + 1 - h), S_max the
        curve's speed-up on its smallest, all-cached size); each weight type (and the KV cache, read like
        F16) reads that share at what its kernel reached on cached weights (type_cached_gbs, c times its
        DRAM rate) and the rest from DRAM: 1 / (h / c + 1 - h), one factor over their read times. Past the knee
        (cache_bytes) h x knee / step bytes (module docstring); no cached rates: S, or 1.0 past it. `memory`: S if known."""
        memory = self.cache_speedup(n_ctx) if memory is None else memory
        kept = min(1.0, self._cache_bytes / max(1, self.step_bytes(n_ctx)))  # 1 within the knee, knee / bytes past it
        if memory <= 1.0 or not self._kernel_caps:
            return memory if kept == 1.0 else 1.0
        most = max(memory, self._curve[0][1] / self._curve[-1][1])
        cached_share = kept * (1.0 - 1.0 / memory) / (1.0 - 1.0 / most)
        kv_s = self.kv_read_bytes(n_ctx) / self._kv_bps
        parts = [(r, self._kernel_caps[t]) for t, r in self._read_s.items()] + [(kv_s, self._kernel_caps["F16"])]
        plain = sum(r for r, _c in parts)
        # no kernel outreads the plain read of an all-cached array (a faster figure is noise)
        sped = sum(r * (cached_share / min(cap, most) + 1.0 - cached_share) for r, cap in parts)
        return plain / sped if sped > 0 else memory

    def _init_compute(self, spec: ModelSpec, cal: Calibration, swa: set[int]) -> None:
        """Seconds of one more token's matrix products (body, and the output head apart: it runs
        only for tokens whose logits are kept) and of its attention per attended token."""
        elements = {t: b * 8.0 / bits_per_weight(t) for t, b in spec.decode_bytes_by_type.items() if _known_type(t)}
        rated = [(n, effective_gflops(t, cal)) for t, n in elements.items()]
        self._token_s = sum(2.0 * n / (g * 1e9) for n, g in rated if g)  # every matrix product, one token
        total = sum(n for n, g in rated if g)
        mean_gflops = total / sum(n / g for n, g in rated if g) if self._token_s else None
        head = (
            spec.head_bytes * 8.0 / bits_per_weight(spec.head_type)
            if spec.head_type in elements
            else ((spec.n_vocab or 0) * (spec.d_model or 0))
        )
        self._head_s = 2.0 * head / (mean_gflops * 1e9) if mean_gflops and 0 < head < total else 0.0
        self._body_s = self._token_s - self._head_s
        attn_gflops = cal.attn_gflops or mean_gflops
        flops_per_span = (
            2.0 * (spec.n_head or 0) * attention_head_dims(spec)
        )  # QK dot + AV sum, per attended token and layer
        self._attn_span_s = flops_per_span / (attn_gflops * 1e9) if attn_gflops else 0.0
        self._full_layers = (spec.n_layer or 0) - (0 if cal.swa_full else len(swa & set(range(spec.n_layer or 0))))
        self._window_layers = (spec.n_layer or 0) - self._full_layers
        self._step_fixed_s = cal.t0_s + (spec.n_layer or 0) * cal.layer_s  # per llama_decode call
        self._logits_fixed_s = (spec.n_vocab or 0) * cal.vocab_s  # per token whose logits are kept (and sampled)
        # per weight type: seconds to read it once (calibrated), and its matrix products' seconds per
        # token relative to that (growth past the measured step ratios); the head apart
        self._read_s = {t: self._type_read_s(t, b) for t, b in spec.decode_bytes_by_type.items() if b}
        caps = cal.type_cached_gbs  # per type: how many times its DRAM rate its kernel reads cached weights
        self._kernel_caps = (
            {t: max(1.0, _per_type(t, caps, None) / effective_gbs(t, cal)) for t in set(self._read_s) | {"F16"}}
            if caps
            else {}
        )
        self._growth = {
            t: 2.0 * elements[t] / (effective_gflops(t, cal) * 1e9) / self._read_s[t]
            if t in elements and effective_gflops(t, cal)
            else None
            for t in self._read_s
        }
        head_type = spec.head_type if spec.head_type in self._read_s else None
        head_rows = (spec.n_vocab or 0) * cal.row_s
        self._head = (
            (head_type, spec.head_bytes / (effective_gbs(head_type, cal) * _GB) + head_rows) if head_type else None
        )
        self._init_row_costs(spec, cal, elements, head_type)
        self._ratios = {t: _ratio_table(t, cal.step_ratios) for t in self._read_s} if cal.step_ratios else None

    def _init_row_costs(self, spec: ModelSpec, cal: Calibration, elements: dict, head_type: str | None) -> None:
        """Seconds each token past the first adds for rows narrower than the probe's sized ones: batch_row_s
        per row beyond elements / batch_row_width, over the body (every type but the repacked ones) and the head
        apart."""
        elements = {t: n for t, n in elements.items() if t not in cal.repacked_types}

        def excess_s(rows: float, n_elements: float) -> float:
            return (rows - (n_elements / cal.batch_row_width if cal.batch_row_width else 0.0)) * cal.batch_row_s

        rows = spec.decode_rows_by_type
        head_elements = spec.head_bytes * 8.0 / bits_per_weight(head_type) if head_type in elements else 0.0
        head_rows = (spec.n_vocab or 0) if head_elements else 0
        self._head_rows_s = excess_s(head_rows, head_elements) if head_elements else 0.0
        self._body_rows_s = sum(excess_s(rows[t], n) for t, n in elements.items() if rows.get(t)) - self._head_rows_s

    def _ratio(self, weight_type: str, columns: int) -> float:
        """Time of a matrix product over `columns` tokens / over one, for this weight type: the probe's
        measured step ratios (linear between them), then growing by the batched rate's compute."""
        if columns <= 1:
            return float(
                max(columns, 0)
            )  # no token: the product is not computed (a chunk without logits skips the head)
        table = self._ratios[weight_type]
        if columns <= table[-1][0]:
            (n0, r0), (n1, r1) = next((a, b) for a, b in zip(table, table[1:]) if a[0] <= columns <= b[0])
            return r0 + (r1 - r0) * (columns - n0) / (n1 - n0)
        growth = self._growth[weight_type]
        if growth is None:  # no batched rate: the last measured slope
            (n0, r0), (n1, r1) = table[-2], table[-1]
            growth = (r1 - r0) / (n1 - n0)
        return table[-1][1] + (columns - table[-1][0]) * growth

    def _weights_s(self, body_columns: int, head_columns: int) -> float:
        """Seconds of the matrix products of one llama_decode (before the caches' speed-up): the
        weights over body_columns tokens, the output head over head_columns (the tokens whose logits
        are kept). Without measured step ratios: one read, plus each further token's compute."""
        head_type, head_s = self._head or (None, 0.0)
        t = max(0, body_columns - 1) * self._body_rows_s + max(0, head_columns - 1) * self._head_rows_s
        if self._ratios is None:
            skipped = head_s if head_columns < 1 else 0.0
            return (
                t
                + self._weight_calibrated_s
                - skipped
                + (body_columns - 1) * self._body_s
                + max(0, head_columns - 1) * self._head_s
            )
        for weight_type, read_s in self._read_s.items():
            own_head = head_s if weight_type == head_type else 0.0
            t += (read_s - own_head) * self._ratio(weight_type, body_columns)
            t += own_head * self._ratio(weight_type, head_columns)
        return t

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
        cached = self.cache_speedup(n)
        ceiling = (self._weight_ceiling_s + self.kv_read_bytes(n) / self._ceiling_bps) / cached
        span = min(n, self._cal_window) if self._cal_window else n
        memory_s = (self._weight_calibrated_s + self._kv_full_s * n + self._kv_window_s * span) / self.kernel_speedup(
            n, cached
        )
        calibrated = memory_s + self._attn_full_s * n + self._attn_window_s * span + self._fixed_s
        return ceiling, max(calibrated, ceiling)

    # ---- more than one token per llama_decode -------------------------------------------
    def _attention_s(self, p0: int, p1: int) -> float:
        """Batched attention of the tokens at positions p0..p1-1 over their contexts, seconds."""
        if not self._attn_span_s:
            return 0.0
        spans = self._full_layers * causal_spans(p0, p1)
        if self._window_layers:
            spans += self._window_layers * causal_spans(p0, p1, self._window or None)
        return spans * self._attn_span_s

    def tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float:
        """Predicted seconds of ONE llama_decode computing n_tokens new tokens in each of n_seqs
        sequences (each at a context of n_ctx tokens), logits kept for every token (a speculative
        verify, a batched decode step). tokens_step_s(s, 1, 1) == step_s(s)[1]."""
        n, b, s = max(1, int(n_tokens)), max(1, int(n_seqs)), max(0, int(n_ctx))
        columns = n * b
        extra_weights = self._weights_s(columns, columns) - self._weight_calibrated_s  # compute: no cache speeds it up
        t = self.step_s(s)[1] + extra_weights + (columns - 1) * self._logits_fixed_s
        t += b * self._attention_s(s, s + n) - self._attention_s(s, s + 1) if columns > 1 else 0.0
        return t + (b - 1) * self.kv_read_bytes(s) / self._kv_bps

    def ceiling_tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float:
        """The pure bandwidth bound of the same step: weights once, every sequence's KV once."""
        b = max(1, int(n_seqs))
        return (self.spec.decode_weight_bytes + b * self.kv_read_bytes(max(0, int(n_ctx)))) / self._ceiling_bps

    def prefill_s(self, n_tokens: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Predicted seconds to prefill n_tokens prompt tokens after n_cached cached ones, in
        llama_decode chunks of n_batch tokens (each reads the weights once), up to the first
        token's logits (the output head and the logits' fixed cost once, for the last token)."""
        n, pos, chunk = max(0, int(n_tokens)), max(0, int(n_cached)), max(1, int(n_batch))
        if not n:
            return 0.0
        t = 0.0
        while n:
            k = min(chunk, n)
            head = 1 if k == n else 0  # the head runs for the last chunk's last token only
            weights_s, read_s = self._weights_s(k, head), self._weights_s(1, head)  # all k tokens; one read of them
            memory_s = read_s + self.kv_read_bytes(pos) / self._kv_bps  # the weights and the cached KV, once
            t += (
                memory_s / self.kernel_speedup(pos)
                + (weights_s - read_s)
                + self._step_fixed_s
                + self._attention_s(pos, pos + k)
            )
            pos, n = pos + k, n - k
        return t + self._logits_fixed_s

    def ttft_s(self, n_prompt: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Predicted time to first token: the prefill of what the cache does not hold (a prefix
        hit prefills the rest) and the first token's logits (sampling is in the fixed cost)."""
        cached = min(max(0, int(n_cached)), max(0, int(n_prompt) - 1))
        return self.prefill_s(int(n_prompt) - cached, cached, n_batch)

    def decode_s(self, n_prompt: int, n_output: int) -> float:
        """Predicted seconds of the decode steps after the first token: steps at contexts
        n_prompt + 1 .. n_prompt + n_output - 1 (the growing context)."""
        return sum(self.step_s(int(n_prompt) + i)[1] for i in range(1, max(0, int(n_output))))

    def e2e_s(self, n_prompt: int, n_output: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Predicted request time: TTFT + decode of the other n_output - 1 tokens."""
        return self.ttft_s(n_prompt, n_cached, n_batch) + self.decode_s(n_prompt, n_output)


def _ratio_table(weight_type: str, ratios: Mapping[str, Sequence[tuple[int, float]]]) -> list[tuple[int, float]]:
    """The measured step ratios of a weight type, or of the probed type nearest in bits per weight;
    with (1, 1.0) first."""
    if weight_type not in ratios:
        bpw = bits_per_weight(weight_type) if _known_type(weight_type) else 0.0
        weight_type = min(ratios, key=lambda t: abs(bits_per_weight(t) - bpw))
    return [(1, 1.0)] + sorted((int(n), float(r)) for n, r in ratios[weight_type] if int(n) > 1)


def _known_type(type_name: str) -> bool:
    try:
        bits_per_weight(type_name)
    except KeyError:
        return False
    return True
