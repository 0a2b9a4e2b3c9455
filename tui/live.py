"""The hand-off between the generation thread and the UI timer, and the live stats arithmetic.

The generation thread only appends events to a deque (thread-safe, no lock, no repaint).
The UI drains it on a timer (<= 20 Hz), appends the new text in one batch and recomputes
the stats from running sums: the cost per token on the decoding side is one deque append.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ondevice.core.results import Generation, TokenEvent
from ondevice.engine.interface import Predictor

__all__ = [
    "LiveFeed",
    "LiveTracker",
    "LiveStats",
    "context_level",
    "generation_stats",
    "WARN_FRACTION",
]

ITL_HISTORY = 512  # inter-token gaps kept for the sparkline
WARN_FRACTION = 0.8  # the context bar turns when this share of n_ctx is used


class LiveFeed:
    """Token events from the generation thread, drained by the UI thread."""

    def __init__(self) -> None:
        self._events: deque[TokenEvent] = deque()

    def push(self, event: TokenEvent) -> None:
        self._events.append(event)

    def drain(self) -> list[TokenEvent]:
        out: list[TokenEvent] = []
        pop = self._events.popleft
        while True:
            try:
                out.append(pop())
            except IndexError:
                return out


@dataclass(frozen=True)
class LiveStats:
    """What the stats panel shows for the message being generated (or the last one)."""

    output_tokens: int  # tokens so far
    ttft_s: float | None  # request start -> first token, seconds
    last_itl_s: float | None  # latest inter-token gap, seconds
    tpot_s: float | None  # mean inter-token gap so far, seconds
    decode_tok_s: float | None  # 1 / tpot_s, tokens per second
    n_ctx_used: int  # tokens in the KV cache at the latest token
    ceiling_tok_s: float | None  # pure bandwidth bound at n_ctx_used, tokens per second
    predicted_tok_s: float | None  # calibrated prediction at n_ctx_used, tokens per second
    predicted_step_s: float | None  # calibrated step time at n_ctx_used, seconds (the sparkline's reference)
    prefill_tok_s: float | None = None  # prompt tokens computed / prefill_s; known when the message ends
    prompt_tokens: int | None = None  # prompt length in tokens; known when the message ends
    cached_prompt_tokens: int | None = None  # prompt tokens served from the KV cache; known at the end
    finish_reason: str | None = None  # "stop", "length", "cancelled"; None while streaming
    predicted_ttft_s: float | None = None  # roofline TTFT for this prompt (the cached prefix not counted), seconds
    e2e_s: float | None = None  # request start -> last token, seconds; known when the message ends
    predicted_e2e_s: float | None = None  # predicted TTFT + predicted steps of the tokens produced; at the end
    output_tok_s: float | None = None  # output tokens / e2e_s (not decode_tok_s); at the end
    speculative: Any = None  # the Generation's SpecStats when the message was decoded speculatively; known at the end

    @property
    def efficiency(self) -> float | None:
        """Measured decode tok/s over the calibrated prediction."""
        if self.decode_tok_s and self.predicted_tok_s:
            return self.decode_tok_s / self.predicted_tok_s
        return None


class LiveTracker:
    """Running sums over the events of one message (UI thread only)."""

    def __init__(self, predictor: Predictor | None = None, n_ctx_start: int = 0, predicted_ttft_s: float | None = None):
        self.predictor = predictor
        self.predicted_ttft_s = predicted_ttft_s  # known before the first token
        self.itl_s: deque[float] = deque(maxlen=ITL_HISTORY)  # recent gaps, seconds
        self.count = 0
        self.first_t_s: float | None = None
        self.last_t_s: float | None = None
        self.n_ctx_used = n_ctx_start
        self.event_step_s: float | None = None  # predicted_step_s carried by the latest event
        self.final: Generation | None = None

    def add(self, events: Iterable[TokenEvent]) -> str:
        """Take new events; return their text joined (one Markdown append per tick)."""
        pieces: list[str] = []
        for ev in events:
            if self.last_t_s is None:
                self.first_t_s = ev.t_s
            else:
                self.itl_s.append(ev.t_s - self.last_t_s)
            self.last_t_s = ev.t_s
            self.count += 1
            if ev.n_ctx_used:
                self.n_ctx_used = ev.n_ctx_used
            if ev.predicted_step_s:
                self.event_step_s = ev.predicted_step_s
            if ev.text:
                pieces.append(ev.text)
        return "".join(pieces)

    def finish(self, generation: Generation) -> None:
        self.final = generation
        if generation.predicted_step_s:
            self.event_step_s = generation.predicted_step_s[-1]

    def stats(self) -> LiveStats:
        ceiling_s, step_s = self._prediction()
        tpot = None
        if self.count >= 2 and self.first_t_s is not None and self.last_t_s is not None:
            tpot = (self.last_t_s - self.first_t_s) / (self.count - 1)
        g = self.final
        if g is not None:  # the engine's own figures win once the message ends
            t = g.timings
            return LiveStats(
                output_tokens=t.output_tokens,
                ttft_s=t.ttft_s if t.output_tokens else None,
                last_itl_s=t.itl_s[-1] if t.itl_s else None,
                tpot_s=t.tpot_s,
                decode_tok_s=t.decode_tok_s,
                n_ctx_used=self.n_ctx_used,
                ceiling_tok_s=g.ceiling_tok_s or _inv(ceiling_s),
                predicted_tok_s=g.predicted_tok_s or _inv(step_s),
                predicted_step_s=step_s,
                prefill_tok_s=t.prefill_tok_s,
                prompt_tokens=g.prompt_tokens,
                cached_prompt_tokens=g.cached_prompt_tokens,
                finish_reason=g.finish_reason,
                predicted_ttft_s=g.predicted_ttft_s or self.predicted_ttft_s,
                e2e_s=t.e2e_s if t.output_tokens else None,
                predicted_e2e_s=g.predicted_e2e_s,
                output_tok_s=t.output_throughput_tok_s if t.output_tokens else None,
                speculative=g.speculative,
            )
        return LiveStats(
            output_tokens=self.count,
            ttft_s=self.first_t_s,
            last_itl_s=self.itl_s[-1] if self.itl_s else None,
            tpot_s=tpot,
            decode_tok_s=1.0 / tpot if tpot else None,
            n_ctx_used=self.n_ctx_used,
            ceiling_tok_s=_inv(ceiling_s),
            predicted_tok_s=_inv(step_s),
            predicted_step_s=step_s,
            predicted_ttft_s=self.predicted_ttft_s,
        )

    def _prediction(self) -> tuple[float | None, float | None]:
        if self.predictor is not None and self.n_ctx_used:
            try:
                return self.predictor.step_s(self.n_ctx_used)
            except Exception:  # a predictor that cannot answer leaves the fields empty
                return None, self.event_step_s
        return None, self.event_step_s


def _inv(x: float | None) -> float | None:
    return 1.0 / x if x else None


def context_level(used: int, n_ctx: int, reserve: int = 0) -> str:
    """'ok', 'warn' (>= WARN_FRACTION used, or the next answer may not fit) or 'full'."""
    if n_ctx <= 0:
        return "ok"
    if used >= n_ctx:
        return "full"
    if used >= WARN_FRACTION * n_ctx or used + reserve > n_ctx:
        return "warn"
    return "ok"


def generation_stats(generation: Generation) -> dict[str, Any]:
    """What the history keeps of a Generation: everything but the text and token ids."""
    d = generation.to_dict()
    d.pop("text", None)
    d.pop("token_ids", None)
    return d
