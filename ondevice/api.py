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
from typing import Any

from ondevice.core.errors import InvalidParameterError
from ondevice.engine import Engine
from ondevice.engine import load as load_engine
from ondevice.gguf.spec import ModelSpec
from ondevice.probing import cached_probe, timing_for
from ondevice.roofline import Calibration, Prediction, Predictor, TimedPredictor
from ondevice.roofline import predict as roofline_predict

__all__ = ["load", "predict", "auto_predictor", "host_probe", "first_contact", "estimated_calibration", "FIRST_CONTACT"]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def load(
    model: str | Path | None = None,
    *,
    predictor: Any = "auto",
    timing: str = "quick",
    progress: Progress | None = None,
    **engine_args: Any,
) -> Engine:
    """Load a model into an Engine (ondevice.engine.load's arguments), with a roofline predictor.

    predictor "auto": this machine's bandwidth (the host probe: cached, or measured now, about a second) and
    the model's shape timed on this machine with the engine's settings (cached, or timed now on the engine:
    see auto_predictor). None: no prediction; or an object with step_s(n_ctx) -> (ceiling_step_s,
    predicted_step_s). timing: the plan when the model has not been timed here: "quick" (a first run: a
    second or so on a small model) or "full" (every chunk size, three rounds, batched steps: what `ondevice
    probe` and the bench use). progress(line) hears what slow step runs.
    """
    if timing not in ("quick", "full"):
        raise InvalidParameterError(f"timing must be 'quick' or 'full', not {timing!r}")
    if isinstance(predictor, str) and predictor != "auto":
        raise InvalidParameterError(
            f"predictor must be 'auto', None or an object with step_s(n_ctx), not {predictor!r}"
        )
    given = None if isinstance(predictor, str) else predictor
    if predictor == "auto":  # the machine first: its probe's arrays come and go before the model's weights load
        host_probe(_engine_backend(engine_args), progress)
    engine = load_engine(model, predictor=given, **engine_args)
    if predictor == "auto":
        try:
            engine.predictor = auto_predictor(engine, progress, full=timing == "full")
        except BaseException:
            engine.close()
            raise
    return engine


def _engine_backend(engine_args: dict[str, Any]) -> str:
    """The backend an engine loaded with these arguments runs on: the CPU without offload, else the build's."""
    from ondevice.probing import default_backend

    return "CPU" if engine_args.get("n_gpu_layers") == 0 else default_backend()


def host_probe(backend: str, progress: Progress | None = None):
    """This machine's cached host probe for `backend`, or the first-contact probe run (and cached) now."""
    return cached_probe(backend) or first_contact(backend, progress)


def auto_predictor(engine: Engine, progress: Progress | None = None, *, full: bool = False) -> Predictor | None:
    """The predictor of an engine's model: the bound from this machine's bandwidth, the prediction from the
    model's shape timed on the engine (cached; else timed now with the quick plan, or the full one). None for a
    model without weights."""
    from ondevice.probing.timing import FULL, QUICK

    spec = engine.info.spec
    if not spec.decode_weight_bytes:
        return None
    result = host_probe(engine.info.backend, progress)
    timing = timing_for(engine, plan=FULL if full else QUICK, progress=progress)
    return TimedPredictor(spec, result.calibration(), timing)


FIRST_CONTACT = "first run on this machine: measuring its memory bandwidth (once)"


def first_contact(backend: str, progress: Progress | None = None, *, refresh: bool = False, save: bool = True):
    """The fast host probe (memory bandwidth only), run and cached now; `ondevice probe` adds compute, the caches
    and the disk. refresh=True, save=False: measured again and not cached (benchmarks time it)."""
    from ondevice.probing import probe

    log.info(FIRST_CONTACT)
    if progress is not None:
        progress(FIRST_CONTACT)
    return probe(backend=backend, memory_passes=5, full=False, refresh=refresh, save=save)


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
        probe = host_probe(_engine_backend(engine_args or {}), progress)
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
    from ondevice.probing.timing import FULL

    engine = load_engine(model, **engine_args)
    try:
        return timing_for(engine, plan=FULL, progress=progress), engine.info.spec
    finally:
        engine.close()
