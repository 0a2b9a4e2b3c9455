"""A scripted fake engine behind the Engine/Chat interface, for deterministic TUI tests.

Tokens are whitespace-separated words (with their trailing space); every output token is
one word of the script; timings are scripted, so stats and snapshots are exact. A `gate`
lets a test hold the stream after `hold_after` tokens (to cancel it mid-answer).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from ondevice.core.errors import ContextOverflowError, EngineBusyError
from ondevice.core.results import Generation, Timings, TokenEvent
from ondevice.gguf.spec import ModelSpec
from ondevice.roofline import Calibration, Predictor

SCRIPT = "Here is a **short** answer.\n\n- first point\n- second point\n\nThe end of the scripted reply."


def fake_spec() -> ModelSpec:
    return ModelSpec(
        path=None,
        name="fake-model-1B",
        arch="llama",
        quant="Q4_K_M",
        n_params=1_000_000_000,
        n_params_active=1_000_000_000,
        n_params_matmul=950_000_000,
        n_layer=16,
        d_model=2048,
        n_head=32,
        n_head_kv=8,
        head_dim_k=64,
        head_dim_v=64,
        n_ctx_train=8192,
        n_vocab=32000,
        sliding_window=None,
        swa_layers=(),
        n_expert=0,
        n_expert_used=0,
        tied_output=False,
        file_bytes=600_000_000,
        weight_bytes=590_000_000,
        decode_weight_bytes=560_000_000,
        bytes_by_type={"Q4_K": 590_000_000},
        decode_bytes_by_type={"Q4_K": 560_000_000},
        kv_bytes_per_token_by_layer=(2 * 8 * 128 * 2,) * 16,
    )


@dataclass(frozen=True)
class FakeInfo:
    model_path: str
    spec: ModelSpec
    backend: str = "CPU"
    n_gpu_layers: int = 0
    n_threads: int = 2
    n_batch: int = 512
    n_ctx: int = 4096
    flash_attn: bool = False
    load_s: float = 0.42
    llama_cpp_version: str = "0.3.36"
    seed: int = 0
    cpu_buffers: str = "repack"
    flash_attn_used: bool | None = True
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"


def count_tokens(text: str) -> int:
    return len(text.split())


class FakeStream:
    def __init__(self, engine: FakeEngine, prompt_tokens: int, max_tokens: int, cancel: threading.Event | None):
        self.engine, self.prompt_tokens, self.max_tokens = engine, prompt_tokens, max_tokens
        self.cancel = cancel
        self.generation: Generation | None = None
        self._gen = self._run()

    def __iter__(self):
        return self

    def __next__(self) -> TokenEvent:
        return next(self._gen)

    def close(self) -> None:
        if self.cancel is not None:
            self.cancel.set()

    def _run(self):
        e = self.engine
        words = [w + " " for w in e.script.split(" ")]
        cached = min(e.kv_cache_tokens, self.prompt_tokens)
        t = e.ttft_s
        times, ids, text, reason = [], [], [], "length"
        try:
            for i in range(self.max_tokens):
                if i >= len(words):
                    reason = "stop"
                    break
                if e.hold_after is not None and i == e.hold_after:
                    e.held.set()
                    e.gate.wait(timeout=10)
                if (self.cancel is not None and self.cancel.is_set()) or e.cancelled.is_set():
                    reason = "cancelled"
                    break
                if i:
                    t += e.itl_pattern_s[i % len(e.itl_pattern_s)]
                times.append(t)
                ids.append(i + 3)
                text.append(words[i])
                ctx = self.prompt_tokens + i
                yield TokenEvent(i, i + 3, words[i], t, ctx, e.predictor.step_s(ctx)[1] if e.predictor else None)
                if e.token_delay_s:
                    e.cancelled.wait(e.token_delay_s)
        finally:
            e.kv_cache_tokens = self.prompt_tokens + len(times)
            e.busy = False
            e.cancelled.clear()
        timings = Timings(
            tokenize_s=0.001,
            prefill_s=e.ttft_s - 0.002,
            ttft_s=e.ttft_s if times else 0.0,
            itl_s=tuple(b - a for a, b in zip(times, times[1:])),
            e2e_s=times[-1] if times else 0.0,
            prompt_tokens_computed=self.prompt_tokens - cached,
            output_tokens=len(times),
        )
        step = e.predictor.step_s(e.kv_cache_tokens) if e.predictor else (None, None)
        self.generation = Generation(
            text="".join(text),
            token_ids=tuple(ids),
            finish_reason=reason,
            prompt_tokens=self.prompt_tokens,
            cached_prompt_tokens=cached,
            timings=timings,
            ceiling_tok_s=1 / step[0] if step[0] else None,
            predicted_tok_s=1 / step[1] if step[1] else None,
            predicted_ttft_s=e.predictor.ttft_s(self.prompt_tokens, cached) if e.predictor else None,
            predicted_e2e_s=e.predictor.e2e_s(self.prompt_tokens, len(times), cached)
            if e.predictor and times
            else None,
        )


class FakeChat:
    def __init__(self, engine: FakeEngine, system: str | None, **defaults: Any):
        self.engine = engine
        self.defaults = defaults
        self.messages: list[dict] = [{"role": "system", "content": system}] if system else []

    def _prompt_tokens(self, text: str) -> int:
        return sum(count_tokens(m["content"]) + 2 for m in self.messages) + count_tokens(text) + 3

    def prompt_tokens(self, text: str | None = None) -> list[int]:
        return list(range(self._prompt_tokens(text or "")))

    def stream(self, text: str, **kw: Any) -> FakeStream:
        e = self.engine
        opts = {**self.defaults, **kw}
        max_tokens = opts.get("max_tokens", 256)
        prompt = self._prompt_tokens(text)
        if prompt + max_tokens > e.n_ctx:
            raise ContextOverflowError(f"prompt ({prompt} tokens) + max_tokens ({max_tokens}) > n_ctx ({e.n_ctx})")
        if e.busy:
            raise EngineBusyError("busy")
        e.busy = True
        e.calls.append({"text": text, **opts})
        if e.on_request is not None:
            e.on_request()
        self.messages.append({"role": "user", "content": text})
        stream = FakeStream(e, prompt, max_tokens, opts.get("cancel"))
        chat = self

        class _Appending:
            generation = property(lambda s: stream.generation)

            def __iter__(s):
                yield from stream
                chat.messages.append({"role": "assistant", "content": stream.generation.text})

        return _Appending()  # type: ignore[return-value]

    def drop_oldest_turn(self) -> bool:
        start = 1 if self.messages and self.messages[0]["role"] == "system" else 0
        if len(self.messages) - start < 2:
            return False
        del self.messages[start : start + 2]
        self.engine.kv_cache_tokens = 0
        return True

    def reset(self) -> None:
        self.messages = self.messages[:1] if self.messages and self.messages[0]["role"] == "system" else []


@dataclass
class FakeEngine:
    n_ctx: int = 4096
    script: str = SCRIPT
    ttft_s: float = 0.125
    itl_pattern_s: tuple[float, ...] = (0.020, 0.022, 0.019, 0.031, 0.021)
    token_delay_s: float = 0.0  # real time between tokens (for cancel tests)
    hold_after: int | None = None  # wait on `gate` before this output token
    on_request: Any = None  # called (from the generation thread) when a request starts
    with_predictor: bool = True
    kv_cache_tokens: int = 0
    closed: bool = False
    busy: bool = False
    resets: int = 0
    calls: list[dict] = field(default_factory=list)
    gate: threading.Event = field(default_factory=threading.Event)
    held: threading.Event = field(default_factory=threading.Event)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        spec = fake_spec()
        self.info = FakeInfo(model_path="/models/fake-model-1B.gguf", spec=spec, n_ctx=self.n_ctx)
        cal = Calibration(backend="CPU", ceiling_gbs=40.0, type_gbs={"Q4_K": 30.0}, t0_s=0.001)
        self.predictor = Predictor(spec, cal) if self.with_predictor else None

    def chat(self, system: str | None = None, **defaults: Any) -> FakeChat:
        return FakeChat(self, system, **defaults)

    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = False) -> list[int]:
        return list(range(count_tokens(text) + int(add_bos)))

    def cached_prefix(self, ids) -> int:
        return min(self.kv_cache_tokens, len(ids) - 1)

    def cancel(self) -> None:
        self.cancelled.set()

    def reset(self) -> None:
        self.resets += 1
        self.kv_cache_tokens = 0

    def close(self) -> None:
        self.closed = True


def aio(fn):
    """Run an async test function with asyncio.run (no pytest-asyncio needed)."""
    import asyncio
    import functools

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return asyncio.run(fn(*args, **kwargs))

    return wrapper


class Gated:
    """Wraps a real engine: every chat stream waits on `gate` before yielding token `hold_after`,
    and sets `held` when it gets there. Everything else passes through to the engine."""

    def __init__(self, engine: Any, hold_after: int):
        self._engine = engine
        self.hold_after = hold_after
        self.gate = threading.Event()
        self.held = threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    def chat(self, system: str | None = None, **defaults: Any) -> Any:
        return _GatedChat(self, self._engine.chat(system=system, **defaults))


class _GatedChat:
    def __init__(self, owner: Gated, chat: Any):
        self._owner, self._chat = owner, chat

    def __getattr__(self, name: str) -> Any:
        return getattr(self._chat, name)

    def stream(self, text: str, **kw: Any) -> Any:
        stream = self._chat.stream(text, **kw)
        owner = self._owner

        class _Held:
            generation = property(lambda s: stream.generation)

            def __iter__(s):
                for ev in stream:
                    if ev.index == owner.hold_after:
                        owner.held.set()
                        owner.gate.wait(10)
                    yield ev

        return _Held()
