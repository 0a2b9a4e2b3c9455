"""The roofline (pure arithmetic: no files, no caches): from a model's spec and a machine's
bandwidth, the bound on decoding; from the model's shape timed on this machine, the prediction.

A decode step at context s reads the weights used for one token plus the KV cache of s tokens
(sliding-window layers capped): ceiling tok/s = bandwidth / those bytes. The prediction is what the
model's twin measured here, moved to other contexts and prompt lengths by attention arithmetic.

- model.py       bytes per weight type, Calibration, Predictor: the bound, and the analytic step model
                 that stands in where nothing was timed (the estimate for a machine you do not have)
- timing.py      ShapeTiming (a model's shape timed), TimedPredictor (the prediction from it), layers
- attention.py   cached tokens a decode step attends, attention cells of a prompt chunk
- prediction.py  predict(): ceilings and predictions per context, TTFT, memory verdict
- spec.py        a spec typed in by hand (a model you do not have)
- estimate.py    decode speed on a machine you do not have, fitted on published llama.cpp runs:
  measurements.py  the published runs (the table), estimate_fit.py  the fit and its leave-one-out range
- target.py      that machine's backend, compute and memory; the compute behind the TTFT floor
"""

from ondevice.roofline.attention import attention_head_dims, causal_spans, chunk_cells, decode_spans
from ondevice.roofline.model import Calibration, Predictor, bits_per_weight, chunk_flops, effective_gbs, read_speedup
from ondevice.roofline.prediction import (
    ContextPrediction,
    MemoryVerdict,
    Prediction,
    TTFTPrediction,
    memory_verdict,
    predict,
    prefill_flops,
)
from ondevice.roofline.timing import ShapeTiming, TimedPredictor, extrapolate_layers

__all__ = [
    "Calibration",
    "Predictor",
    "ShapeTiming",
    "TimedPredictor",
    "attention_head_dims",
    "bits_per_weight",
    "causal_spans",
    "chunk_cells",
    "chunk_flops",
    "decode_spans",
    "effective_gbs",
    "extrapolate_layers",
    "read_speedup",
    "ContextPrediction",
    "MemoryVerdict",
    "Prediction",
    "TTFTPrediction",
    "memory_verdict",
    "predict",
    "prefill_flops",
]
