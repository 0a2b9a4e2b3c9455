"""What a model takes in memory, before it is loaded: weights, KV cache and buffers, on the GPU and
in RAM; the verdict against what is free; and the largest context (and GPU layers) that fit.

Two kinds of memory behave differently, and the estimate follows each:

- Device memory (CUDA, ROCm, Vulkan): llama.cpp's buffers are taken in full when made. The
  offloaded layers' weights (the input embedding always stays in RAM; the output head goes with
  the last of n_layer + 1 offloaded layers), their KV cache, and the compute buffer as llama.cpp
  reserves it: room for a pass of n_ubatch tokens with every token's logits
  (n_ubatch x (n_vocab + 2 d_model) floats; without flash attention also the attention scores,
  n_head x n_ctx per token).
- Host memory (the CPU backend; on a GPU build what stays in RAM): what the process's resident
  set grows by. The file is memory-mapped and read whole; weights CPU_REPACK re-lays out get a
  second, anonymous copy (the mapped pages stay resident until the kernel needs them); the KV
  cache is cleared when made, so all of it is resident; the output buffer holds one token's
  logits (n_vocab floats); the tokenizer's tables cost about VOCAB_ENTRY_BYTES an entry. The
  compute buffer is only address space until written, and a pass writes its activations, not the
  n_ubatch x n_vocab logits llama.cpp reserves room for (the engine keeps one token's logits):
  ACT_FLOATS x (d_model + d_ff) floats a token, plus the attention mask (n_ctx x n_ubatch halves per
  mask; f32 scores of every head without flash attention), plus what a first request allocates.

Unified memory (Metal) is one pool: the mapped file (Metal reads it in place), the KV cache and
the reserved compute buffer.

The CPU constants were solved on the default model and 1 MB and 50 MB synthetic ones
(benchmarks/memory_accuracy.py's "fit" rows) and checked on synthetic models of 300 MB to 3 GB
(Q4_0, Q8_0, F16: its "score" rows); the data are in benchmarks/data/memory_accuracy/. The GPU
terms are llama.cpp's own reservations, not fitted; benchmarks/device_check.py measures them.
"""

from __future__ import annotations

from dataclasses import dataclass

from ondevice.core.errors import InvalidParameterError
from ondevice.gguf.spec import ModelSpec

__all__ = [
    "MemoryNeed",
    "MemoryVerdict",
    "FitChoice",
    "memory_need",
    "memory_verdict",
    "fit_memory",
    "verdict_of",
    "FITS_SHARE",
    "FIT_SHARE",
    "VOCAB_ENTRY_BYTES",
]

FITS_SHARE = 0.8  # the verdict says "fits" up to 80% of the memory available; "tight" up to 100%
FIT_SHARE = 0.9  # --fit chooses settings whose need is at most 90% of what is free (a 10% margin)
# Solved on the fit rows of benchmarks/data/memory_accuracy (memory_accuracy.py --replay FILE --solve), rounded:
VOCAB_ENTRY_BYTES = 160  # llama.cpp's tokenizer tables (and ondevice's reading of them), per vocabulary entry
VOCAB_FIXED_BYTES = 6_300_000  # the rest of what a load adds to the process whatever the model
ACT_FLOATS = 4.3  # f32 a CPU pass writes per token, per unit of d_model + feed-forward width
REQUEST_FIXED_BYTES = 1_600_000  # what the first request adds whatever the model (batch, sampler, token lists)
_MIN_CTX = 256  # llama.cpp's smallest context (and the step it pads every context to)


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes a model needs at one context and offload, split by purpose and by where they live."""

    weight_bytes: int  # weights held: on the device the offloaded ones; in RAM the mapped file (+ repacked copies)
    kv_bytes: int  # KV cache at n_ctx, every layer holding n_ctx cells (llama.cpp allocates window layers in full)
    buffer_bytes: int  # compute and output buffers, the tokenizer's tables
    total_bytes: int  # the sum: device_bytes + host_bytes
    device_bytes: int  # of the total, on the GPU (0 without offload or on unified memory)
    host_bytes: int  # of the total, in RAM (unified memory: everything)
    n_ctx: int  # context, tokens
    n_gpu_layers: int  # layers offloaded (n_layer + 1 = all, the output head included)


@dataclass(frozen=True)
class MemoryVerdict:
    weight_bytes: int  # weights (see MemoryNeed)
    kv_bytes: int  # KV cache at n_ctx
    buffer_bytes: int  # compute and output buffers, tokenizer tables
    total_bytes: int  # the need weighed against `available_bytes`: device memory on a GPU, else all of it
    n_ctx: int  # context the KV cache is sized for, tokens
    available_bytes: int | None  # free RAM (CPU), VRAM (GPU) or the unified memory a GPU may use, when known
    where: str  # "RAM", "VRAM", "unified memory"
    verdict: str  # "fits" (<= 80% of available), "tight" (<= 100%), "does not fit", "unknown"
    host_bytes: int = 0  # of the need, in RAM
    device_bytes: int = 0  # of the need, on the GPU
    n_gpu_layers: int = 0  # layers offloaded in this estimate


@dataclass(frozen=True)
class FitChoice:
    """Settings --fit chose, and why."""

    n_ctx: int  # context, tokens
    n_gpu_layers: int  # layers to offload (0 on the CPU)
    need: MemoryNeed  # what those settings take
    available_bytes: int  # what was free where the binding need lives
    reason: str  # one sentence: what was chosen and why


def _d_ff(spec: ModelSpec) -> int:
    """Feed-forward width from the per-layer matrix parameters (the header's length is not in every spec)."""
    d, layers = spec.d_model or 0, spec.n_layer or 0
    if not d or not layers:
        return 0
    q = (spec.n_head or 1) * (spec.head_dim_k or d // max(1, spec.n_head or 1))
    kv = 2 * (spec.n_head_kv or 1) * (spec.head_dim_k or 0)
    matmul = max(0, spec.n_params_active - (spec.n_vocab or 0) * d * (1 if spec.tied_output else 2)) / layers
    return max(0, int((matmul - d * (2 * q + kv)) / (3 * d)))


def _masks(spec: ModelSpec) -> int:
    return 2 if spec.sliding_window and spec.swa_layers else 1


def _reserved_compute(spec: ModelSpec, n_ctx: int, n_ubatch: int, flash_attn: bool, head_here: bool) -> int:
    """The compute buffer llama.cpp reserves (what a GPU takes): n_ubatch tokens, their logits when the head is here."""
    d = spec.d_model or 0
    per_token = (spec.n_vocab or 0) * head_here + 2 * d
    if not flash_attn:
        per_token += (spec.n_head or 1) * n_ctx
    return 4 * n_ubatch * per_token


def _touched_compute(spec: ModelSpec, n_ctx: int, n_ubatch: int, flash_attn: bool) -> int:
    """The part of a CPU compute buffer a pass writes (RSS)."""
    d = spec.d_model or 0
    acts = 4 * n_ubatch * ACT_FLOATS * (d + _d_ff(spec)) + REQUEST_FIXED_BYTES
    scores = _masks(spec) * n_ctx * n_ubatch * 2 if flash_attn else 4 * n_ubatch * n_ctx * ((spec.n_head or 1) + 1)
    return int(acts + scores)


def _embd_bytes(spec: ModelSpec) -> int:
    """The input embedding (a row gather), which a full offload leaves in RAM: for a dense model what the
    file holds beyond one decode step's reads; for MoE (unused experts are in that too) the head's size."""
    if spec.tied_output:
        return 0
    if not spec.n_expert:
        return max(0, spec.weight_bytes - spec.decode_weight_bytes)
    return min(spec.head_bytes or 0, spec.weight_bytes)


def memory_need(
    spec: ModelSpec,
    *,
    n_ctx: int,
    n_ubatch: int = 512,
    flash_attn: bool = True,
    backend: str = "CPU",
    n_gpu_layers: int = 0,
    unified: bool = False,
    repacked_bytes: int = 0,
) -> MemoryNeed:
    """The memory a load of `spec` at n_ctx takes on `backend` with n_gpu_layers offloaded (all: n_layer + 1).

    repacked_bytes: weights llama.cpp's CPU_REPACK copies on this machine's CPU backend (a second copy in RAM)."""
    if not isinstance(n_ctx, int) or n_ctx <= 0:
        raise InvalidParameterError(f"context must be a positive number of tokens, not {n_ctx!r}")
    n_ubatch = max(1, min(n_ubatch, n_ctx))
    kv = n_ctx * spec.kv_bytes_per_token + spec.state_bytes  # and a recurrent model's state (one sequence)
    tokenizer = VOCAB_ENTRY_BYTES * (spec.n_vocab or 0) + VOCAB_FIXED_BYTES
    output = 4 * (spec.n_vocab or 0)
    layers = spec.n_layer or 0
    gpu = backend.upper() not in ("CPU", "BLAS", "ACCELERATE") and n_gpu_layers > 0
    if unified and gpu:  # one pool: the mapped file, KV, the reserved compute buffer
        buffers = _reserved_compute(spec, n_ctx, n_ubatch, flash_attn, True) + output + tokenizer
        total = spec.file_bytes + kv + buffers
        return MemoryNeed(spec.file_bytes, kv, buffers, total, 0, total, n_ctx, min(n_gpu_layers, layers + 1))
    if not gpu:
        weights = spec.file_bytes + repacked_bytes
        buffers = _touched_compute(spec, n_ctx, n_ubatch, flash_attn) + output + tokenizer
        total = weights + kv + buffers
        return MemoryNeed(weights, kv, buffers, total, 0, total, n_ctx, 0)
    k = min(n_gpu_layers, layers + 1)
    head_here = k > layers
    head = spec.head_bytes or 0  # the output head (token_embd when tied: llama.cpp then puts a copy on the GPU)
    blocks = max(0, spec.weight_bytes - _embd_bytes(spec) - head)
    dev_blocks = blocks * min(k, layers) // max(1, layers)
    dev_weights = dev_blocks + (head if head_here else 0)
    dev_kv = kv * min(k, layers) // max(1, layers)
    dev_buf = _reserved_compute(spec, n_ctx, n_ubatch, flash_attn, head_here)
    if 0 < k <= layers:  # partial offload: llama.cpp copies a CPU layer's weights over for big batches
        dev_buf += blocks // max(1, layers)
    # what stays mapped in RAM: the offloaded part is read once and unmapped; a tied head's file copy stays
    host_weights = spec.file_bytes - dev_blocks - (head if head_here and not spec.tied_output else 0)
    host_buf = output + tokenizer + (_touched_compute(spec, n_ctx, n_ubatch, flash_attn) if k <= layers else 0)
    device = dev_weights + dev_kv + dev_buf
    host = host_weights + (kv - dev_kv) + host_buf
    return MemoryNeed(dev_weights + host_weights, kv, dev_buf + host_buf, device + host, device, host, n_ctx, k)


def verdict_of(need: int, available: int | None) -> str:
    if not available:
        return "unknown"
    if need <= FITS_SHARE * available:
        return "fits"
    return "tight" if need <= available else "does not fit"


def memory_verdict(
    spec: ModelSpec,
    *,
    n_ctx: int,
    n_batch: int = 512,
    available_bytes: int | None,
    where: str,
    backend: str = "CPU",
    n_gpu_layers: int = 0,
    flash_attn: bool = True,
    repacked_bytes: int = 0,
) -> MemoryVerdict:
    """The need at n_ctx against what is available `where`. n_batch: tokens per compute pass (llama.cpp's
    n_ubatch). On a GPU the need weighed is the device's; on the CPU or unified memory, all of it."""
    unified = where == "unified memory"
    need = memory_need(
        spec,
        n_ctx=n_ctx,
        n_ubatch=n_batch,
        flash_attn=flash_attn,
        backend=backend,
        n_gpu_layers=n_gpu_layers,
        unified=unified,
        repacked_bytes=repacked_bytes,
    )
    weighed = need.device_bytes if need.device_bytes else need.total_bytes
    return MemoryVerdict(
        weight_bytes=need.weight_bytes,
        kv_bytes=need.kv_bytes,
        buffer_bytes=need.buffer_bytes,
        total_bytes=weighed,
        n_ctx=n_ctx,
        available_bytes=available_bytes,
        where=where,
        verdict=verdict_of(weighed, available_bytes),
        host_bytes=need.host_bytes,
        device_bytes=need.device_bytes,
        n_gpu_layers=need.n_gpu_layers,
    )


def _largest(lo: int, hi: int, ok) -> int | None:
    """The largest x in [lo, hi] with ok(x), for ok true up to some point and false after it (None: none)."""
    if hi < lo or not ok(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def fit_memory(
    spec: ModelSpec,
    *,
    ctx_max: int,
    backend: str = "CPU",
    device_free_bytes: int | None = None,
    host_free_bytes: int,
    ctx_floor: int = 4096,
    n_ubatch: int = 512,
    flash_attn: bool = True,
    unified: bool = False,
    repacked_bytes: int = 0,
) -> FitChoice:
    """The largest context up to ctx_max and, on a GPU, the most offloaded layers that fit FIT_SHARE of what
    is free. On a GPU every layer is offloaded first, with the context lowered down to ctx_floor if need be;
    only then are layers left in RAM (llama.cpp's own fit does the same). InvalidParameterError, with the
    figures, when not even the smallest context fits with nothing offloaded."""
    layers = spec.n_layer or 0
    gpu = backend.upper() not in ("CPU", "BLAS", "ACCELERATE") and (unified or bool(device_free_bytes))
    host_cap = int(FIT_SHARE * host_free_bytes)
    dev_cap = int(FIT_SHARE * (device_free_bytes or 0))
    top = max(1, ctx_max // _MIN_CTX)

    def need(steps: int, k: int) -> MemoryNeed:
        return memory_need(
            spec,
            n_ctx=steps * _MIN_CTX,
            n_ubatch=n_ubatch,
            flash_attn=flash_attn,
            backend=backend if k else "CPU",
            n_gpu_layers=k,
            unified=unified,
            repacked_bytes=0 if k else repacked_bytes,
        )

    def fits(steps: int, k: int) -> bool:
        n = need(steps, k)
        return n.host_bytes <= host_cap and n.device_bytes <= (dev_cap if n.device_bytes else 0)

    all_k = layers + 1 if gpu else 0
    floor = max(1, min(ctx_floor, ctx_max) // _MIN_CTX)
    steps = _largest(floor if gpu else 1, top, lambda s: fits(s, all_k))
    k = all_k
    if steps is None and gpu:
        k = _largest(0, layers, lambda j: fits(floor, j)) or 0
        steps = _largest(1, top, lambda s: fits(s, k))
    if steps is None:
        smallest = need(1, 0)
        raise InvalidParameterError(
            f"{spec.name or spec.path or 'the model'} does not fit even at {_MIN_CTX} tokens of context with "
            f"nothing offloaded: needs {smallest.host_bytes / 1e9:.2f} GB of RAM, {host_free_bytes / 1e9:.2f} GB "
            "available"
        )
    chosen = need(steps, k)
    return FitChoice(
        n_ctx=steps * _MIN_CTX,
        n_gpu_layers=k,
        need=chosen,
        available_bytes=(device_free_bytes or 0) if chosen.device_bytes else host_free_bytes,
        reason=_fit_reason(spec, chosen, ctx_max, all_k, device_free_bytes, host_free_bytes, unified),
    )


def _fit_reason(spec, need: MemoryNeed, ctx_max, all_k, dev_free, host_free, unified) -> str:
    gb = lambda b: f"{b / 1e9:.2f} GB"  # noqa: E731 - one format, four uses
    ctx = f"context {need.n_ctx}" + (" (the most asked for)" if need.n_ctx >= ctx_max else "")
    if need.device_bytes:
        where = f"{gb(need.device_bytes)} of {gb(dev_free)} free VRAM and {gb(need.host_bytes)} of RAM"
    else:
        where = f"{gb(need.total_bytes)} of {gb(host_free)} available {'unified memory' if unified else 'RAM'}"
    layers = ""
    if all_k:
        layers = (
            f", all {all_k} layers on the GPU"
            if need.n_gpu_layers == all_k
            else f", {need.n_gpu_layers} of {all_k} layers on the GPU (all do not fit at this context)"
        )
    return f"{ctx}{layers}: needs {where}, within the {FIT_SHARE:.0%} of it --fit allows"
