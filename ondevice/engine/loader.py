"""Open a GGUF for the engine: check the arguments, load through the one open path
(ondevice.llama.model, which applies the machine's crash-guard verdict), time it, detect the backend.

The file is checked with `ondevice.gguf.loadcheck` first (a malformed file raises GGUFFormatError
and never reaches llama.cpp). llama.cpp's log goes to the `logging` logger "ondevice.llama_cpp".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ondevice.core.errors import InvalidParameterError
from ondevice.core.kvtypes import DEFAULT_KV_TYPE, kv_ggml_type, kv_is_quantized
from ondevice.gguf.spec import ModelSpec
from ondevice.llama.devices import default_threads, detect_backends, gpu_layers, is_gpu_backend
from ondevice.llama.model import LlamaHandle, llama_lib, load_model, new_context

__all__ = [
    "EngineInfo",
    "open_model",
    "resolve_n_ctx",
    "context_settings",
    "sibling_context",
    "MIN_N_CTX",
    "DEFAULT_N_CTX",
]

# llama.cpp rounds every context up to a multiple of 256 (llama-context.cpp: GGML_PAD(n_ctx, 256)),
# so a smaller request is silently a context of 256 tokens.
MIN_N_CTX = 256
DEFAULT_N_CTX = 4096  # the context when none is asked for, capped at the model's trained context


@dataclass(frozen=True)
class EngineInfo:
    """How an engine was loaded. Request timings are on each Generation, not here."""

    model_path: str  # the GGUF file llama.cpp opened
    spec: ModelSpec  # the model's shape and byte arithmetic, from its header
    backend: str  # where the layers run: "CPU", "CUDA", "Metal", "Vulkan", ...
    n_gpu_layers: int  # layers actually offloaded (0 on a CPU-only build; n_layer + 1 = all, output included)
    n_threads: int  # CPU threads for decode and prefill
    n_batch: int  # prefill chunk, tokens per llama_decode (as llama.cpp set it: at most n_ctx)
    n_ctx: int  # context window, tokens (as llama.cpp set it: it may round the request up)
    flash_attn: bool | str  # as requested: True, False or "auto"
    load_s: float  # seconds from opening the file to the engine being ready
    llama_cpp_version: str  # llama-cpp-python version (and llama.cpp's, when it reports one)
    seed: int  # base seed; request k without a seed of its own draws with seed + k
    n_ubatch: int = 512  # tokens per compute pass inside one llama_decode (as llama.cpp set it)
    flash_attn_used: bool | None = None  # what llama.cpp resolved ("auto" included); None if it did not say
    cache_type_k: str = DEFAULT_KV_TYPE  # K cache element type ("f16", "q8_0", "q4_0", ...)
    cache_type_v: str = DEFAULT_KV_TYPE  # V cache element type
    cpu_buffers: str = "all"  # extra CPU buffer types allowed: "all" | "repack" | "none" (the crash guard's verdict)
    cpu_buffers_reason: str = ""  # why, e.g. "self-test: all: crashed (SIGSEGV); repack: ok"
    memory_need_bytes: int = 0  # what the load was predicted to take (ondevice.roofline.memory), RAM + device
    fit_reason: str = ""  # with fit=True: the context and offload chosen, and why
    recurrent: bool = False  # some layers keep a recurrent state: the cache is reused only where it is all a prefix

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "spec"}
        d["model"] = self.spec.name
        d["quant"] = self.spec.quant
        return d


def _flash_attn_type(lib: Any, flash_attn: Any) -> int:
    if flash_attn == "auto":
        return lib.LLAMA_FLASH_ATTN_TYPE_AUTO
    if isinstance(flash_attn, bool):
        return lib.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
    raise InvalidParameterError(f"flash_attn must be True, False or 'auto', not {flash_attn!r}")


def context_settings(info: EngineInfo, lib: Any) -> dict[str, Any]:
    """new_context's arguments for another context like the engine's: threads, n_batch, n_ubatch,
    flash attention (as requested: "auto" resolves the same way) and KV cache types."""
    return dict(
        n_threads=info.n_threads,
        n_batch=info.n_batch,
        n_ubatch=info.n_ubatch,
        flash_attn_type=_flash_attn_type(lib, info.flash_attn),
        type_k=int(kv_ggml_type(info.cache_type_k)),
        type_v=int(kv_ggml_type(info.cache_type_v)),
    )


def sibling_context(handle: LlamaHandle, info: EngineInfo, n_ctx: Any) -> tuple[LlamaHandle, EngineInfo]:
    """A second context on the model of `handle`, with info's settings and n_ctx tokens (n_batch and n_ubatch at most
    that): (its handle, which frees the context only, not the model; the EngineInfo it runs with). ModelLoadError
    when llama.cpp cannot allocate it."""
    n_ctx = _positive("n_ctx", n_ctx)
    settings = context_settings(info, handle.lib)
    settings["n_batch"], settings["n_ubatch"] = min(settings["n_batch"], n_ctx), min(settings["n_ubatch"], n_ctx)
    ctx, _ = new_context(handle.model, n_ctx=n_ctx, lib=handle.lib, **settings)
    sibling = LlamaHandle(handle.lib, handle.model, ctx, owns_model=False)
    n_ctx = int(handle.lib.llama_n_ctx(ctx))
    return sibling, replace(info, n_ctx=n_ctx, n_batch=settings["n_batch"], n_ubatch=settings["n_ubatch"])


def _positive(name: str, value: Any, *, allow_zero: bool = False) -> int:
    ok = isinstance(value, int) and not isinstance(value, bool) and (value > 0 or (allow_zero and value == 0))
    if not ok:
        raise InvalidParameterError(
            f"{name} must be a {'non-negative' if allow_zero else 'positive'} integer, not {value!r}"
        )
    return value


def resolve_n_ctx(n_ctx: Any, n_ctx_train: int | None = None) -> int:
    """The context size to ask llama.cpp for. None: DEFAULT_N_CTX, capped at the trained context;
    0: the trained context; otherwise MIN_N_CTX up to the trained context (when known), else
    InvalidParameterError. Past the trained context is refused rather than warned about: nothing
    here sets RoPE scaling, so the positions past it are ones the model never saw and its text
    degrades, which a warning line in a log (or under the chat's screen) would not make clear."""
    trained = n_ctx_train or None
    if n_ctx is None:
        return max(MIN_N_CTX, min(DEFAULT_N_CTX, trained or DEFAULT_N_CTX))
    n_ctx = _positive("n_ctx", n_ctx, allow_zero=True)
    if n_ctx == 0:
        return trained or DEFAULT_N_CTX
    if n_ctx < MIN_N_CTX:
        raise InvalidParameterError(
            f"n_ctx {n_ctx} is below llama.cpp's smallest context of {MIN_N_CTX} tokens (it would use {MIN_N_CTX} "
            f"anyway): give {MIN_N_CTX} or more, or 0 for the model's trained context"
        )
    if trained and n_ctx > max(trained, MIN_N_CTX):
        raise InvalidParameterError(
            f"n_ctx {n_ctx} is beyond the model's trained context of {trained} tokens (no RoPE scaling is set, so "
            f"text past it degrades): give at most {trained}, or 0 for the trained context"
        )
    return n_ctx


def open_model(
    path: Path,
    spec: ModelSpec,
    *,
    n_ctx: Any,
    n_threads: Any,
    n_batch: Any,
    n_gpu_layers: Any,
    flash_attn: Any,
    seed: Any,
    n_ubatch: Any = None,
    cache_type_k: str = DEFAULT_KV_TYPE,
    cache_type_v: str = DEFAULT_KV_TYPE,
    fit: bool = False,
) -> tuple[LlamaHandle, EngineInfo]:
    """Load `path` (already validated into `spec`) and create a one-sequence context.

    n_batch / n_ubatch None keep llama.cpp's defaults (2048 / 512, capped at n_ctx). Before llama.cpp
    allocates anything the need is held against the free memory: InsufficientMemoryError when it does
    not fit. fit: choose the largest context up to n_ctx (None or 0: the trained context) and the most
    GPU layers that fit instead (EngineInfo.fit_reason says what and why)."""
    fit_ctx_max = resolve_n_ctx(0 if n_ctx is None else n_ctx, spec.n_ctx_train) if fit else None
    n_ctx = resolve_n_ctx(n_ctx, spec.n_ctx_train)
    n_threads = default_threads() if n_threads is None else _positive("n_threads", n_threads)
    n_batch = None if n_batch is None else _positive("n_batch", n_batch)
    n_ubatch = None if n_ubatch is None else _positive("n_ubatch", n_ubatch)
    seed = _positive("seed", seed, allow_zero=True)
    if seed > 2**32 - 1:
        raise InvalidParameterError(f"seed must be in [0, {2**32 - 1}], not {seed}")
    type_k, type_v = kv_ggml_type(cache_type_k), kv_ggml_type(cache_type_v)
    if kv_is_quantized(cache_type_v) and flash_attn is False:
        raise InvalidParameterError(
            f"a quantized V cache ({cache_type_v}) needs flash attention: use flash_attn 'auto' or True"
        )
    lib = llama_lib()

    fa_type = _flash_attn_type(lib, flash_attn)
    requested_layers, offloaded = gpu_layers(lib, n_gpu_layers, spec.n_layer)
    n_ctx, requested_layers, offloaded, need, fit_reason = _memory_plan(
        path, spec, lib, n_ctx, fit_ctx_max, n_ubatch, flash_attn, requested_layers, offloaded
    )
    t0 = time.perf_counter_ns()
    model, placement = load_model(path, n_gpu_layers=requested_layers, lib=lib)
    try:
        ctx, fa_used = new_context(
            model,
            n_ctx=n_ctx,
            n_threads=n_threads,
            n_batch=n_batch,
            n_ubatch=n_ubatch,
            flash_attn_type=fa_type,
            type_k=int(type_k),
            type_v=int(type_v),
            lib=lib,
        )
    except BaseException:
        lib.llama_model_free(model)
        raise
    handle = LlamaHandle(lib, model, ctx)
    load_s = (time.perf_counter_ns() - t0) * 1e-9
    backends = detect_backends(lib)
    backend = backends[0] if (offloaded and is_gpu_backend(backends[0])) else "CPU"
    info = EngineInfo(
        model_path=str(path),
        spec=spec,
        backend=backend,
        n_gpu_layers=offloaded if backend != "CPU" else 0,
        n_threads=n_threads,
        n_batch=handle.n_batch,
        n_ctx=handle.n_ctx,
        flash_attn=flash_attn,
        load_s=load_s,
        llama_cpp_version=getattr(lib, "__version__", "unknown"),
        seed=seed,
        n_ubatch=int(lib.llama_n_ubatch(ctx)),
        flash_attn_used=fa_used,
        cache_type_k=cache_type_k.lower(),
        cache_type_v=cache_type_v.lower(),
        cpu_buffers=placement.cpu_buffers,
        cpu_buffers_reason=placement.reason,
        memory_need_bytes=need.total_bytes,
        fit_reason=fit_reason,
        recurrent=handle.recurrent,
    )
    return handle, info


def _memory_plan(path, spec, lib, n_ctx, fit_ctx_max, n_ubatch, flash_attn, requested_layers, offloaded):
    """(n_ctx, n_gpu_layers to ask for, layers offloaded, MemoryNeed, fit reason): the request checked
    against the free memory, or, with fit_ctx_max, the settings chosen to fit it."""
    from ondevice.engine.memcheck import backend_for, check_memory, free_memory, plan_fit, repacked_bytes_here

    reason = ""
    if fit_ctx_max is not None:
        choice = plan_fit(
            path,
            spec,
            ctx_max=fit_ctx_max,
            n_ubatch=n_ubatch,
            flash_attn=flash_attn,
            n_gpu_layers=requested_layers,
            lib=lib,
        )
        n_ctx, reason = choice.n_ctx, choice.reason
        if offloaded:
            requested_layers = offloaded = choice.n_gpu_layers
    backend = backend_for(lib, offloaded)
    need = check_memory(
        spec,
        free_memory(backend),
        n_ctx=n_ctx,
        n_ubatch=min(n_ubatch or 512, n_ctx),
        flash_attn=flash_attn,
        backend=backend,
        offloaded=offloaded if backend != "CPU" else 0,
        repacked=repacked_bytes_here(path, backend, offloaded, spec.n_layer, lib),
    )
    return n_ctx, requested_layers, offloaded, need, reason
