"""A model's shape timed on this machine, and the prediction made from it (pure arithmetic).

Kernel speed does not depend on the weights' values, so the model's twin (same architecture,
tensors and types, random data; for a model you have, its own file) decodes and prefills as fast
as the model. ondevice.probing.timing times it on the engine's own backend, threads and settings:

- decode: the step time at two contexts (a short one and one after a long prompt);
- prefill: one chunk of k tokens from an empty cache for a few k up to the chunk size, then a chain of
  chunks as long on top of it (what attention over a longer context adds, chunk by chunk);
- batch: one decode step of B sequences at once (every token's logits kept), for a few B.

The prediction reads those figures and moves them to other contexts and chunk sizes by attention
arithmetic only (attention.py): a decode step at context s = a + b x (the KV cells it works through over
the layers: the cached tokens, or llama.cpp's padded view where the engine's kernel costs that), fitted through the
decode points; a prefill chunk of k tokens after pos cached ones =
M(k) + k / K x A(pos): M interpolated linearly in k between the chunks timed from an empty cache, A
the attention cells a full chunk of K tokens adds at that position (windows capped) times what the
chain's chunks took per added cell beyond the same chunk from an empty cache (a line through the
origin over all of them). A twin of fewer layers than the model is extrapolated linearly in layers
(extrapolate_layers), point by point.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from typing import Any

from ondevice.gguf.spec import ModelSpec
from ondevice.roofline.attention import added_chunk_cells, decode_spans
from ondevice.roofline.model import Calibration, Predictor

__all__ = ["ShapeTiming", "TimedPredictor", "extrapolate_layers", "robust_line", "MAX_POINTS"]

MAX_POINTS = 64  # points of one kind a stored timing may hold (a damaged file is refused, not read without end)


@dataclass(frozen=True)
class ShapeTiming:
    """What timing one model's shape on this machine measured. Seconds are wall-clock, as the engine times them."""

    decode: tuple[tuple[int, float], ...]  # (context tokens, seconds of one decode step: llama_decode, sample, text)
    prefill: tuple[tuple[int, int, float], ...]  # (cached tokens before it, chunk tokens k, seconds of one llama_decode
    # of the k tokens and the first sample): k from an empty cache for a few k, and chunks after cached tokens
    batch: tuple[tuple[int, float], ...] = ()  # (B sequences, seconds of one decode step of all B), at batch_ctx
    batch_ctx: int = 0  # context of each sequence in the batch steps, tokens
    n_ubatch: int = 512  # tokens per compute pass inside one llama_decode when timed (longer prompts: several)
    kv_pad: int = 1  # a decode step's attention costs the KV view padded to this many cells (attention.decode_spans)
    kv_pad_from: int = 0  # ... once the padded view holds this many (attention.decode_kv_padding of the timed engine)
    source: str = "model"  # "model" (its own file), "twin" (a twin of all its layers), "twins" (extrapolated in layers)
    plan: str = "full"  # the timing plan: "full", or "quick" (a first run: fewer chunk sizes, one round, no batch)
    layers: tuple[int, ...] = ()  # layer counts of the twins timed (() for all layers)
    spread: float = 0.0  # how far repeated timings of one point differed: median of (slowest / fastest - 1)
    other_cpu_cores: float = 0.0  # CPU other processes used while it was timed, in cores
    elapsed_s: float = 0.0  # wall time of the timing, seconds
    created_unix_s: float = 0.0  # when it was timed

    def __post_init__(self) -> None:
        _check_points("decode", self.decode, 2)
        _check_points("prefill", self.prefill, 3)
        _check_points("batch", self.batch, 2)
        if not self.decode or not any(pos == 0 for pos, _k, _t in self.prefill):
            raise ValueError("a timing needs decode steps and a prefill from an empty cache")
        for name in ("batch_ctx", "n_ubatch", "kv_pad", "kv_pad_from"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a non-negative integer")
        for name in ("spread", "other_cpu_cores", "elapsed_s", "created_unix_s"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite non-negative number, not {value!r}")

    def decode_cells(self, spec: ModelSpec, n_ctx: int) -> float:
        """The KV cells a decode step at n_ctx works through, summed over spec's layers, on the engine this timing
        was taken on (its padded view where that engine pays it: attention.decode_spans)."""
        return decode_spans(spec, n_ctx, self.kv_pad, self.kv_pad_from)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ShapeTiming:
        """Inverse of to_dict; ValueError/TypeError/KeyError on anything malformed (checked in __post_init__)."""
        return cls(
            decode=tuple((int(s), float(t)) for s, t in d["decode"]),
            prefill=tuple((int(p), int(k), float(t)) for p, k, t in d["prefill"]),
            batch=tuple((int(b), float(t)) for b, t in d.get("batch", ())),
            batch_ctx=int(d.get("batch_ctx", 0)),
            n_ubatch=int(d.get("n_ubatch", 512)),
            kv_pad=int(d.get("kv_pad", 1)),
            kv_pad_from=int(d.get("kv_pad_from", 0)),
            source=str(d.get("source", "model")),
            plan=str(d.get("plan", "full")),
            layers=tuple(int(n) for n in d.get("layers", ())),
            spread=float(d.get("spread", 0.0)),
            other_cpu_cores=float(d.get("other_cpu_cores", 0.0)),
            elapsed_s=float(d.get("elapsed_s", 0.0)),
            created_unix_s=float(d.get("created_unix_s", 0.0)),
        )


def _check_points(name: str, points: Sequence[tuple], width: int) -> None:
    if len(points) > MAX_POINTS:
        raise ValueError(f"{name}: {len(points)} points (at most {MAX_POINTS})")
    for p in points:
        if len(p) != width or any(not isinstance(v, int) or v < 0 for v in p[:-1]):
            raise ValueError(f"{name}: malformed point {p!r}")
        if not isinstance(p[-1], (int, float)) or not math.isfinite(p[-1]) or p[-1] <= 0:
            raise ValueError(f"{name}: a time must be a finite positive number of seconds, not {p[-1]!r}")


def extrapolate_layers(
    few: ShapeTiming,
    many: ShapeTiming,
    n_few: int,
    n_many: int,
    n_layer: int,
    few_cells: Callable[[int], float] | None = None,
) -> ShapeTiming:
    """The timing of a model of n_layer blocks from twins of n_few and n_many blocks. A point both twins timed is
    linear in the blocks (exact for identical blocks; the twins' blocks match the model's mix of weight types
    and window pattern). A point only the fewer timed (the chain's chunks after cached tokens, decode at a long
    context) plus n_layer / n_few times what it adds there: attention, which is the same in every block. With
    few_cells (the KV cells the fewer twin's layers work through at a context, ShapeTiming.decode_cells of its spec),
    what a decode point adds is the fewer twin's attention per cell (_attention_per_cell) times the cells it adds,
    not the point's own few steps: the multiplication by n_layer / n_few would multiply their noise."""
    if not 0 < n_few < n_many:
        raise ValueError("twins of two different block counts are needed, the fewer first")
    f = (n_layer - n_few) / (n_many - n_few)

    def line(a: float, b: float) -> float:
        return max(a + f * (b - a), 1e-9)  # a noisy pair must not give a negative time

    def merged(xs: Sequence[tuple], ys: Sequence[tuple], base, what: str) -> tuple:
        shared = {y[:-1]: y[-1] for y in ys}
        if not set(shared) <= {x[:-1] for x in xs}:
            raise ValueError(f"the twins were timed on different {what} points")
        lines = {x[:-1]: line(x[-1], shared[x[:-1]]) for x in xs if x[:-1] in shared}
        out = []
        for x in xs:
            if x[:-1] in lines:
                out.append((*x[:-1], lines[x[:-1]]))
                continue
            b = base(x)
            if b not in lines:
                raise ValueError(f"the twins share no base point for the {what} point {x[:-1]}")
            few_base = next(y[-1] for y in xs if y[:-1] == b)
            out.append((*x[:-1], max(lines[b] + n_layer / n_few * (x[-1] - few_base), 1e-9)))
        return tuple(out)

    shortest = (min(s for s, _t in many.decode),) if many.decode else ()
    decode = merged(few.decode, many.decode, lambda x: shortest, "decode")
    if few_cells is not None and shortest:
        per_cell = _attention_per_cell(few.decode, few_cells, base_ctx=shortest[0])
        at_base = dict(decode)[shortest[0]]
        shared = {ctx for ctx, _t in many.decode}
        scale = n_layer / n_few * per_cell
        decode = tuple(
            (ctx, t if ctx in shared else at_base + scale * (few_cells(ctx) - few_cells(shortest[0])))
            for ctx, t in decode
        )
    return replace(
        many,
        decode=decode,
        prefill=merged(few.prefill, many.prefill, lambda x: (0, x[1]), "prefill"),
        batch=merged(few.batch, many.batch, lambda x: x[:-1], "batch") if few.batch and many.batch else (),
        source="twins",
        layers=(n_few, n_many),
        spread=max(few.spread, many.spread),
        other_cpu_cores=max(few.other_cpu_cores, many.other_cpu_cores),
        elapsed_s=few.elapsed_s + many.elapsed_s,
    )


def _attention_per_cell(
    points: Sequence[tuple[int, float]], cells: Callable[[int], float], base_ctx: int | None = None
) -> float:
    """What one more attended cell adds to a decode step: from the point at base_ctx (the short context a twin's
    long-context decode was measured against in alternating bursts: the longest point is that point plus the
    bursts' difference, so this is the difference of the same moments) or, without one, from the short-context
    points (a quarter of the longest context or less: their median), to the longest-context point; never
    negative. (Decode steps right after a prefill run slower than steady ones: a median of those would lower it.)"""
    longest_ctx, longest_s = max(points)
    at_base = [(cells(ctx), t) for ctx, t in points if ctx == base_ctx and ctx < longest_ctx]
    short = at_base or [(cells(ctx), t) for ctx, t in points if ctx <= longest_ctx / 4]
    if not short:
        return robust_line([(cells(ctx), t) for ctx, t in points])[1]
    x0, y0 = statistics.median(x for x, _t in short), statistics.median(t for _x, t in short)
    dx = cells(longest_ctx) - x0
    return max((longest_s - y0) / dx, 0.0) if dx > 0 else 0.0


class TimedPredictor(Predictor):
    """The prediction from a model's timed shape (ShapeTiming); the ceiling stays the bound of the base class."""

    def __init__(self, spec: ModelSpec, calibration: Calibration, timing: ShapeTiming):
        super().__init__(spec, calibration)
        self.timing = timing
        self._decode_cells = partial(timing.decode_cells, spec)
        self._decode_line = robust_line([(self._decode_cells(s), t) for s, t in timing.decode])
        empty = sorted((k, t) for pos, k, t in timing.prefill if pos == 0)
        self._chunk_k, self._chunk_m = [float(k) for k, _t in empty], [t for _k, t in empty]
        self._chain_k, chain = _chain(timing.prefill, self._chunk_k, self._chunk_m)
        self._per_added_cell = _per_added_cell(chain, lambda pos: added_chunk_cells(spec, pos, int(self._chain_k)))
        self._ubatch = max(1, timing.n_ubatch)

    @property
    def basis(self) -> str:
        return "measured"

    def predicted_step_s(self, n_ctx: int) -> float:
        a, b = self._decode_line
        return a + b * self._decode_cells(n_ctx)

    def step_s(self, n_ctx: int) -> tuple[float, float]:
        return self.ceiling_step_s(n_ctx), self.predicted_step_s(n_ctx)

    def chunk_s(self, pos: int, n_tokens: int) -> float:
        """One compute pass of n_tokens after pos cached tokens, up to the first token's logits and sample."""
        k = max(1, int(n_tokens))
        return _interp(self._chunk_k, self._chunk_m, k) + k / self._chain_k * self._attention_s(max(0, int(pos)))

    def _attention_s(self, pos: int) -> float:
        """What a chunk of the chain's length takes after pos cached tokens beyond the same chunk from an empty cache:
        the attention cells it adds there (windows capped) times the chain's cost per added cell."""
        return self._per_added_cell * added_chunk_cells(self.spec, pos, int(self._chain_k))

    def prefill_s(self, n_tokens: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Chunks of min(n_batch, the timed n_ubatch) tokens, each as timed (its attention moved to its position)."""
        n, pos, chunk = max(0, int(n_tokens)), max(0, int(n_cached)), min(max(1, int(n_batch)), self._ubatch)
        t = 0.0
        while n > 0:
            k = min(chunk, n)
            t += self.chunk_s(pos, k)
            pos, n = pos + k, n - k
        return t

    def tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float:
        """One llama_decode of n_tokens in each of n_seqs sequences at a context of n_ctx, logits for every
        token: the timed batch step of as many tokens, its attention moved to n_ctx (each sequence its own; a step of
        several tokens works through the cells in use, not a padded view: decode_kv_padding)."""
        n, b, s = max(1, int(n_tokens)), max(1, int(n_seqs)), max(0, int(n_ctx))
        columns = n * b
        if columns == 1:
            return self.predicted_step_s(s)
        s0 = self.timing.batch_ctx
        _a, per_span = self._decode_line
        spans = b * sum(decode_spans(self.spec, s + i) for i in range(n))
        return self._columns_s(columns) + per_span * (spans - columns * decode_spans(self.spec, s0))

    def _columns_s(self, columns: int) -> float:
        """One step of `columns` tokens with logits, each attending the batch context: the timed batch steps,
        linear between them (beyond the largest, its cost per token). Without any: the chunk of as many tokens
        without its attention, every token's decode attention, and every further token's share of the decode
        step's output head (the head runs for each token whose logits are kept)."""
        s0 = self.timing.batch_ctx
        decode_s = self.predicted_step_s(s0)
        if self.timing.batch:
            xs = [1.0] + [float(b) for b, _t in self.timing.batch]
            ys = [decode_s] + [t for _b, t in self.timing.batch]
            return _interp(xs, ys, columns)
        head_share = self.spec.head_bytes / self.spec.decode_weight_bytes if self.spec.decode_weight_bytes else 0.0
        matmul_s = _interp(self._chunk_k, self._chunk_m, columns)
        return (
            matmul_s
            + columns * self._decode_line[1] * decode_spans(self.spec, s0)
            + (columns - 1) * head_share * decode_s
        )


def robust_line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(a, b) of t = a + b x through the points, robustly: b the median of the pairwise slopes, a the median of
    t - b x (Theil-Sen: one point a busy moment slowed moves neither); b >= 0 (attending more tokens never makes a
    step faster)."""
    xs, ys = [x for x, _ in points], [y for _, y in points]
    if len(set(xs)) < 2:
        return statistics.median(ys), 0.0
    slopes = [(y1 - y0) / (x1 - x0) for i, (x0, y0) in enumerate(points) for x1, y1 in points[i + 1 :] if x1 != x0]
    b = max(statistics.median(slopes), 0.0)
    return statistics.median(y - b * x for x, y in points), b


def _chain(points: Sequence[tuple[int, int, float]], ks: list[float], ts: list[float]) -> tuple[float, list]:
    """(K, [(position, seconds beyond the same chunk from an empty cache)]) of the chunks timed after cached
    tokens (the chain: chunks of one length K, the longest timed from an empty cache)."""
    after = sorted((pos, k, t) for pos, k, t in points if pos > 0)
    if not after:
        return (ks[-1] if ks else 1.0), []
    k_chain = max(k for _p, k, _t in after)
    base = _interp(ks, ts, k_chain)
    return float(k_chain), [(float(pos), t - base) for pos, k, t in after if k == k_chain]


def _per_added_cell(chain: Sequence[tuple[float, float]], added_cells: Callable[[int], float]) -> float:
    """Seconds per attention cell a chunk adds after cached tokens: a least-squares line through the origin (a chunk
    after no cached tokens adds nothing) over the chain's links [(position, seconds beyond the chunk from an empty
    cache)]. Every link counts, the longer ones (which add the most cells, the figure least moved by a noisy moment)
    the most; a slope between two links would multiply their noise by the prompt's length over their distance."""
    points = [(added_cells(int(pos)), extra) for pos, extra in chain]
    square = sum(x * x for x, _a in points)
    return max(sum(x * a for x, a in points) / square, 0.0) if square > 0 else 0.0


def _interp(xs: Sequence[float], ys: Sequence[float], x: float) -> float:
    """y at x, linear between the points (xs growing); past the last, the last segment's slope; before the first, the
    first point scaled (a chunk of fewer tokens than any timed costs no more than the smallest)."""
    if len(xs) == 1 or x <= xs[0]:
        return ys[0] if len(xs) == 1 or x >= xs[0] else ys[0] * max(x, 1.0) / xs[0]
    for (x0, y0), (x1, y1) in zip(zip(xs, ys), zip(xs[1:], ys[1:])):
        if x <= x1:
            return y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    (x0, y0), (x1, y1) = (xs[-2], ys[-2]), (xs[-1], ys[-1])
    return y1 + (y1 - y0) / (x1 - x0) * (x - x1)
