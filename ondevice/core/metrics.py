"""Pure timing arithmetic: timestamps -> Timings, samples -> percentile summaries."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from ondevice.core.results import Timings

__all__ = ["timings_from_marks", "Summary", "summarize", "percentile"]

_NS = 1e-9


def timings_from_marks(
    start_ns: int,
    tokenized_ns: int,
    prefill_start_ns: int,
    prefill_end_ns: int,
    token_ns: Sequence[int],
    prompt_tokens_computed: int,
) -> Timings:
    """Build Timings from perf_counter_ns() marks.

    start_ns: request start (text received); tokenized_ns: token ids ready;
    prefill_start_ns / prefill_end_ns: around the prompt's forward passes;
    token_ns: the moment each output token was available (sampled), in order.
    With no output token (cancelled before the first), ttft and e2e end at the last mark.
    """
    if token_ns:
        ttft_ns, last_ns = token_ns[0], token_ns[-1]
    else:
        ttft_ns = last_ns = max(prefill_end_ns, tokenized_ns)
    itl = tuple((b - a) * _NS for a, b in zip(token_ns, token_ns[1:]))
    return Timings(
        tokenize_s=(tokenized_ns - start_ns) * _NS,
        prefill_s=(prefill_end_ns - prefill_start_ns) * _NS,
        ttft_s=(ttft_ns - start_ns) * _NS,
        itl_s=itl,
        e2e_s=(last_ns - start_ns) * _NS,
        prompt_tokens_computed=prompt_tokens_computed,
        output_tokens=len(token_ns),
    )


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Linear-interpolation percentile (numpy's default), q in [0, 100]."""
    if not sorted_values:
        return math.nan
    pos = (len(sorted_values) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


@dataclass(frozen=True)
class Summary:
    n: int  # samples
    p50: float
    p95: float
    p99: float
    mean: float
    std: float  # sample standard deviation (n-1); 0 for n < 2
    min: float
    max: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def summarize(values: Sequence[float | None]) -> Summary:
    """Percentiles and moments of the non-None samples (NaN fields when there are none)."""
    xs = sorted(v for v in values if v is not None and not math.isnan(v))
    n = len(xs)
    if not n:
        nan = math.nan
        return Summary(0, nan, nan, nan, nan, nan, nan, nan)
    mean = math.fsum(xs) / n
    var = math.fsum((x - mean) ** 2 for x in xs) / (n - 1) if n > 1 else 0.0
    return Summary(n, percentile(xs, 50), percentile(xs, 95), percentile(xs, 99), mean, math.sqrt(var), xs[0], xs[-1])
