"""Choosing k for speculative decoding (ondevice.engine.speculative): the step cost model and the planner.

Choosing k (0 = a plain step): the acceptance of drafted tokens is kept per kind of draft
(prompt lookup: per matched n-gram length), as decayed counts; with acceptance a, a step
of k drafts commits (1 - a^(k+1)) / (1 - a) tokens on average, and costs the decode of k + 1
tokens (the predictor's tokens_step_s when it has one, else this request's measured decode
times, fitted linearly in the tokens per step), plus a sample per committed token and the
drafting itself (both measured). k maximises committed tokens per unit time; a kind whose
drafts do not pay is probed again now and then so k can come back. The prediction kept in
SpecStats is the sum of expected committed tokens over the sum of predicted step costs, in
plain steps, each taken before its step ran.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from statistics import median

from ondevice.engine.interface import Predictor, PredictsBatchStep

__all__ = ["expected_committed", "speedup_at_acceptance", "StepCost", "KPlanner"]


def expected_committed(a: float, k: int) -> float:
    """Tokens one step of k drafts commits on average when each draft is accepted with probability a
    (given the ones before it were): 1 + a + ... + a^k = (1 - a^(k+1)) / (1 - a)."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


def speedup_at_acceptance(
    k_steps: dict[int, int], plain_steps: int, acceptance: float | None, cost: float
) -> float | None:
    """Predicted speedup over plain decoding from the k of each verify step and an acceptance rate:
    (sum over verify steps of expected_committed(a, k) + plain steps) / the steps' predicted cost, in plain
    steps (a plain step commits 1 token at cost 1). None without steps, or verify steps without an acceptance."""
    verify = sum(k_steps.values())
    if verify + plain_steps == 0 or cost <= 0 or (verify and acceptance is None):
        return None
    a = acceptance or 0.0  # set whenever there are verify steps (checked above)
    committed = sum(n * expected_committed(a, k) for k, n in k_steps.items()) if verify else 0.0
    return (committed + plain_steps) / cost


class StepCost:
    """Predicted time of a step that verifies k drafts, in plain steps (decode of one token + one sample).

    decode(n tokens) / decode(1 token): this request's measured decode times (the median of the
    last ones per n) where n has been measured; else the predictor's tokens_step_s ratio when it
    has one; else a line through what was measured, t(n) = t(1) + slope (n - 1), PRIOR_SLOPE
    standing in for the slope until a second size is measured. Sampling and drafting are measured
    per token. Decode times on a shared machine are noisy: medians, not means."""

    PRIOR_SLOPE = 0.05  # extra decode time per extra token, in single-token decodes, before any is measured
    MEASURED = 1  # samples of a size before its own median is used (a probe's one sample beats any model)
    _KEEP = 32  # samples kept per size

    def __init__(self, predictor: Predictor | None = None):
        self._tokens_step_s = predictor.tokens_step_s if isinstance(predictor, PredictsBatchStep) else None
        self._decode: dict[int, deque[float]] = {}  # tokens per decode -> the last decode times, ns
        self._sample: deque[float] = deque(maxlen=4 * self._KEEP)  # ns per sample, averaged per step
        self._draft: deque[float] = deque(maxlen=self._KEEP)  # ns per drafted token, per step
        self._cache: dict[int, float | None] = {}  # n -> median decode ns (cleared on each record)
        self._ratio_cache: dict[tuple[int, int], float] = {}  # (context bucket, n) -> predictor's decode ratio

    @property
    def plain_samples(self) -> int:
        """Single-token decodes measured so far."""
        return len(self._decode.get(1, ()))

    def record(
        self, n_tokens: int, decode_ns: float, samples: int, sample_ns: float, drafted: int, draft_ns: float
    ) -> None:
        self._decode.setdefault(n_tokens, deque(maxlen=self._KEEP)).append(decode_ns)
        self._sample.append(sample_ns / max(1, samples))
        if drafted:
            self._draft.append(draft_ns / drafted)
        self._cache.clear()

    def _median(self, n: int) -> float | None:
        if n not in self._cache:
            xs = self._decode.get(n)
            self._cache[n] = median(xs) if xs else None
        return self._cache[n]

    def _line(self, n: int) -> float:
        """decode(n) / decode(1) on a line through the measured sizes (PRIOR_SLOPE with fewer than two)."""
        t1 = self._median(1)
        pts = [(m, t) for m in self._decode if m > 1 and (t := self._median(m)) is not None]
        if t1 is None or not pts:
            return 1.0 + self.PRIOR_SLOPE * (n - 1)
        slope = max(0.0, sum((t - t1) * (m - 1) for m, t in pts) / sum((m - 1) ** 2 for m, _ in pts))  # through (1, t1)
        return 1.0 + slope * (n - 1) / t1

    def decode_ratio(self, n_ctx: int, n: int) -> float:
        """decode(n tokens) / decode(1 token) at a context of n_ctx tokens."""
        if n <= 1:
            return 1.0
        t1, tn = self._median(1), self._median(n)
        if t1 and tn is not None and len(self._decode.get(n, ())) >= self.MEASURED:
            return tn / t1
        if self._tokens_step_s is not None:
            key = (n_ctx // 64, n)
            r = self._ratio_cache.get(key)
            if r is None:
                try:
                    r = float(self._tokens_step_s(n_ctx, n)) / float(self._tokens_step_s(n_ctx, 1))
                except Exception:  # a predictor that cannot answer: fall back to what was measured
                    self._tokens_step_s = None
                    return self._line(n)
                self._ratio_cache[key] = r
            return r
        return self._line(n)

    def step_ratio(self, n_ctx: int, k: int, committed: float) -> float:
        """Predicted time of a step with k drafts committing `committed` tokens / a plain step's."""
        if k <= 0:
            return 1.0
        r = self.decode_ratio(n_ctx, k + 1)
        t1 = self._median(1)
        if t1 is None:
            return r
        s = median(self._sample) if self._sample else 0.0
        d = median(self._draft) if self._draft else 0.0
        return (t1 * r + committed * s + k * d) / (t1 + s)


class KPlanner:
    """Chooses k per step from the running acceptance of each kind of draft and the step cost."""

    PRIOR = (1.0, 1.0)  # (accepted, rejected) pseudo-counts of a kind not seen yet: acceptance 0.5
    DECAY = 0.9  # weight of the counts so far at each update: recent steps count most (text changes)
    MIN_GAIN = 1.02  # drafting must promise this speedup over a plain step, else k = 0
    PROBE_EVERY = 16  # a kind held at k = 0 is tried again after this many chances, doubling after each try
    PLAIN_FIRST = 2  # plain steps before any draft: the single-token decode time every ratio is relative to

    def __init__(self, k_max: int, cost: StepCost):
        self.k_max = k_max
        self.cost = cost
        self._counts: dict[Hashable, list[float]] = {}
        self._held: dict[Hashable, list[int]] = {}  # kind -> [chances passed at k = 0, chances before the next try]

    def acceptance(self, kind: Hashable) -> float:
        acc, rej = self._counts.get(kind, self.PRIOR)
        return acc / (acc + rej) if acc + rej > 0 else 0.0

    def _best(self, a: float, k_cap: int, n_ctx: int) -> tuple[float, int, float, float]:
        """(committed per plain-step time, k, expected committed, cost) of the best k >= 1."""
        best = (0.0, 0, 1.0, 1.0)
        for k in range(1, k_cap + 1):
            e = expected_committed(a, k)
            c = self.cost.step_ratio(n_ctx, k, e)
            if e / c > best[0]:
                best = (e / c, k, e, c)
        return best

    def choose(self, kind: Hashable | None, k_cap: int, n_ctx: int) -> tuple[int, float, float]:
        """(k, expected committed tokens, predicted cost in plain steps) for the next step."""
        k_cap = min(k_cap, self.k_max)
        if kind is None or k_cap <= 0 or self.cost.plain_samples < self.PLAIN_FIRST:
            return 0, 1.0, 1.0
        score, k, e, c = self._best(self.acceptance(kind), k_cap, n_ctx)
        held = self._held.setdefault(kind, [0, self.PROBE_EVERY])
        if score >= self.MIN_GAIN:
            held[:] = [0, self.PROBE_EVERY]
            return k, e, c
        held[0] += 1
        if held[0] >= held[1] and self._best(1.0, k_cap, n_ctx)[0] >= self.MIN_GAIN:
            held[:] = [0, 2 * held[1]]  # try again; if it still does not pay, wait twice as long
            return k, e, c
        return 0, 1.0, 1.0

    def update(self, kind: Hashable, drafted: int, accepted: int) -> None:
        acc, rej = self._counts.get(kind, self.PRIOR)
        self._counts[kind] = [acc * self.DECAY + accepted, rej * self.DECAY + (1.0 if accepted < drafted else 0.0)]
