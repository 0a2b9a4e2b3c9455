"""The roofline (pure arithmetic: no files, no caches): from a model's spec and a machine's
bandwidth and calibration, how fast decoding can go and how long the first token takes.

A decode step at context s reads the weights used for one token plus the KV cache of s tokens
(sliding-window layers capped): ceiling tok/s = bandwidth / those bytes. The calibrated step
time adds what the kernel probe measured (model.py has the formula, once).

- model.py       bytes per weight type, Calibration, Predictor: the step-time model (one token per step,
                 several per step, prefill, TTFT, E2E)
- attention.py   attention scores per step and per prompt chunk, the seconds of one score
- prediction.py  predict(): ceilings and predictions per context, TTFT floor, memory verdict
- spec.py        a spec typed in by hand (a model you do not have)
- estimate.py    decode speed on a machine you do not have, fitted on published llama.cpp runs
- target.py      that machine's backend, compute and memory; the compute behind the TTFT floor
"""

from ondevice.roofline.attention import attention_head_dims, attention_scores, causal_spans, score_s, score_weights
from ondevice.roofline.model import (
    Calibration,
    Predictor,
    bits_per_weight,
    cache_bytes,
    effective_gbs,
    effective_gflops,
    read_speedup,
)
from ondevice.roofline.prediction import (
    ContextPrediction,
    MemoryVerdict,
    Prediction,
    TTFTPrediction,
    memory_verdict,
    predict,
    prefill_flops,
)

__all__ = [
    "Calibration",
    "Predictor",
    "attention_head_dims",
    "attention_scores",
    "bits_per_weight",
    "causal_spans",
    "cache_bytes",
    "effective_gbs",
    "effective_gflops",
    "read_speedup",
    "score_s",
    "score_weights",
    "ContextPrediction",
    "MemoryVerdict",
    "Prediction",
    "TTFTPrediction",
    "memory_verdict",
    "predict",
    "prefill_flops",
]
