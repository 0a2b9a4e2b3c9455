"""The wiring layer: the public entry points that put the engine, the probes and the roofline together.
Below it, each part knows nothing of the others' storage: the engine takes a predictor and never looks
one up; the roofline takes measurements and never reads a cache.

    load()     = engine.load() + the predictor: this machine's bandwidth (the bound) and the model's
                 shape timed here (cached per shape, machine, build and settings)
    predict()  = a model's spec + the probe + its timing -> roofline.predict()
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from ondevice.core.errors import InvalidParameterError
from ondevice.engine import Engine
from ondevice.engine import load as load_engine
from ondevice.engine.interface import Predictor
from ondevice.gguf.spec import ModelSpec
from ondevice.probing import cached_probe, timing_for
from ondevice.roofline import Calibration, Prediction, TimedPredictor
from ondevice.roofline import predict as roofline_predict

__all__ = [
    "load",
    "predict",
    "auto_predictor",
    "host_probe",
    "first_contact",
    "estimated_calibration",
    "FIRST_CONTACT",
    "FIRST_CONTACT_PASSES",
]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def load(
    model: str | Path | None = None,
    *,
    n_ctx: int | None = None,
    n_threads: int | None = None,
    n_batch: int | None = None,
    n_ubatch: int | None = None,
    n_gpu_layers: int | str = "auto",
    flash_attn: bool | str = "auto",
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    seed: int = 0,
    fit: bool = False,
    predictor: Predictor | Literal["auto"] | None = "auto",
    timing: Literal["quick", "full"] = "quick",
    retime: bool = False,
    progress: Progress | None = None,
) -> Engine:
    """Load a model into an Engine that holds each token against a roofline prediction.

    Args:
        model: a GGUF path, a registry name, or None for the default model.
        n_ctx: context size in tokens; None is 4096 or the model's trained context when smaller, 0 the trained
            context.
        n_threads: CPU threads; None lets llama.cpp choose.
        n_batch, n_ubatch: prompt tokens per llama_decode call and per compute pass (llama.cpp's 2048 / 512).
        n_gpu_layers: layers offloaded to the GPU; "auto" offloads every layer when the build can.
        flash_attn: True, False or "auto" (llama.cpp's default).
        cache_type_k, cache_type_v: KV cache element types ("f16", "q8_0", "q4_0", ...).
        seed: the first request's sampling seed.
        fit: choose the largest context up to n_ctx and the most GPU layers that fit the free memory.
        predictor: "auto" builds one from this machine's bandwidth (the host probe: cached, or measured now, about
            a second) and the model's shape timed here (cached, or timed now: see auto_predictor); None: no
            prediction; or any ondevice.engine.interface.Predictor.
        timing: the plan when the model has not been timed here: "quick" (a second or so on a small model) or
            "full" (every chunk size, three rounds, batched steps: what `ondevice probe` and the bench use).
        retime: time the model again with that plan even when a timing is cached (the machine's speed has moved
            since: probing.drift).
        progress: called with a line naming each slow step as it starts.

    Returns:
        The loaded Engine (a context manager: close() frees the model).

    Raises:
        InvalidParameterError: a setting out of range (a context below 256 or over the trained one, an unknown
            KV cache type, a predictor without step_s, a timing other than "quick" or "full").
        ModelNotFoundError: no model file at that path or registry name.
        DefaultModelError: the default model is not installed.
        GGUFFormatError: the file is not a GGUF llama.cpp can load (checked before llama.cpp reads it).
        InsufficientMemoryError: the model and its KV cache do not fit the free memory (without fit=True).
        ModelLoadError: llama.cpp refused the model or its context.
        ProbeError: predictor="auto" and this machine's bandwidth could not be measured.
    """
    if timing not in ("quick", "full"):
        raise InvalidParameterError(f"timing must be 'quick' or 'full', not {timing!r}")
    if isinstance(predictor, str) and predictor != "auto":
        raise InvalidParameterError(f"predictor must be 'auto', None or a Predictor (with step_s), not {predictor!r}")
    auto = predictor == "auto"
    if auto:  # the machine first: its probe's arrays come and go before the model's weights load
        host_probe(_engine_backend(n_gpu_layers), progress)
    engine = load_engine(
        model,
        n_ctx=n_ctx,
        n_threads=n_threads,
        n_batch=n_batch,
        n_ubatch=n_ubatch,
        n_gpu_layers=n_gpu_layers,
        flash_attn=flash_attn,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        seed=seed,
        fit=fit,
        predictor=None if isinstance(predictor, str) else predictor,
    )
    if auto:
        try:
            engine.predictor = auto_predictor(engine, progress, full=timing == "full", refresh=retime)
        except BaseException:
            engine.close()
            raise
    return engine


def _engine_backend(n_gpu_layers: int | str | None) -> str:
    """The backend an engine with this offload runs on: the CPU without offload, else the build's."""
    from ondevice.probing import default_backend

    return "CPU" if n_gpu_layers == 0 else default_backend()


def host_probe(backend: str, progress: Progress | None = None):
    """This machine's cached host probe for `backend`, or the first-contact probe run (and cached) now."""
    return cached_probe(backend) or first_contact(backend, progress)


def auto_predictor(
    engine: Engine, progress: Progress | None = None, *, full: bool = False, refresh: bool = False
) -> TimedPredictor | None:
    """The predictor of an engine's model: the bound from this machine's bandwidth, the prediction from the
    model's shape timed on the engine (cached unless `refresh`; else timed now with the quick plan, or the full
    one). None for a model without weights."""
    from ondevice.probing.plans import FULL, QUICK

    spec = engine.info.spec
    if not spec.decode_weight_bytes:
        return None
    result = host_probe(engine.info.backend, progress)
    timing = timing_for(engine, plan=FULL if full else QUICK, progress=progress, refresh=refresh)
    return TimedPredictor(spec, result.calibration(), timing)


FIRST_CONTACT = "first run on this machine: measuring its memory bandwidth (once)"
FIRST_CONTACT_PASSES = 5  # read passes of the first-contact probe (benchmarks/host_accuracy.py times the same)


def first_contact(backend: str, progress: Progress | None = None, *, refresh: bool = False, save: bool = True):
    """The fast host probe (memory bandwidth only), run and cached now; `ondevice probe` adds compute, the caches
    and the disk. refresh=True, save=False: measured again and not cached (benchmarks time it)."""
    from ondevice.probing import probe

    log.info(FIRST_CONTACT)
    if progress is not None:
        progress(FIRST_CONTACT)
    return probe(backend=backend, memory_passes=FIRST_CONTACT_PASSES, full=False, refresh=refresh, save=save)


def estimated_calibration(result, spec: ModelSpec) -> Calibration:
    """The host probe's bound with the decode step that published llama.cpp measurements show for this
    backend and weight type (roofline.estimate): a machine whose model was not timed. EstimateDataError if
    its data is damaged."""
    from ondevice.roofline.estimate import estimated_calibration as estimate_from

    return estimate_from(result.calibration(), spec)


def predict(
    model_or_spec: ModelSpec | str | Path | None = None,
    *,
    ctx=(128, 2048),
    probe=None,
    bandwidth_gbs: float | None = None,
    prompt_tokens: int | str | None = "default",
    n_batch: int = 512,
    available_bytes: int | None = None,
    output_tokens: int | None = None,
    target=None,
    timing=None,
    progress: Progress | None = None,
    engine_args: dict[str, Any] | None = None,
) -> Prediction:
    """Ceiling, prediction, TTFT and memory verdict for a model on this machine.

    model_or_spec: a ModelSpec, a GGUF path or registry name (None = the default model).
    probe: a ProbeResult; None uses this machine's cached probe (measuring the bandwidth when there is none),
    unless bandwidth_gbs is given. A model file is timed on this machine (cached; ondevice.engine.load's
    engine_args) unless `timing` is given. bandwidth_gbs: a machine you do not own: the prediction is then
    the ceiling and an estimate fitted on published llama.cpp runs. target: that machine's backend,
    compute and memory (ondevice.roofline.target.make_target).
    """
    if probe is None and bandwidth_gbs is None:
        probe = host_probe(_engine_backend((engine_args or {}).get("n_gpu_layers")), progress)
    if bandwidth_gbs is None and timing is None and not isinstance(model_or_spec, ModelSpec):
        timing, model_or_spec = _time_file(model_or_spec, progress, engine_args or {})
    return roofline_predict(
        model_or_spec,
        ctx=ctx,
        probe=probe,
        bandwidth_gbs=bandwidth_gbs,
        prompt_tokens=prompt_tokens,
        n_batch=n_batch,
        available_bytes=available_bytes,
        output_tokens=output_tokens,
        target=target,
        timing=timing,
    )


def _time_file(model: str | Path | None, progress: Progress | None, engine_args: dict[str, Any]):
    """(the model's timing on this machine, its spec): cached, or timed now on an engine of it (the full plan)."""
    from ondevice.probing.plans import FULL

    engine = load_engine(model, **engine_args)
    try:
        return timing_for(engine, plan=FULL, progress=progress), engine.info.spec
    finally:
        engine.close()
