"""Load: closed loop at concurrency C, open loop with Poisson arrivals at rate λ, and what a
level did: achieved rate, mean requests in flight, Little's law, goodput.

Closed loop: C clients, each sending its next request when the last one ended (a level of
`requests` requests). Open loop: requests sent at Poisson arrival times whatever is still in
flight (the first at once, then exponential gaps of mean 1/λ from a seeded generator), so a
server slower than λ builds a queue, and TTFT shows it. Both stop sending when the level's
time budget is spent (requests not sent are kept as "skipped"); each request ends by its own
timeout, so a level always ends.

Little's law, L = λ·W: L is the time-average of requests in flight over the level's window
(first send to last stream end, so the integral is the sum of every request's time in flight),
λ the achieved request rate (requests sent / window), W the mean E2E of the ok requests. Both
sides are shown; they differ by the time a stream stays open after its last token and by
failed requests.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ondevice.bench.runs import RunRecord

__all__ = ["poisson_arrivals", "closed_loop", "open_loop", "LoadInterrupted", "LevelStats", "level_stats"]

Send = Callable[[int], Any]  # request index -> its result (never raises)


def poisson_arrivals(rate: float, n: int, seed: int = 0) -> list[float]:
    """n send times in seconds from the level's start: 0, then exponential gaps of mean 1/rate."""
    if not rate > 0 or not math.isfinite(rate):
        raise ValueError(f"rate {rate}: must be a positive number of requests per second")
    rng = random.Random(f"ondevice-serve-arrivals:{seed}:{rate!r}")
    out, t = [], 0.0
    for i in range(n):
        if i:
            t += rng.expovariate(rate)
        out.append(t)
    return out


class LoadInterrupted(KeyboardInterrupt):
    """Ctrl-C during a level: `results` holds what had finished (None for the rest)."""

    def __init__(self, results: list[Any]):
        super().__init__()
        self.results = results


def _join(
    threads: Sequence[threading.Thread], stop: threading.Event, results: list[Any], *, start: bool = False
) -> None:
    """(Start and) wait for the threads; Ctrl-C stops new sends and raises LoadInterrupted with what finished."""
    try:
        for th in threads if start else ():
            th.start()
        for th in threads:
            while th.is_alive():
                th.join(0.2)
    except KeyboardInterrupt:
        stop.set()
        raise LoadInterrupted(list(results)) from None


def closed_loop(
    send: Send, n: int, concurrency: int, budget_s: float, *, stop: threading.Event | None = None
) -> list[Any]:
    """Results by request index (None for requests not sent before the budget ran out)."""
    if concurrency < 1:
        raise ValueError(f"concurrency {concurrency}: must be at least 1")
    stop = stop or threading.Event()
    results: list[Any] = [None] * n
    lock, nxt = threading.Lock(), [0]
    deadline = time.perf_counter() + budget_s

    def worker() -> None:
        while not stop.is_set() and time.perf_counter() < deadline:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= n:
                return
            results[i] = send(i)

    threads = [
        threading.Thread(target=worker, daemon=True, name=f"ondevice-client-{k}") for k in range(min(concurrency, n))
    ]
    _join(threads, stop, results, start=True)
    return results


def open_loop(
    send: Send, arrivals: Sequence[float], budget_s: float, *, stop: threading.Event | None = None
) -> list[Any]:
    """Send request i at arrivals[i] seconds from now (a thread each); None for those not sent."""
    stop = stop or threading.Event()
    results: list[Any] = [None] * len(arrivals)
    threads = []

    def run(i: int) -> None:
        results[i] = send(i)

    start = time.perf_counter()
    try:
        for i, at in enumerate(arrivals):
            if at > budget_s or stop.is_set():
                break
            wait = start + at - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            th = threading.Thread(target=run, args=(i,), daemon=True, name=f"ondevice-client-{i}")
            th.start()
            threads.append(th)
    except KeyboardInterrupt:
        stop.set()
        raise LoadInterrupted(list(results)) from None
    _join(threads, stop, results)
    return results


@dataclass(frozen=True)
class LevelStats:
    """What one load level did."""

    level: str  # scenario name, e.g. "closed_c4", "open_r2"
    mode: str  # "closed" or "open"
    offered: float  # concurrency C, or arrival rate λ (req/s)
    requests: int  # requests planned
    sent: int  # requests sent
    ok: int  # ok requests
    failed: int  # failed or timed out
    window_s: float  # first send -> last stream end, seconds
    achieved_rps: float | None  # requests sent / window
    arrival_rps: float | None  # open loop: (sent - 1) / (last send - first send), the rate actually offered
    mean_in_flight: float | None  # L: time-average of requests in flight over the window
    mean_e2e_s: float | None  # W: mean E2E of the ok requests, seconds
    little_lw: float | None  # λ·W, to hold against L
    output_tok_s: float | None  # output tokens of all requests / window (the server's aggregate throughput)
    goodput_rps: float | None  # requests meeting every --slo bound / window (None without --slo)

    @property
    def little_ratio(self) -> float | None:
        """L / (λ·W): 1 when Little's law holds with W = mean E2E."""
        return self.mean_in_flight / self.little_lw if self.mean_in_flight is not None and self.little_lw else None

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), little_ratio=self.little_ratio)


def level_stats(
    runs: Sequence[RunRecord], *, mode: str, offered: float, requests: int, good: int | None = None
) -> LevelStats:
    """The level's figures from its runs (server runs: each with its serve.sent_s/done_s)."""
    spans = [(r.serve["sent_s"], r.serve["done_s"]) for r in runs if r.serve and r.serve.get("sent_s") is not None]
    ok = [r.timings for r in runs if r.ok and r.timings is not None]  # the ok runs' Timings
    failed = sum(r.status in ("failed", "timeout") for r in runs)
    if not spans:
        return LevelStats(
            runs[0].scenario if runs else "",
            mode,
            offered,
            requests,
            0,
            0,
            failed,
            0.0,
            None,
            None,
            None,
            None,
            None,
            None,
            None,
        )
    first, last = min(s for s, _ in spans), max(d for _, d in spans)
    window = max(last - first, 1e-9)
    sends = sorted(s for s, _ in spans)
    rate = len(spans) / window
    w = sum(t.e2e_s for t in ok) / len(ok) if ok else None
    tokens = sum(r.output_tokens for r in runs if r.timings is not None)
    return LevelStats(
        level=runs[0].scenario,
        mode=mode,
        offered=offered,
        requests=requests,
        sent=len(spans),
        ok=len(ok),
        failed=failed,
        window_s=window,
        achieved_rps=rate,
        arrival_rps=(len(sends) - 1) / (sends[-1] - sends[0])
        if mode == "open" and len(sends) > 1 and sends[-1] > sends[0]
        else None,
        mean_in_flight=sum(d - s for s, d in spans) / window,
        mean_e2e_s=w,
        little_lw=rate * w if w is not None else None,
        output_tok_s=tokens / window,
        goodput_rps=good / window if good is not None else None,
    )
