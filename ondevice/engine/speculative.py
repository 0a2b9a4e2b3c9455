"""Speculative decoding: draft k tokens, verify them and the current token in one llama_decode.

One verify step puts the current token and k drafted tokens (ondevice.engine.drafters) at
their positions in one batch with logits at every position, samples each position with
the request's own sampler chain (`llama_sampler_sample(chain, ctx, i)`, which also accepts
the token, as in the plain loop), and commits the drafts up to the first one the target did
not sample, plus the token it sampled there. The rejected cells leave the KV cache
(`llama_memory_seq_rm`). Every committed token is sampled by the target from the same
logits and sampler state as plain decoding, so greedy output is the plain output token for
token; stop strings, end-of-generation and max_tokens end the output at the same token.

Choosing k: ondevice.engine.kplan (the acceptance per kind of draft, the step cost, the k that pays).

Exact or fast: with exact=True the engine caps k where a verify batch still gives every position
the logits of single-token decoding bit for bit (measured once per engine), so greedy output is
plain decoding's token for token. With exact=False k is bounded by spec_k only and chosen for
speed: every committed token is still the model's greedy choice, but from logits computed in a
batch, whose kernels may round differently; where two tokens nearly tie the output can then
differ from plain decoding's (the bench reports the share of positions that agree).

Timing is the plain loop's: a token's mark is when its sample returned, so the tokens of one
verify step arrive together (ITLs of ~0 inside a burst are kept, not smoothed).
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from time import perf_counter_ns
from typing import Any

from ondevice.core.errors import EngineError, InvalidParameterError
from ondevice.core.results import FinishReason, SpecStats, TokenEvent
from ondevice.engine.drafters import Drafter
from ondevice.engine.interface import Predictor
from ondevice.engine.kplan import KPlanner, StepCost, expected_committed, speedup_at_acceptance
from ondevice.engine.loop import DecodeState, KVCache
from ondevice.engine.sampling import SamplerChain
from ondevice.llama.model import LlamaHandle, fill_batch

__all__ = [
    "SpecSettings",
    "spec_settings",
    "Speculator",
    "exact_verify_tokens",
    "StepCost",
    "KPlanner",
    "expected_committed",
    "MODES",
    "K_LIMIT",
    "DEFAULT_K_MAX",
    "DEFAULT_EXACT",
    "speedup_at_acceptance",
]

MODES = ("lookup", "draft")
K_LIMIT = 64  # most drafted tokens one step may verify (spec_k is checked against it)
DEFAULT_K_MAX = 16  # spec_k when none is given
# exact when none is given: False (k chosen for speed; benchmarks/README.md has the measurements behind it)
DEFAULT_EXACT = True
# Text the batch-invariance check decodes (any text works; this one is public domain: Austen, Pride and Prejudice).
_CHECK_TEXT = (
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, must be "
    "in want of a wife. However little known the feelings or views of such a man may be on his first "
    "entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, that "
    "he is considered as the rightful property of some one or other of their daughters. "
)


@dataclass(frozen=True)
class SpecSettings:
    """One request's speculative decoding settings, validated."""

    mode: str  # "lookup" or "draft"
    k_max: int  # most drafted tokens per step, 0..K_LIMIT (0: plain steps only)
    draft: str | None  # draft model reference (mode "draft"), as given
    exact: bool = DEFAULT_EXACT  # True: k capped where verify logits equal single-token decoding's bit for bit


def spec_settings(speculative: Any, draft: Any, spec_k: Any, exact: Any = None) -> SpecSettings | None:
    """Validate the speculative arguments of stream()/generate(); None when none is asked for.
    draft=PATH alone means speculative="draft"; exact=None means DEFAULT_EXACT."""
    if exact is not None and not isinstance(exact, bool):
        raise InvalidParameterError(f"exact must be True or False, not {exact!r}")
    if speculative is None and draft is None:
        for name, value in (("spec_k", spec_k), ("exact", exact)):
            if value is not None:
                raise InvalidParameterError(f"{name} needs speculative='lookup' or a draft model")
        return None
    mode = speculative if speculative is not None else "draft"
    if mode not in MODES:
        raise InvalidParameterError(f"speculative must be None, 'lookup' or 'draft', not {speculative!r}")
    if mode == "draft" and draft is None:
        raise InvalidParameterError("speculative='draft' needs a draft model (draft=PATH)")
    if mode == "lookup" and draft is not None:
        raise InvalidParameterError(
            "speculative='lookup' drafts from the prompt: give no draft model, or speculative='draft'"
        )
    if draft is not None and not isinstance(draft, (str, bytes)) and not hasattr(draft, "__fspath__"):
        raise InvalidParameterError(f"draft must be a path to a GGUF file, not {draft!r}")
    if spec_k is None:
        k = DEFAULT_K_MAX
    elif isinstance(spec_k, bool) or not isinstance(spec_k, int) or not 0 <= spec_k <= K_LIMIT:
        raise InvalidParameterError(f"spec_k must be an integer in [0, {K_LIMIT}], not {spec_k!r}")
    else:
        k = spec_k
    return SpecSettings(mode, k, None if draft is None else str(draft), DEFAULT_EXACT if exact is None else exact)


def exact_verify_tokens(handle: LlamaHandle, info: Any, tokenize: Any, want: int) -> int:
    """Most tokens (<= want) one verify decode may hold on this engine and still give each position the
    logits of single-token decoding, bit for bit (ondevice.llama.invariance; measured, a second or so)."""
    from ondevice.core.kvtypes import kv_ggml_type
    from ondevice.engine.loader import _flash_attn_type
    from ondevice.llama.invariance import batch_invariant_tokens

    ids = tokenize(_CHECK_TEXT * (1 + (want + 8) // 40), add_bos=True)[: want + 4]
    lib = handle.lib
    return batch_invariant_tokens(
        handle.model,
        ids,
        n_threads=info.n_threads,
        lib=lib,
        flash_attn_type=_flash_attn_type(lib, info.flash_attn),
        type_k=int(kv_ggml_type(info.cache_type_k)),
        type_v=int(kv_ggml_type(info.cache_type_v)),
        n_ubatch=info.n_ubatch,
    )


class Speculator:
    """One request's speculative decoding: `decode` stands in for the plain loop's decode (the same
    DecodeState read and filled), `stats()` tells what it did."""

    def __init__(
        self,
        settings: SpecSettings,
        drafter: Drafter,
        predictor: Predictor | None = None,
        k_cap: int | None = None,
        cost: StepCost | None = None,
    ):
        """cost: step times measured so far (an engine keeps one across its requests: verify costs are the
        machine's, acceptance is the text's and starts afresh each request)."""
        self.settings = settings
        self._drafter = drafter
        # most drafts a step verifies: spec_k, and what the backend verifies with single-token logits
        self.k_cap = max(0, min(settings.k_max, K_LIMIT if k_cap is None else k_cap))
        self.planner = KPlanner(self.k_cap, cost if cost is not None else StepCost(predictor))
        self._drafted = self._accepted = self._steps = self._plain_steps = self._k = 0
        self._pred_committed = self._pred_cost = 0.0
        self._k_steps: dict[int, int] = {}  # drafts verified in one step -> verify steps with that many

    def stats(self) -> SpecStats:
        n = self._steps + self._plain_steps
        acceptance = self._accepted / self._drafted if self._drafted else None
        return SpecStats(
            mode=self.settings.mode,
            k_max=self.settings.k_max,
            k_cap=self.k_cap,
            drafted=self._drafted,
            accepted=self._accepted,
            steps=self._steps,
            plain_steps=self._plain_steps,
            k_final=self._k,
            predicted_speedup=self._pred_committed / self._pred_cost if n and self._pred_cost > 0 else None,
            exact=self.settings.exact,
            speedup_at_acceptance=speedup_at_acceptance(self._k_steps, self._plain_steps, acceptance, self._pred_cost),
        )

    def decode(self, state: DecodeState) -> Generator[TokenEvent, None, FinishReason]:
        """Generator of TokenEvents, returning the FinishReason (as the plain loop's _decode). The state's
        `spent`: the attribution sums (verify decodes count as llama_decode; drafting is in the overhead)."""
        handle, req = state.handle, state.req
        lib = handle.lib
        k_max = max(0, min(self.k_cap, handle.n_batch - 1))
        batch = lib.llama_batch_init(k_max + 1, 0, 1)
        chain = SamplerChain(lib, req.params, req.seed, handle.n_vocab, history=req.ids)
        try:
            self._drafter.extend(req.ids)
            return (yield from self._run(state, chain.ptr, batch, k_max))
        finally:
            lib.llama_batch_free(batch)
            chain.close()
            self._drafter.close()

    def _run(self, state: DecodeState, smpl: Any, batch: Any, k_max: int) -> Generator[TokenEvent, None, FinishReason]:
        handle, kv, req, out, spent = state.handle, state.kv, state.req, state.output, state.spent
        lib, ctx, p = handle.lib, handle.ctx, req.params
        sample, decode = lib.llama_sampler_sample, lib.llama_decode
        ids_out = out.ids
        drafter, planner, tokens = self._drafter, self.planner, kv.tokens
        token = sample(smpl, ctx, -1)  # the first token, from the prompt's logits
        s1 = perf_counter_ns()
        event, finish = out.commit(token, s1)
        drafter.extend((token,))
        t_yield = perf_counter_ns()
        if finish is None:
            spent.detok_ns += t_yield - s1
        yield event
        while finish is None:
            spent.consumer_ns += perf_counter_ns() - t_yield
            if req.cancelled():
                return "cancelled"
            pos0 = len(tokens)
            kind = drafter.candidate()
            k, expected, cost = planner.choose(kind, min(k_max, p.max_tokens - len(ids_out) - 1), pos0)
            t0 = perf_counter_ns()
            draft = drafter.draft(k)[:k] if k else []
            t1 = perf_counter_ns()
            fill_batch(batch, [token] + draft, pos0, lambda i: True)
            rc = decode(ctx, batch)
            t2 = perf_counter_ns()
            spent.decode_ns += t2 - t1
            if rc != 0:
                raise kv.decode_failed(rc, f"verifying {len(draft)} drafted tokens at output token {len(ids_out)}")
            tokens.append(token)
            tokens.extend(draft)  # the cells now in the cache; the rejected ones leave below
            self._count(k, len(draft), expected, cost)
            sample_ns, accepted, keep = 0, 0, pos0 + 1
            for i in range(len(draft) + 1):
                if i:
                    spent.consumer_ns += perf_counter_ns() - t_yield
                    if req.cancelled():  # stop inside a burst too, as the plain loop stops between tokens
                        finish = "cancelled"
                        break
                s0 = perf_counter_ns()
                token = sample(smpl, ctx, i)
                s1 = perf_counter_ns()
                sample_ns += s1 - s0
                event, finish = out.commit(token, s1)
                drafter.extend((token,))
                t_yield = perf_counter_ns()
                if finish is None:  # the last token's text comes after E2E's end
                    spent.detok_ns += t_yield - s1
                yield event
                keep = pos0 + i + 1  # the cache keeps the current token and the drafts before position i
                if finish is None and i < len(draft) and token == draft[i]:
                    accepted += 1
                    continue
                break
            spent.sample_ns += sample_ns
            self._rollback(handle, kv, keep)
            self._accepted += accepted
            if finish is None:
                planner.cost.record(len(draft) + 1, t2 - t1, accepted + 1, sample_ns, len(draft), t1 - t0)
                if draft:
                    planner.update(kind, len(draft), accepted)
        return finish

    def _count(self, k: int, drafted: int, expected: float, cost: float) -> None:
        self._k = k
        if drafted:
            self._steps += 1
            self._k_steps[drafted] = self._k_steps.get(drafted, 0) + 1
            self._drafted += drafted
            self._pred_committed += expected
            self._pred_cost += cost
        else:
            self._plain_steps += 1
            self._pred_committed += 1.0
            self._pred_cost += 1.0

    @staticmethod
    def _rollback(handle: LlamaHandle, kv: KVCache, keep: int) -> None:
        """Drop the cache's cells from position `keep` on (rejected drafts), and their tokens."""
        if len(kv.tokens) <= keep:
            return
        if not handle.lib.llama_memory_seq_rm(handle.memory, 0, keep, -1):
            kv.clear()
            raise EngineError("llama.cpp could not remove rejected drafts from the KV cache")
        del kv.tokens[keep:]
