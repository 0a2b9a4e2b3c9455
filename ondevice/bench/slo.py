"""Service-level objectives: `--slo ttft_p95=1.0,tpot_p95=0.04`.

A bound is METRIC_STAT=SECONDS with METRIC in ttft, ttft_visible, tpot, itl, e2e (an optional `_s`) and
STAT in p50, p90, p95, p99, mean, max. Per scenario:

- pass/fail: the scenario's STAT of METRIC is within every bound;
- goodput, as the source articles define it: requests meeting every bound per unit of time,
  req/s (good / time_s). A request meets the bounds when its own value does: its ttft/tpot/e2e;
  for itl, STAT of its own ITLs; failed requests are misses. time_s is the time the
  scenario's requests took: for server runs (bench --url, requests overlapping) the window
  from the first send to the last end, as ondevice.bench.serve.load's goodput_rps; for the
  local bench, which runs one request at a time between other scenarios' requests, the sum
  of the requests' own E2E (a request that failed before timing anything adds nothing).
- good_share: good / requests (0..1), beside it.
- ttft_visible: the first visible token of reasoning models (a request without one misses).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ondevice.bench.runs import COLD_START, LOAD, LOAD_SCENARIOS, RunRecord
from ondevice.core.errors import BenchError
from ondevice.core.metrics import summarize

__all__ = ["Bound", "SloResult", "parse_slo", "evaluate"]

METRICS = ("ttft", "ttft_visible", "tpot", "itl", "e2e")
STATS = ("p50", "p90", "p95", "p99", "mean", "max")
_TERM = re.compile(r"^([a-z0-9_]+?)(?:_s)?_(p50|p90|p95|p99|mean|max)$")


@dataclass(frozen=True)
class Bound:
    metric: str  # ttft, tpot, itl or e2e
    stat: str  # p50, p90, p95, p99, mean or max
    limit_s: float  # upper bound, seconds

    @property
    def name(self) -> str:
        return f"{self.metric}_{self.stat}"


@dataclass(frozen=True)
class SloResult:
    bounds: tuple[Bound, ...]  # what was asked
    requests: int  # requests of the scenario, ok or not
    good: int  # requests meeting every bound
    observed_s: dict[str, float | None]  # bound name -> the scenario's figure, seconds
    passed: bool  # every observed figure within its bound (and at least one ok request)
    time_s: float | None = None  # the time the requests took, seconds (module docstring); None: unknown

    @property
    def good_share(self) -> float:
        """Share of requests meeting every bound, 0..1."""
        return self.good / self.requests if self.requests else 0.0

    @property
    def goodput_rps(self) -> float | None:
        """Goodput: requests meeting every bound per second (None when time_s is unknown or 0)."""
        return self.good / self.time_s if self.time_s else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "bounds": {b.name: b.limit_s for b in self.bounds},
            "observed_s": {k: (v if v is not None and math.isfinite(v) else None) for k, v in self.observed_s.items()},
            "requests": self.requests,
            "good": self.good,
            "time_s": self.time_s,
            "goodput_rps": self.goodput_rps,
            "good_share": self.good_share,
            "passed": self.passed,
        }


def parse_slo(text: str) -> tuple[Bound, ...]:
    """'ttft_p95=1.0,tpot_p95=0.04' -> bounds; BenchError naming the bad term."""
    bounds = []
    for term in (t.strip() for t in str(text).split(",")):
        if not term:
            continue
        key, sep, value = term.partition("=")
        m = _TERM.match(key.strip().lower())
        if not sep or not m:
            raise BenchError(
                f"--slo term {term!r}: expected METRIC_STAT=SECONDS with METRIC in {', '.join(METRICS)} "
                f"and STAT in {', '.join(STATS)} (e.g. ttft_p95=1.0)"
            )
        metric, stat = m.groups()
        if metric not in METRICS:
            raise BenchError(f"--slo term {term!r}: unknown metric {metric!r} (known: {', '.join(METRICS)})")
        try:
            limit = float(value)
        except ValueError:
            raise BenchError(f"--slo term {term!r}: {value!r} is not a number of seconds") from None
        if not math.isfinite(limit) or limit <= 0:
            raise BenchError(f"--slo term {term!r}: the bound must be a positive number of seconds")
        bounds.append(Bound(metric, stat, limit))
    if not bounds:
        raise BenchError(f"--slo {text!r}: no bounds given (e.g. ttft_p95=1.0,tpot_p95=0.04)")
    return tuple(bounds)


def _stat(values: Sequence[float | None], stat: str) -> float:
    s = summarize(values)
    return s.mean if stat == "mean" else s.max if stat == "max" else _pct(values, float(stat[1:]))


def _pct(values: Sequence[float | None], q: float) -> float:
    from ondevice.core.metrics import percentile

    return percentile(sorted(v for v in values if v is not None and not math.isnan(v)), q)


def _request_value(r: RunRecord, b: Bound) -> float | None:
    t = r.timings
    if t is None:
        return None
    if b.metric == "itl":
        return _stat(t.itl_s, b.stat) if t.itl_s else None
    return {"ttft": t.ttft_s, "ttft_visible": t.ttft_visible_s, "tpot": t.tpot_s, "e2e": t.e2e_s}[b.metric]


def evaluate(runs: Sequence[RunRecord], bounds: Sequence[Bound]) -> SloResult | None:
    """The SLO check of one scenario's runs (local or server); None for a load scenario (no requests)
    and for the cold start (one token after a load: not a served request)."""
    if not runs or runs[0].scenario in LOAD_SCENARIOS + (LOAD, COLD_START):
        return None
    ok = [r for r in runs if r.ok]
    good = 0
    for r in ok:
        vals = [_request_value(r, b) for b in bounds]
        good += all(v is not None and v <= b.limit_s for v, b in zip(vals, bounds))
    observed: dict[str, float | None] = {}
    for b in bounds:
        if b.metric == "itl":
            pooled = [x for r in ok if r.timings for x in r.timings.itl_s]
            observed[b.name] = _stat(pooled, b.stat)
        else:
            observed[b.name] = _stat([_request_value(r, b) for r in ok], b.stat)
    passed = bool(ok) and all(
        v is not None and math.isfinite(v) and v <= b.limit_s for b, v in zip(bounds, observed.values())
    )
    return SloResult(tuple(bounds), len(runs), good, observed, passed, _time_s(runs))


def _time_s(runs: Sequence[RunRecord]) -> float | None:
    """Server runs: first send -> last end; local runs (one at a time): the sum of their E2E."""
    spans = [
        (r.serve["sent_s"], r.serve["done_s"])
        for r in runs
        if r.serve and r.serve.get("sent_s") is not None and r.serve.get("done_s") is not None
    ]
    if spans:
        return max(d for _, d in spans) - min(s for s, _ in spans)
    busy = [r.timings.e2e_s for r in runs if r.timings is not None]
    return sum(busy) if busy else None
