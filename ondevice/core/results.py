"""Result types shared by the engine, the bench, the TUI and scripts.

One timing path: every consumer reads these, so a number means the same thing
everywhere. Definitions are docs/metrics.md's; all times are seconds measured with
time.perf_counter_ns() from the moment the request (text in) was made.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

__all__ = ["TokenEvent", "Timings", "Attribution", "Generation", "FinishReason", "SpecStats"]

FinishReason = Literal["stop", "length", "cancelled"]


@dataclass(frozen=True)
class TokenEvent:
    """One output token, as the stream yields it."""

    index: int  # 0-based position among this request's output tokens
    token_id: int  # id in the model's vocabulary
    text: str  # text released with this token ("" while a multi-byte char or a possible stop string is held back)
    t_s: float  # seconds from request start to this token being available (sampled)
    n_ctx_used: int = 0  # tokens in the KV cache when this token was sampled (prompt + earlier outputs)
    predicted_step_s: float | None = None  # roofline's calibrated step time at that context, when a probe is known


@dataclass(frozen=True)
class Timings:
    """Request timings (docs/metrics.md). Load time is reported apart, on the engine."""

    tokenize_s: float  # text -> token ids (part of TTFT)
    prefill_s: float  # forward pass(es) over the prompt tokens not already cached
    ttft_s: float  # request start -> first output token available
    itl_s: tuple[float, ...]  # gaps between consecutive output tokens: T-1 values
    e2e_s: float  # request start -> last token available
    prompt_tokens_computed: int  # prompt tokens actually prefilled (prompt - cached)
    output_tokens: int  # T, output tokens counted by the tokenizer
    # request start -> first visible output text (after any reasoning block); None: not measured, or no visible text
    ttft_visible_s: float | None = None

    @property
    def tpot_s(self) -> float | None:
        """Mean inter-token latency, (e2e - ttft)/(T - 1); None for T < 2."""
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1) if self.output_tokens >= 2 else None

    @property
    def decode_tok_s(self) -> float | None:
        tpot = self.tpot_s
        return 1.0 / tpot if tpot else None

    @property
    def prefill_tok_s(self) -> float | None:
        return (
            self.prompt_tokens_computed / self.prefill_s if self.prefill_s > 0 and self.prompt_tokens_computed else None
        )

    @property
    def output_throughput_tok_s(self) -> float | None:
        """Output tokens / e2e: not the same number as decode_tok_s."""
        return self.output_tokens / self.e2e_s if self.e2e_s > 0 else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            itl_s=list(self.itl_s),
            tpot_s=self.tpot_s,
            decode_tok_s=self.decode_tok_s,
            prefill_tok_s=self.prefill_tok_s,
            output_throughput_tok_s=self.output_throughput_tok_s,
        )
        return d


@dataclass(frozen=True)
class Attribution:
    """Where one request's E2E went, measured: the parts add up to Timings.e2e_s (overhead_s is
    what no other part holds: cache-prefix matching, setting up the sampler, the loop's own work).
    The decode parts are sums over output tokens 2..T; what happens after the last token is
    available (its text, the caller's handling of it) is outside E2E and not counted."""

    tokenize_s: float  # text -> token ids
    prefill_s: float  # llama_decode over the prompt tokens not cached
    first_sample_s: float  # prefill end -> first token sampled (logits, sampler)
    decode_s: float  # llama_decode of the output tokens, summed
    sample_s: float  # sampling after each llama_decode, summed
    detokenize_s: float  # token -> text, stop-string checks and the event, summed (tokens 1..T-1)
    consumer_s: float  # the caller's own time between receiving a token and asking for the next, summed
    overhead_s: float  # the rest of E2E (>= 0 up to clock rounding)
    e2e_s: float  # the whole: sum of the parts above

    def to_dict(self) -> dict[str, float]:
        return asdict(self)

    def shares(self) -> dict[str, float]:
        """Each part / E2E (0 when E2E is 0)."""
        d = asdict(self)
        e2e = d.pop("e2e_s")
        return {k: (v / e2e if e2e > 0 else 0.0) for k, v in d.items()}


@dataclass(frozen=True)
class SpecStats:
    """What speculative decoding did in one request (ondevice.engine.speculative).

    A verify step decodes the current token plus k drafted tokens in one llama_decode and
    commits the drafts up to the first mismatch plus the token the target sampled there;
    a plain step (k = 0) decodes one token. Every committed token is sampled from the target."""

    mode: str  # "lookup" (prompt lookup) or "draft" (a draft model)
    k_max: int  # most drafted tokens one step may verify, as asked (spec_k), tokens
    k_cap: int  # most drafted tokens one step verified here: k_max, or less where the backend's logits for a
    # batch of more tokens differ from single-token decoding (then the output would not be plain decoding's), tokens
    drafted: int  # drafted tokens verified, over all steps, tokens
    accepted: int  # drafted tokens the target agreed with (committed as they were), tokens
    steps: int  # verify steps (one llama_decode of 1 + k tokens, k >= 1)
    plain_steps: int  # decode steps with nothing drafted (k = 0: no match, or drafts did not pay)
    k_final: int  # k chosen for the last step, tokens
    predicted_speedup: float | None  # expected committed tokens per unit of plain-step time, summed over
    # the decode steps before each ran (expected committed / (verify time / plain step time)); None: no step
    exact: bool = True  # k capped where verify logits equal single-token decoding's bit for bit (else chosen for speed)
    speedup_at_acceptance: float | None = None  # predicted speedup from the k of each verify step and this
    # request's measured acceptance: (sum of expected committed per step + plain steps) / predicted cost; None: no step

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted (0..1); None when nothing was drafted."""
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_accepted_per_step(self) -> float | None:
        """Accepted drafted tokens per verify step (tokens/step; the step also commits one sampled token)."""
        return self.accepted / self.steps if self.steps else None

    @property
    def drafts_per_step(self) -> float | None:
        """Drafted tokens per verify step (tokens/step)."""
        return self.drafted / self.steps if self.steps else None

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_per_step=self.mean_accepted_per_step,
            drafts_per_step=self.drafts_per_step,
        )
        return d


@dataclass(frozen=True)
class Generation:
    """A finished request: text, tokens, why it stopped, and every timing."""

    text: str  # the output text (stop string excluded)
    token_ids: tuple[int, ...]  # output token ids, T of them
    finish_reason: FinishReason  # "stop" (EOS or stop string), "length" (max_tokens), "cancelled"
    prompt_tokens: int  # prompt length in tokens (cached + computed)
    cached_prompt_tokens: int  # prompt tokens served from the KV cache
    timings: Timings
    ceiling_tok_s: float | None = None  # pure bandwidth bound at the context reached (no probe: None)
    predicted_tok_s: float | None = None  # calibrated prediction at the context reached
    predicted_step_s: tuple[float, ...] = field(default=())  # calibrated step time per output token (len T)
    predicted_ttft_s: float | None = None  # roofline's TTFT for this prompt, counting only what the cache lacked
    predicted_e2e_s: float | None = None  # predicted TTFT + predicted decode steps of the T tokens produced
    attribution: Attribution | None = None  # measured parts of E2E (None: not measured, e.g. cancelled before a token)
    speculative: SpecStats | None = None  # speculative decoding's counts, when the request asked for it
    other_cpu_cores: float | None = None  # CPU other processes used during the request, in cores (None: unknown)

    @property
    def efficiency(self) -> float | None:
        """Measured decode tok/s / predicted decode tok/s."""
        measured = self.timings.decode_tok_s
        return measured / self.predicted_tok_s if measured and self.predicted_tok_s else None

    @property
    def ttft_efficiency(self) -> float | None:
        """Predicted TTFT / measured TTFT (1.0 = as predicted; below 1 = slower than predicted)."""
        t = self.timings.ttft_s
        return self.predicted_ttft_s / t if self.predicted_ttft_s and t > 0 else None

    @property
    def predicted_output_tok_s(self) -> float | None:
        """T / predicted E2E: the prediction of Timings.output_throughput_tok_s."""
        e2e = self.predicted_e2e_s
        return self.timings.output_tokens / e2e if e2e and self.timings.output_tokens else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "text": self.text,
            "token_ids": list(self.token_ids),
            "finish_reason": self.finish_reason,
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "timings": self.timings.to_dict(),
            "ceiling_tok_s": self.ceiling_tok_s,
            "predicted_tok_s": self.predicted_tok_s,
            "efficiency": self.efficiency,
            "predicted_step_s": list(self.predicted_step_s),
            "predicted_ttft_s": self.predicted_ttft_s,
            "predicted_e2e_s": self.predicted_e2e_s,
            "predicted_output_tok_s": self.predicted_output_tok_s,
            "attribution": self.attribution.to_dict() if self.attribution else None,
            "speculative": self.speculative.to_dict() if self.speculative is not None else None,
            "other_cpu_cores": self.other_cpu_cores,
        }
