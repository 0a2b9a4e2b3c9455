"""What the engine's consumers rely on, as Protocols: the bench drives a `StreamingEngine`, the
chat app a `ChatEngine`. `Engine` satisfies both; the tests' fake engines are checked against
them (tests/test_engine_interface.py), so a fake cannot drift from the real interface."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

from ondevice.core.results import TokenEvent

__all__ = ["StreamingEngine", "ChatEngine", "ChatLike"]


@runtime_checkable
class StreamingEngine(Protocol):
    """An engine the bench can time: tokenize, stream timed token events, close."""

    info: Any  # EngineInfo: how it was loaded (backend, threads, n_ctx, ...)
    predictor: Any  # step_s(n_ctx) -> (ceiling_step_s, calibrated_step_s), or None

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
    predictor: Any  # as StreamingEngine.predictor

    @property
    def n_ctx(self) -> int: ...

    @property
    def kv_cache_tokens(self) -> int: ...

    def chat(self, system: str | None = None, **sampling_defaults: Any) -> ChatLike: ...

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]: ...

    def cancel(self) -> None: ...

    def reset(self) -> None: ...

    def close(self) -> None: ...
