"""The wiring layer: the public entry points that put the engine, the probe cache and the
roofline together. Below it, each part knows nothing of the others' storage: the engine takes
a predictor and never looks one up; the roofline takes a probe and never reads a cache.

    load()     = engine.load() + the predictor from this machine's cached probe
    predict()  = a model's spec + the cached probe (or a given bandwidth) -> roofline.predict()
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ondevice.core.errors import InvalidParameterError, ProbeError
from ondevice.engine import Engine
from ondevice.engine import load as load_engine
from ondevice.gguf.spec import ModelSpec
from ondevice.probing import cached_probe
from ondevice.roofline import Calibration, Prediction, Predictor
from ondevice.roofline import predict as roofline_predict

__all__ = ["load", "predict", "cached_predictor", "auto_predictor", "first_contact", "estimated_calibration"]

log = logging.getLogger(__name__)
Progress = Callable[[str], None]


def load(
    model: str | Path | None = None, *, predictor: Any = "auto", progress: Progress | None = None, **engine_args: Any
) -> Engine:
    """Load a model into an Engine (ondevice.engine.load's arguments), with a roofline predictor.

    predictor "auto": from this machine's cached probe for the engine's backend; on first contact
    (nothing cached) the fast host probe runs once (about 3 s, then cached: see first_contact) and
    the prediction is an estimate until `ondevice probe` calibrates it. None: no prediction; or an
    object with step_s(n_ctx) -> (ceiling_step_s, calibrated_step_s). progress(line) hears what
    slow step runs (the first-contact probe).
    """
    if isinstance(predictor, str) and predictor != "auto":
        raise InvalidParameterError(
            f"predictor must be 'auto', None or an object with step_s(n_ctx), not {predictor!r}"
        )
    given = None if isinstance(predictor, str) else predictor
    engine = load_engine(model, predictor=given, **engine_args)
    if predictor == "auto":
        try:
            engine.predictor = auto_predictor(engine.info.spec, engine.info.backend, progress)
        except BaseException:
            engine.close()
            raise
    return engine


def cached_predictor(spec: ModelSpec, backend: str) -> Predictor | None:
    """A Predictor from this machine's cached kernel probe for `backend`; None when none is cached or the
    spec has no weights. Never runs a probe (that takes up to a minute)."""
    if not spec.decode_weight_bytes:
        return None
    result = cached_probe(backend)
    cal = result.calibration() if result is not None else None
    return Predictor(spec, cal) if cal is not None else None


def auto_predictor(spec: ModelSpec, backend: str, progress: Progress | None = None) -> Predictor | None:
    """The kernel-calibrated Predictor when cached; else one from the host probe (cached, or measured
    now by first_contact), its step times the bound scaled by the published-measurement estimate."""
    if not spec.decode_weight_bytes:
        return None
    result = cached_probe(backend)
    if result is None:
        result = first_contact(backend, progress)
    cal = result.calibration()
    return Predictor(spec, cal if cal is not None else estimated_calibration(result, spec))


FIRST_CONTACT = "first run on this machine: measuring its memory bandwidth (about 3 s, once)"
FIRST_CONTACT_PASSES = 10  # memory-probe passes on first contact: a pass costs ~10 ms once the arrays are filled
# (the fill is most of the probe), and the best of more passes holds against a neighbour's burst (3 gave 0.91-0.98 of C)


def first_contact(backend: str, progress: Progress | None = None, *, refresh: bool = False, save: bool = True):
    """The fast host probe (memory bandwidth and compute, no kernel probe, no disk read: that
    takes another second and only the cold-start prediction needs it), run and cached now.
    refresh=True, save=False: measured again and not cached (benchmarks/probe_accuracy.py times it)."""
    from ondevice.probing import probe

    log.info(FIRST_CONTACT)
    if progress is not None:
        progress(FIRST_CONTACT)
    return probe(
        kernel=False, backend=backend, memory_passes=FIRST_CONTACT_PASSES, disk=False, refresh=refresh, save=save
    )


def estimated_calibration(result, spec: ModelSpec) -> Calibration:
    """The host probe's calibration with the decode step that published llama.cpp measurements
    show for this backend and weight type (roofline.estimate); EstimateDataError if its data is damaged."""
    from ondevice.roofline.estimate import estimated_calibration as estimate_from

    return estimate_from(result.host_calibration(), spec)


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
) -> Prediction:
    """Ceiling, calibrated prediction, TTFT floor and memory verdict for a model on this machine.

    model_or_spec: a ModelSpec, a GGUF path or registry name (None = the default model).
    probe: a ProbeResult; None uses this machine's cached probe unless bandwidth_gbs is given.
    bandwidth_gbs: a bandwidth to use instead of the measured one (a machine you do not own);
    the prediction is then the ceiling and an estimate fitted on published llama.cpp runs.
    target: that machine's backend, compute and memory (ondevice.roofline.target.make_target).
    """
    if probe is None and bandwidth_gbs is None:
        probe = cached_probe()
        if probe is None:
            raise ProbeError("no probe results for this machine: run `ondevice probe` first, or give a bandwidth")
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
    )
