"""The wiring layer: the public entry points that put the engine, the probe cache and the
roofline together. Below it, each part knows nothing of the others' storage: the engine takes
a predictor and never looks one up; the roofline takes a probe and never reads a cache.

    load()     = engine.load() + the predictor from this machine's cached probe
    predict()  = a model's spec + the cached probe (or a given bandwidth) -> roofline.predict()
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ondevice.engine import Engine
from ondevice.engine import load as load_engine
from ondevice.errors import InvalidParameterError, ProbeError
from ondevice.modelspec import ModelSpec
from ondevice.probing import cached_probe
from ondevice.roofline import Prediction, Predictor
from ondevice.roofline import predict as roofline_predict

__all__ = ["load", "predict", "cached_predictor"]


def load(model: str | Path | None = None, *, predictor: Any = "auto", **engine_args: Any) -> Engine:
    """Load a model into an Engine (ondevice.engine.load's arguments), with a roofline predictor.

    predictor "auto": from this machine's cached probe for the engine's backend (None when no
    probe is cached: `ondevice probe` makes one); None: no prediction; or an object with
    step_s(n_ctx) -> (ceiling_step_s, calibrated_step_s).
    """
    if isinstance(predictor, str) and predictor != "auto":
        raise InvalidParameterError(f"predictor must be 'auto', None or an object with step_s(n_ctx), not {predictor!r}")
    given = None if isinstance(predictor, str) else predictor
    engine = load_engine(model, predictor=given, **engine_args)
    if predictor == "auto":
        try:
            engine.predictor = cached_predictor(engine.info.spec, engine.info.backend)
        except BaseException:
            engine.close()
            raise
    return engine


def cached_predictor(spec: ModelSpec, backend: str) -> Predictor | None:
    """A Predictor from this machine's cached probe for `backend`; None when none is cached or the
    spec has no weights. Never runs a probe (that takes up to a minute)."""
    if not spec.decode_weight_bytes:
        return None
    result = cached_probe(backend)
    cal = result.calibration() if result is not None else None
    return Predictor(spec, cal) if cal is not None else None


def predict(model_or_spec: ModelSpec | str | Path | None = None, *, ctx=(128, 2048), probe=None,
            bandwidth_gbs: float | None = None, prompt_tokens: int | str | None = "default", n_batch: int = 512,
            available_bytes: int | None = None, output_tokens: int | None = None) -> Prediction:
    """Ceiling, calibrated prediction, TTFT floor and memory verdict for a model on this machine.

    model_or_spec: a ModelSpec, a GGUF path or registry name (None = the default model).
    probe: a ProbeResult; None uses this machine's cached probe unless bandwidth_gbs is given.
    bandwidth_gbs: a bandwidth to use instead of the measured one (a machine you do not own);
    the prediction is then the pure ceiling only.
    """
    if probe is None and bandwidth_gbs is None:
        probe = cached_probe()
        if probe is None:
            raise ProbeError("no probe results for this machine: run `ondevice probe` first, or give a bandwidth")
    return roofline_predict(model_or_spec, ctx=ctx, probe=probe, bandwidth_gbs=bandwidth_gbs,
                            prompt_tokens=prompt_tokens, n_batch=n_batch, available_bytes=available_bytes,
                            output_tokens=output_tokens)
