"""Attention arithmetic of the step-time model: how many scores a step or a prompt chunk computes,
and what one score costs from the probe's table (model.py's formula uses both)."""

from __future__ import annotations

from collections.abc import Sequence

from ondevice.gguf.spec import ModelSpec

__all__ = ["attention_scores", "causal_spans", "score_weights", "score_s", "attention_head_dims"]


def attention_scores(spec: ModelSpec, n_ctx: int, *, windowed: bool = True) -> int:
    """Attention scores of one decode step at a context of n_ctx tokens: every query head
    scores every cached token, in every layer (n_head x span per layer; a score is a dot
    product of head_dim, a softmax entry and a weighted sum of values). Windowed layers span
    at most the window, unless windowed=False (a runtime that masks instead)."""
    if not spec.n_head or not spec.n_layer:
        return 0
    swa = set(spec.swa_layers) if spec.sliding_window and windowed else set()
    n_swa = sum(1 for i in range(spec.n_layer) if i in swa)
    span_swa = min(n_ctx, spec.sliding_window) if spec.sliding_window else n_ctx
    return spec.n_head * ((spec.n_layer - n_swa) * n_ctx + n_swa * span_swa)


def causal_spans(p0: int, p1: int, window: int | None = None) -> float:
    """Cached tokens attended by the prompt tokens at positions p0..p1-1 (token i attends i+1,
    at most `window`): sum over i of min(i + 1, window)."""

    def upto(p: int) -> float:  # tokens 0..p-1
        if not window or p <= window:
            return p * (p + 1) / 2
        return window * (window + 1) / 2 + (p - window) * window

    return upto(p1) - upto(p0)


def score_weights(table: Sequence[tuple[int, float]], head_dims: int) -> list[float]:
    """How much of each entry of a (head dims, seconds per score) table makes the cost of one score
    of a head of head_dims: linear between the two nearest entries, the nearest one alone past either
    end (so score_s is linear in the table's seconds, which kernel.fit_points solves for)."""
    dims = [d for d, _ in table]
    weights = [0.0] * len(dims)
    if not dims:
        return weights
    if head_dims <= dims[0] or head_dims >= dims[-1]:
        weights[0 if head_dims <= dims[0] else -1] = 1.0
        return weights
    i = next(k for k in range(1, len(dims)) if head_dims <= dims[k])
    f = (head_dims - dims[i - 1]) / (dims[i] - dims[i - 1])
    weights[i - 1], weights[i] = 1.0 - f, f
    return weights


def score_s(table: Sequence[tuple[int, float]], head_dims: int) -> float:
    """Seconds of one attention score for a head of head_dims (key + value dims), from the probe's
    table (score_weights); 0 without one."""
    return sum(w * s for w, (_d, s) in zip(score_weights(table, head_dims), table))


def attention_head_dims(spec: ModelSpec) -> int:
    """Head dimensions one attention score works through: the key's (dot product) plus the
    value's (weighted sum); 0 when unknown."""
    return (spec.head_dim_k or 0) + (spec.head_dim_v or 0)
