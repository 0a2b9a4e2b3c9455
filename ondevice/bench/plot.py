"""Pictures of a bench or a prediction, drawn with matplotlib (the optional extra `ondevice[plot]`).

The roofline: decode tok/s against bytes read per token, both axes logarithmic. The ceiling is the line
tok/s = bandwidth / bytes (the probe's measured bandwidth, or the one the prediction used); each model,
context and quant level is a point: hollow where predicted, filled where measured, joined by a thin line.
A bench adds the ITL distribution of every request cell (a box per model, scenario and workload); a batch sweep
(`bench --batch`) is its own picture: aggregate and per-sequence decode tok/s against the batch size B, measured
beside predicted, with the bandwidth ceiling and the knee.
Files are written whole or not at all (a temporary file, then renamed); the format follows the suffix.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ondevice.core.errors import MissingExtraError
from ondevice.core.paths import atomic_write

__all__ = [
    "PLOT_EXTRA",
    "PLOT_FORMATS",
    "RooflinePoint",
    "Roofline",
    "require_matplotlib",
    "check_plot_path",
    "roofline_from_prediction",
    "roofline_from_bench",
    "itl_series",
    "BatchPoint",
    "BatchCurve",
    "batch_curve_from_sweep",
    "write_plot",
]

PLOT_EXTRA = "ondevice[plot]"
PLOT_FORMATS = ("svg", "png", "pdf")


@dataclass(frozen=True)
class RooflinePoint:
    label: str  # model, quant and context
    bytes_per_token: float  # weight + KV bytes one decode step reads, bytes
    predicted_tok_s: float | None  # the prediction (None: none for this point)
    measured_tok_s: float | None = None  # the bench's decode tok/s p50 (None: a prediction only)


@dataclass(frozen=True)
class Roofline:
    bandwidth_gbs: float  # the ceiling's bandwidth, GB/s
    bandwidth_label: str  # where it comes from ("measured", "given", ...)
    points: tuple[RooflinePoint, ...]


def require_matplotlib() -> Any:
    """matplotlib's pyplot on the file-only Agg backend; MissingExtraError naming the extra when it is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise MissingExtraError(f"--plot needs matplotlib: pip install '{PLOT_EXTRA}'") from None
    return plt


def check_plot_path(path: str | Path) -> str:
    """The format of a plot file from its suffix; MissingExtraError without matplotlib (both before any work)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in PLOT_FORMATS:
        from ondevice.core.errors import InvalidParameterError

        raise InvalidParameterError(f"--plot {path}: name a .svg, .png or .pdf file")
    require_matplotlib()
    return fmt


def roofline_from_prediction(pred: Any) -> Roofline:
    """The points of `ondevice predict`: one per context, at its weight + KV bytes, predicted (or estimated)."""
    name = Path(str(pred.model)).name
    points = []
    for i, c in enumerate(pred.contexts):
        tok_s = c.predicted_tok_s
        if tok_s is None and i < len(pred.estimates):
            tok_s = pred.estimates[i].tok_s
        label = f"{name} {pred.quant or ''}, ctx {c.n_ctx}".replace("  ", " ")
        points.append(RooflinePoint(label, float(c.weight_bytes + c.kv_bytes), tok_s))
    return Roofline(float(pred.bandwidth_gbs), str(pred.bandwidth_source), tuple(points))


def roofline_from_bench(results: Sequence[Any], plans: Sequence[Any]) -> Roofline | None:
    """The bench's points: each resident cell (prefix_hit where a model has none) at its mid-decode context
    P + N/2, measured decode tok/s p50 beside the prediction; None without a predictor to give the bytes."""
    by_label = {p.label: p for p in plans}
    cells = [r for r in results if r.scenario == "resident"]
    have = {r.model for r in cells}
    cells += [r for r in results if r.scenario == "prefix_hit" and r.model not in have]
    points, bandwidth = [], None
    for r in cells:
        predictor = getattr(by_label.get(r.model), "predictor", None)
        if predictor is None or r.output_tokens < 2 or not hasattr(predictor, "step_bytes"):
            continue
        n_ctx = r.prompt_tokens + r.output_tokens // 2
        bandwidth = bandwidth or float(predictor.ceiling_gbs)
        spec = getattr(by_label[r.model], "spec", None)
        quant = getattr(spec, "quant", None) or ""
        measured = r.summary("decode_tok_s").p50
        points.append(
            RooflinePoint(
                f"{r.model} {quant}, ctx {n_ctx}".replace("  ", " "),
                float(predictor.step_bytes(n_ctx)),
                r.predicted_tok_s,
                measured if measured and math.isfinite(measured) else None,
            )
        )
    return Roofline(bandwidth, "measured", tuple(points)) if points and bandwidth else None


def itl_series(results: Sequence[Any]) -> dict[str, list[float]]:
    """Per request cell with inter-token latencies, its ITLs in milliseconds (pooled over the ok runs)."""
    out: dict[str, list[float]] = {}
    for r in results:
        itl = [x * 1e3 for run in r.runs if run.ok and run.timings for x in run.timings.itl_s]
        if itl:
            out[f"{r.model}\n{r.scenario} {r.workload}"] = itl
    return out


@dataclass(frozen=True)
class BatchPoint:
    n_seqs: int  # B
    decode_tok_s: float | None  # measured aggregate decode tok/s (all sequences)
    seq_decode_tok_s: float | None  # measured per-sequence decode tok/s (1 / TPOT)
    predicted_decode_tok_s: float | None  # the prediction of the aggregate
    ceiling_decode_tok_s: float | None  # B / the bandwidth-bound step time


@dataclass(frozen=True)
class BatchCurve:
    label: str  # model and workload
    points: tuple[BatchPoint, ...]  # ascending B
    knee: int | None  # the last B that still scales


def batch_curve_from_sweep(result: Any, label: str) -> BatchCurve:
    """A batch sweep's levels (ondevice.bench.batch.SweepResult) as the curve to draw."""
    points = tuple(
        BatchPoint(lv.n_seqs, lv.decode_tok_s, lv.seq_decode_tok_s, lv.predicted_decode_tok_s, lv.ceiling_decode_tok_s)
        for lv in result.levels
    )
    return BatchCurve(label, points, result.knee)


def write_plot(
    path: str | Path,
    roofline: Roofline | None,
    itls: Mapping[str, list[float]] | None = None,
    batch: BatchCurve | None = None,
) -> Path:
    """Draw the roofline, the ITL boxes and the batch sweep curve (those given) side by side to `path`,
    atomically."""
    plt = require_matplotlib()
    fmt = check_plot_path(path)
    has_batch = batch is not None and any(p.decode_tok_s or p.predicted_decode_tok_s for p in batch.points)
    panels = [p for p in (roofline is not None and roofline.points, bool(itls), has_batch) if p]
    if not panels:
        from ondevice.core.errors import InvalidParameterError

        raise InvalidParameterError("--plot: nothing to draw (no decode measured or predicted)")
    plt.rcParams["svg.hashsalt"] = "ondevice"  # the same figure gives the same file
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: smaller, searchable, selectable
    fig, axes = plt.subplots(1, len(panels), figsize=(6.5 * len(panels), 4.8), squeeze=False)
    column = 0
    if roofline is not None and roofline.points:
        _draw_roofline(axes[0][column], roofline)
        column += 1
    if itls:
        _draw_itls(axes[0][column], itls)
        column += 1
    if batch is not None and has_batch:
        _draw_batch(axes[0][column], batch)
    fig.tight_layout()
    metadata = {"Date": None} if fmt == "svg" else {}
    with atomic_write(Path(path)) as out:
        fig.savefig(out, format=fmt, metadata=metadata)
    plt.close(fig)
    return Path(path)


def _draw_roofline(ax: Any, roofline: Roofline) -> None:
    xs = [p.bytes_per_token for p in roofline.points]
    lo, hi = min(xs) / 2, max(xs) * 2
    grid = [lo * (hi / lo) ** (i / 63) for i in range(64)]
    bps = roofline.bandwidth_gbs * 1e9
    ax.plot(
        [x / 1e6 for x in grid],
        [bps / x for x in grid],
        color="black",
        linewidth=1.2,
        label=f"ceiling: {roofline.bandwidth_gbs:.1f} GB/s ({roofline.bandwidth_label}) / bytes",
    )
    colors = _colors(len(roofline.points))
    for point, color in zip(roofline.points, colors):
        x = point.bytes_per_token / 1e6
        if point.predicted_tok_s:
            ax.plot([x], [point.predicted_tok_s], "o", mfc="none", mec=color, markersize=8)
        if point.measured_tok_s:
            ax.plot([x], [point.measured_tok_s], "o", color=color, markersize=6, label=point.label)
        if point.predicted_tok_s and point.measured_tok_s:
            ax.plot([x, x], [point.predicted_tok_s, point.measured_tok_s], color=color, linewidth=0.8)
        if not point.measured_tok_s:
            ax.plot([], [], "o", mfc="none", mec=color, label=point.label)
    ax.plot([], [], "o", mfc="none", mec="grey", label="hollow: predicted, filled: measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("bytes read per token (MB)")
    ax.set_ylabel("decode tok/s")
    ax.set_title("roofline: decode speed against bytes per token")
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=7, loc="lower left")


def _draw_itls(ax: Any, itls: Mapping[str, list[float]]) -> None:
    labels = list(itls)
    ax.boxplot([itls[k] for k in labels], orientation="horizontal", showfliers=True, flierprops={"markersize": 2})
    ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=7)
    ax.set_xlabel("inter-token latency (ms)")
    ax.set_title("ITL distribution per scenario")
    ax.grid(True, axis="x", linewidth=0.3)


def _draw_batch(ax: Any, curve: BatchCurve) -> None:
    def series(attr: str) -> tuple[list[int], list[float]]:
        pts = [(p.n_seqs, getattr(p, attr)) for p in curve.points if getattr(p, attr)]
        return [b for b, _v in pts], [v for _b, v in pts]

    lines = (
        ("ceiling_decode_tok_s", {"color": "black", "linewidth": 1.2}, "ceiling: B / bandwidth-bound step"),
        ("predicted_decode_tok_s", {"color": "C0", "linestyle": "--", "marker": "o", "mfc": "none"}, "predicted"),
        ("decode_tok_s", {"color": "C0", "marker": "o"}, "measured: all sequences"),
        ("seq_decode_tok_s", {"color": "C1", "marker": "s", "markersize": 4}, "measured: per sequence"),
    )
    for attr, style, label in lines:
        xs, ys = series(attr)
        if xs:
            ax.plot(xs, ys, label=label, **style)
    if curve.knee is not None:
        ax.axvline(curve.knee, color="grey", linewidth=0.8, linestyle=":", label=f"knee: B = {curve.knee}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks([p.n_seqs for p in curve.points], [str(p.n_seqs) for p in curve.points])
    ax.set_xlabel("sequences per decode step (B)")
    ax.set_ylabel("decode tok/s")
    ax.set_title(f"batch sweep: {curve.label}", fontsize=9)
    ax.grid(True, which="both", linewidth=0.3)
    ax.legend(fontsize=7, loc="best")


def _colors(n: int) -> list[Any]:
    """n colours from matplotlib's default cycle, repeated when there are more points."""
    plt = require_matplotlib()
    cycle = plt.rcParams["axes.prop_cycle"].by_key().get("color") or ["C0"]
    return [cycle[i % len(cycle)] for i in range(n)]
