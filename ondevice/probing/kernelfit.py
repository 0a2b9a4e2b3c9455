"""The kernel probe's decode fit: from its runs (FitPoint), the step-time model's terms.

    step_s = sum_type (bytes_type / bw_type) + t0 + n_layer * layer_s + n_vocab * vocab_s + rows * row_s
             + attn_scores * score_s(head_dims)

fit_points sets each term from the runs that carry its signal (one linear system); the cached
models' kernel rates come apart, after it. fit_prefill then solves the batched rates (prefill) on
top of the decode fit. probing.kernel measures the runs.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from ondevice.core.errors import ProbeError
from ondevice.gguf.spec import ModelSpec
from ondevice.probing.result import SMALL_TERMS

__all__ = ["FitPoint", "fit_points", "fit_prefill"]


@dataclass(frozen=True)
class FitPoint:
    """One measured run, as the fit sees it."""

    role: str  # "sized", "narrow", "tiny" or "attn" (ProbeRun.role)
    weight_type: str  # main weight type ("F16", "Q8_0", "Q4_0")
    step_bytes: int  # weight + KV bytes one step reads
    n_layer: int  # blocks
    n_vocab: int  # vocabulary entries
    attn_scores: int  # attention scores one step computes (roofline.attention_scores)
    head_dims: int  # key + value head dimensions (roofline.attention_head_dims)
    step_s: float  # measured median step, seconds
    rows: int = 0  # matrix rows one step computes (ModelSpec.decode_rows_by_type, summed)


def fit_points(points: list[FitPoint], types: tuple[str, ...]) -> dict:
    """Fit the step-time model so that each term is set by the runs that carry its signal:

    bandwidth of a type: the sized runs of that type (least squares, relative residuals);
    type_cached_gbs: each cached run's bytes over what the other terms leave of its step (apart,
    after the solve); row_s: the narrow runs (their many short rows against the sized runs' long ones; pinned at 0
    without one); t0, layer_s, vocab_s: the tiny runs (least squares; their weights sit in the
    caches and count as 0 bytes); the seconds per attention score at each attention model's head dims
    (attn_score_s): that model's long run against its short run (same weights; the extra KV bytes
    at the F16 bandwidth). Every run's attention scores are priced by the table as the roofline
    prices them (roofline.score_weights), so the conditions are one linear system. A small term
    that comes out negative (noise) is pinned at zero and the rest solved again; if a bandwidth
    still comes out non-positive (fixed costs above a sized run), all small terms are pinned.
    Raises ProbeError when a step is not positive, a type has no sized run, or no bandwidth can be
    positive.
    """
    from ondevice.roofline import score_weights

    if any(not p.step_s > 0 for p in points):
        raise ProbeError("kernel probe: a decode step time was not positive")
    cached = [p for p in points if p.role == "cached"]
    points = [p for p in points if p.role != "cached"]
    missing = sorted(set(types) - {p.weight_type for p in points if p.role == "sized"})
    if missing:
        raise ProbeError(f"kernel probe: no measurement for {missing}")
    cols = len(types)
    dims = sorted({p.head_dims for p in points if p.role == "attn"})
    table = [(d, 0.0) for d in dims]
    m = np.array(
        [
            [p.step_bytes if p.weight_type == t else 0.0 for t in types]
            + [1.0, p.n_layer, p.n_vocab, p.rows]
            + [p.attn_scores * w for w in score_weights(table, p.head_dims)]
            for p in points
        ],
        dtype=np.float64,
    )
    y = np.array([p.step_s for p in points])
    w2 = 1.0 / y**2
    scale = np.abs(m).max(axis=0)  # solve for x * scale: columns of bytes and counts differ by 1e8
    scale[scale == 0] = 1.0
    rows, rhs = _conditions(points, types, dims, m / scale, y, w2)
    n_small = len(_FIXED_TERMS) + len(dims)
    no_rows = set() if any(p.role == "narrow" for p in points) else {_FIXED_TERMS.index("row_s")}
    x = _solve(rows, rhs, scale, cols, n_small, no_rows)
    if (x[:cols] <= 0).any():  # fixed costs above a sized run (a busy moment): bandwidths from the sized runs alone
        x = _solve(rows, rhs, scale, cols, n_small, set(range(n_small)))
    if (x[:cols] <= 0).any():
        raise ProbeError(
            "kernel probe: decode was no slower than the fixed costs for some type; run it again on a quieter machine"
        )
    resid, n_resid = _residuals(points, m @ x, y)
    out = {"type_gbs": {t: float(1.0 / x[i] / 1e9) for i, t in enumerate(types)}}
    out.update({name: float(x[cols + i]) for i, name in enumerate(_FIXED_TERMS)})
    out["attn_score_s"] = tuple((d, float(x[cols + len(_FIXED_TERMS) + i])) for i, d in enumerate(dims))
    out["rms_rel_error"] = float(np.sqrt(resid / n_resid))
    out["type_cached_gbs"] = _cached_rates(cached, out)
    return out


def _residuals(points: list[FitPoint], predicted: np.ndarray, measured: np.ndarray) -> tuple[float, int]:
    """(sum of squared relative residuals, their count) over what the fit claims: every run's step but the
    attention models', and each attention model's long step minus its short one (relative to the long
    step). An attention model's own level is not fitted (its weights partly sit in the caches, which the
    fit does not model), only what its context adds."""
    rel = [(predicted[j] - measured[j]) / measured[j] for j, p in enumerate(points) if p.role != "attn"]
    for width in sorted({p.head_dims for p in points if p.role == "attn"}):
        runs = [j for j, p in enumerate(points) if p.role == "attn" and p.head_dims == width]
        if len(runs) >= 2:
            short, long = min(runs, key=lambda j: points[j].attn_scores), max(runs, key=lambda j: points[j].attn_scores)
            rel.append(((predicted[long] - predicted[short]) - (measured[long] - measured[short])) / measured[long])
    return float(sum(r * r for r in rel)), max(1, len(rel))


def _cached_rates(points: list[FitPoint], fit: dict) -> dict[str, float]:
    """Weight type -> GB/s of its kernel on the cached models (weights the caches hold): their bytes over
    the step time the fit's other terms leave (none for a run those terms already fill: a busy moment)."""
    from ondevice.roofline import score_s

    out = {}
    for p in points:
        other = (
            fit["t0_s"]
            + p.n_layer * fit["layer_s"]
            + p.n_vocab * fit["vocab_s"]
            + p.rows * fit["row_s"]
            + p.attn_scores * score_s(fit["attn_score_s"], p.head_dims)
        )
        if p.step_s > other:
            out[p.weight_type] = p.step_bytes / (p.step_s - other) / 1e9
    return out


_FIXED_TERMS = ("t0_s", "layer_s", "vocab_s", "row_s")  # the fit's small terms before the attention table's


def _solve(
    rows: np.ndarray, rhs: np.ndarray, scale: np.ndarray, cols: int, n_small: int, zeroed: set[int]
) -> np.ndarray:
    """Solve the conditions with the small terms in `zeroed` pinned at 0; a small term that comes
    out negative is pinned too, one at a time (an active set)."""
    zeroed = set(zeroed)
    while True:
        keep = [i for i in range(cols + n_small) if i - cols not in zeroed]
        x = np.zeros(cols + n_small)
        x[keep] = np.linalg.lstsq(rows[np.ix_(keep, keep)], rhs[keep], rcond=None)[0] / scale[keep]
        worst = min(range(n_small), key=lambda k: x[cols + k])
        if x[cols + worst] >= 0:
            return x
        zeroed.add(worst)


def _conditions(points, types, dims, m, y, w2) -> tuple[np.ndarray, np.ndarray]:
    """One linear condition per unknown (row i sets unknown i): sum_j c_j * (y_j - m_j . x) = 0."""
    fixed = len(types) + len(_FIXED_TERMS)
    n = fixed + len(dims)
    rows, rhs = np.zeros((n, n)), np.zeros(n)
    sized = np.array([p.role == "sized" for p in points])
    tiny = np.array([p.role == "tiny" for p in points])
    for i, t in enumerate(types):  # least squares in inv_bw over the sized runs of type t
        c = w2 * m[:, i] * (sized & np.array([p.weight_type == t for p in points]))
        rows[i], rhs[i] = c @ m, c @ y
    narrow = np.array([p.role == "narrow" for p in points])
    for k in range(len(types), fixed):  # least squares in t0, layer_s, vocab_s over the tiny runs; row_s, the narrow
        c = w2 * m[:, k] * (narrow if _FIXED_TERMS[k - len(types)] == "row_s" else tiny)
        rows[k], rhs[k] = c @ m, c @ y
    for row, width in enumerate(dims, start=fixed):  # each attention model: its long run minus its short one
        runs = [j for j, p in enumerate(points) if p.role == "attn" and p.head_dims == width]
        if len(runs) >= 2:
            short, long = min(runs, key=lambda j: points[j].attn_scores), max(runs, key=lambda j: points[j].attn_scores)
            rows[row], rhs[row] = m[long] - m[short], y[long] - y[short]
    return rows, rhs


def fit_prefill(
    observations: list[tuple[ModelSpec, str, int, float, str]],
    decode_fit: dict,
    *,
    backend: str = "CPU",
    n_batch: int = 512,
    row_width: float = 0.0,
) -> dict:
    """Batched rates from measured prefills: observations are (spec, main weight type, prompt
    tokens, prefill s, kind: "sized", "narrow" or "attn"). The roofline's prefill time
    (roofline.Predictor.prefill_s, with the decode fit's terms and the measured step ratios,
    decode_fit["step_ratios"]) is linear in the inverse rates, 1 / GFLOP/s of each weight type's
    matrix products and of attention, and in the batched cost per matrix row and token
    (batch_row_s, for rows beyond what rows of row_width weights would hold: the narrow model's short
    rows against the sized ones' long rows of the same type; 0 without a narrow run): one least-squares solve over every run (relative residuals) gives them
    all. A rate that comes out non-positive (a busy moment; a GPU hiding the work) is left out (None
    / missing), a row cost that does is 0."""
    from ondevice.roofline import Calibration, Predictor

    base = Calibration(
        backend=backend,
        ceiling_gbs=max(decode_fit["type_gbs"].values()),
        type_gbs=dict(decode_fit["type_gbs"]),
        kv_gbs=decode_fit["type_gbs"].get("F16"),
        step_ratios={t: tuple(sorted(r.items())) for t, r in (decode_fit.get("step_ratios") or {}).items()},
        batch_row_width=row_width,
        **{name: decode_fit[name] for name in SMALL_TERMS},
    )
    types = sorted({wt for _s, wt, _n, _t, kind in observations if kind != "attn"})
    kinds = {o[4] for o in observations}
    unknowns = types + (["attn"] if "attn" in kinds else []) + (["rows"] if "narrow" in kinds else [])
    if not types:
        return {"type_gflops": {}, "attn_gflops": None, "batch_row_s": 0.0}

    def prefill_s(spec: ModelSpec, n: int, slow: str | None) -> float:  # every rate 1e30 GFLOP/s but `slow`'s, 1
        rates = {t: (1.0 if t == slow else 1e30) for t in types}  # (rows: 1 ns per row and token, else 0)
        cal = replace(
            base,
            type_gflops=rates,
            attn_gflops=1.0 if slow == "attn" else 1e30,
            batch_row_s=_NS if slow == "rows" else 0.0,
        )
        return Predictor(spec, cal).prefill_s(n, n_batch=n_batch)

    rows, rhs = [], []
    for spec, _wt, n, measured, _kind in observations:
        floor_s = prefill_s(spec, n, None)
        rows.append(
            [(prefill_s(spec, n, u) - floor_s) / measured for u in unknowns]
        )  # seconds at 1 GFLOP/s (1 ns a row)
        rhs.append((measured - floor_s) / measured)
    solved = dict(zip(unknowns, np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)[0]))
    if solved.get("rows", 0.0) < 0:  # narrow rows no slower per row than wide ones (noise): no row cost
        keep = [i for i, u in enumerate(unknowns) if u != "rows"]
        solved = dict(
            zip([unknowns[i] for i in keep], np.linalg.lstsq(np.array(rows)[:, keep], np.array(rhs), rcond=None)[0])
        )
    rates = {u: float(1.0 / x) for u, x in solved.items() if u != "rows" and x > 0}
    return {
        "type_gflops": {t: rates[t] for t in types if t in rates},
        "attn_gflops": rates.get("attn"),
        "batch_row_s": max(0.0, float(solved.get("rows", 0.0))) * _NS,
    }


_NS = 1e-9  # fit_prefill solves for the batched row cost in nanoseconds (columns of like size)
