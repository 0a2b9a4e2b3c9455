"""What the engine's consumers rely on, as Protocols: the bench drives a `StreamingEngine`, the
chat app a `ChatEngine`, and both hold a `Predictor`. `Engine` satisfies the engine Protocols and
the roofline's predictors the predictor ones; the tests' fakes are checked against them
(tests/test_engine_interface.py), so a fake cannot drift from the real interface.

A predictor must answer `step_s`; the other predictor Protocols are what a consumer asks of it when
present (`isinstance(p, PredictsTTFT)`): a predictor without one leaves that figure empty.
StreamArgs types the keywords Engine.stream and generate take."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ondevice.core.errors import InvalidParameterError
from ondevice.core.results import TokenEvent
from ondevice.engine.sampling import SamplingArgs

__all__ = [
    "StreamingEngine",
    "ChatEngine",
    "ChatLike",
    "Predictor",
    "PredictsTTFT",
    "PredictsPrefill",
    "PredictsDecode",
    "PredictsBatchStep",
    "PredictsBatchCeiling",
    "StreamArgs",
    "check_predictor",
]


@runtime_checkable
class Predictor(Protocol):
    """What an engine holds each decode step against."""

    def step_s(self, n_ctx: int) -> tuple[float, float]:
        """(ceiling_step_s, calibrated_step_s) of one decode step with n_ctx tokens in the context."""
        ...


@runtime_checkable
class PredictsTTFT(Protocol):
    """A predictor with a prefill model: the time to the first token of a prompt."""

    def ttft_s(self, n_prompt: int, n_cached: int = 0, n_batch: int = 512) -> float:
        """Seconds to the first token of an n_prompt-token prompt whose first n_cached are in the KV cache."""
        ...


@runtime_checkable
class PredictsPrefill(Protocol):
    """A predictor that times a prompt's prefill alone (what recomputing a conversation costs)."""

    def prefill_s(self, n_tokens: int, n_cached: int = 0, n_batch: int = 512) -> float: ...


@runtime_checkable
class PredictsDecode(Protocol):
    """A predictor that times a request's whole decode."""

    def decode_s(self, n_prompt: int, n_output: int) -> float:
        """Seconds to decode n_output tokens after an n_prompt-token prompt."""
        ...


@runtime_checkable
class PredictsBatchStep(Protocol):
    """A predictor that times one step over several tokens (speculative verify, batched decode)."""

    def tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float: ...


@runtime_checkable
class PredictsBatchCeiling(Protocol):
    """A predictor that bounds one step over several tokens by the bandwidth ceiling."""

    def ceiling_tokens_step_s(self, n_ctx: int, n_tokens: int, n_seqs: int = 1) -> float: ...


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine the bench can time: tokenize, stream timed token events, close."""

    info: Any  # EngineInfo: how it was loaded (backend, threads, n_ctx, ...)
    predictor: Predictor | None

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]: ...

    def stream(
        self,
        prompt: str | Sequence[int],
        *,
        max_tokens: int = ...,
        temperature: float = ...,
        seed: int | None = ...,
        ignore_eos: bool = ...,
        cancel: Any = ...,
        reuse_prefix: bool = ...,
    ) -> Iterator[TokenEvent]: ...

    def close(self) -> None: ...


@runtime_checkable
class ChatLike(Protocol):
    """One conversation: only the new turn is prefilled."""

    def stream(self, text: str, **sampling: Any) -> Iterator[TokenEvent]: ...

    def drop_oldest_turn(self) -> bool: ...

    def reset(self) -> None: ...


@runtime_checkable
class ChatEngine(Protocol):
    """An engine the chat app can hold: conversations, the context it fills, cancel, close."""

    info: Any  # EngineInfo (its spec feeds the model card)
    predictor: Predictor | None

    @property
    def n_ctx(self) -> int: ...

    @property
    def kv_cache_tokens(self) -> int: ...

    def chat(self, system: str | None = None, **sampling_defaults: Any) -> ChatLike: ...

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]: ...

    def cancel(self) -> None: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...


class StreamArgs(SamplingArgs, total=False):
    """Engine.stream's keywords: the sampling settings plus cancellation, prefix reuse and speculation."""

    cancel: threading.Event | None
    reuse_prefix: bool
    speculative: str | None
    draft: str | Path | None
    spec_k: int | None
    exact: bool | None


def check_predictor(predictor: object) -> Predictor | None:
    """`predictor` when it is None or a Predictor; InvalidParameterError otherwise (load() checks with it)."""
    if predictor is None:
        return None
    if not isinstance(predictor, Predictor) or not callable(predictor.step_s):
        raise InvalidParameterError(
            "predictor must be None or have a step_s(n_ctx) -> (ceiling_step_s, calibrated_step_s) method"
        )
    return predictor
