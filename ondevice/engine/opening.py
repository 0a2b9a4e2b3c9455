"""Opening a model: the file resolved and checked, llama.cpp's model and context made, the engine warmed up."""

from __future__ import annotations

from pathlib import Path

from ondevice.engine.engine import Engine
from ondevice.engine.interface import Predictor, check_predictor
from ondevice.engine.loader import open_model

__all__ = ["load"]


def load(
    model: str | Path | None = None,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_batch: int | None = None,
    n_gpu_layers: int | str = "auto",
    flash_attn: bool | str = "auto",
    seed: int = 0,
    predictor: Predictor | None = None,
    n_ubatch: int | None = None,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    fit: bool = False,
) -> Engine:
    """Load a model (None = the default model, a registry name, or a GGUF path) into an Engine.

    n_ctx None is 4096 tokens, or the model's trained context when that is smaller; 0 is the trained
    context; any other size must be from 256 (llama.cpp's smallest) up to the trained context, else
    InvalidParameterError (llama.cpp rounds a size up to a multiple of 256). n_batch / n_ubatch / flash_attn default to
    llama.cpp's own defaults (2048 / 512 tokens, flash attention "auto"). cache_type_k/_v: the
    KV cache element types ("f16", "q8_0", "q4_0", ...; a quantized V cache needs flash
    attention). n_gpu_layers "auto" offloads every layer when this llama.cpp build can
    offload, else none. predictor: a Predictor (ondevice.engine.interface: step_s(n_ctx) -> (ceiling_step_s,
    calibrated_step_s)) that each token event is held against, or None (ondevice.load passes
    the one from this machine's cached probe). A load that will not fit the free memory is refused before
    llama.cpp allocates anything (InsufficientMemoryError, with the figures); fit=True instead chooses the
    largest context up to n_ctx (None: the trained context) and the most GPU layers that fit
    (engine.info.fit_reason says what was chosen and why).
    """
    from ondevice.gguf.loadcheck import inspect_for_load
    from ondevice.models.materialize import resolve_model

    pred = check_predictor(predictor)
    path = resolve_model(model)
    # GGUFFormatError for a malformed or inconsistent file, before llama.cpp sees it; KV bytes for the cache types used
    spec = inspect_for_load(path).with_kv_cache(cache_type_k, cache_type_v)
    handle, info = open_model(
        path,
        spec,
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_gpu_layers=n_gpu_layers,
        flash_attn=flash_attn,
        seed=seed,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        fit=fit,
    )
    engine = Engine(handle, info, pred)
    try:
        engine._warm_up()
    except BaseException:
        engine.close()
        raise
    return engine
