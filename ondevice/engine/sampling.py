"""Sampling parameters: validation by name, and llama.cpp's native sampler chain.

Sampling never copies logits into Python: the chain runs inside llama.cpp
(`llama_sampler_sample`). Order, as llama.cpp's own tools use it: repeat penalty,
top-k, top-p, min-p, temperature, then a seeded draw. Temperature 0 is greedy
(penalty, then argmax).

DEFAULTS is the one home of the default settings: make_params, Engine.stream, the CLI's
flags, the bench and the chat app all read it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, TypedDict

from ondevice.core.errors import EngineError, InvalidParameterError

__all__ = [
    "SamplingParams",
    "DEFAULTS",
    "CHAT_MAX_TOKENS",
    "make_params",
    "SamplerChain",
    "PENALTY_LAST_N",
    "SAMPLING_KEYS",
    "SamplingArgs",
]

PENALTY_LAST_N = 64  # tokens of history the repeat penalty looks at (llama.cpp's default)
_SEED_MAX = 2**32 - 1  # llama.cpp seeds are uint32


@dataclass(frozen=True)
class SamplingParams:
    """One request's sampling and stop settings, validated."""

    max_tokens: int  # output tokens at most (0: prefill only)
    temperature: float  # 0 = greedy
    top_k: int  # keep the k most likely tokens (0 = off)
    top_p: float  # nucleus mass in (0, 1] (1 = off)
    min_p: float  # drop tokens below min_p x the top probability, in [0, 1] (0 = off)
    repeat_penalty: float  # > 0; 1.0 = off
    seed: int | None  # uint32 draw seed; None = the engine's per-request seed
    stop: tuple[str, ...]  # stop strings, never emitted
    ignore_eos: bool  # keep going past end-of-generation tokens (benchmarks)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def sampler_settings(self) -> dict[str, Any]:
        """The settings of the sampler chain itself (no length, seed or stops): what a bench records."""
        return {
            "temperature": self.temperature,
            "top_k": self.top_k,
            "top_p": self.top_p,
            "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty,
        }


# The keyword names of the sampling settings: SamplingParams' fields, written out once (there).
SAMPLING_KEYS = frozenset(f.name for f in fields(SamplingParams))


class SamplingArgs(TypedDict, total=False):
    """The sampling keywords as callers pass them (`**kw: Unpack[SamplingArgs]`); each left out takes DEFAULTS'
    value. Same names as SamplingParams' fields; `stop` may be one string."""

    max_tokens: int
    temperature: float
    top_k: int
    top_p: float
    min_p: float
    repeat_penalty: float
    seed: int | None
    stop: str | Sequence[str]
    ignore_eos: bool


# The defaults of every door (API, `run`, `chat`, `bench`, the chat app), as llama.cpp's tools set them.
DEFAULTS = SamplingParams(
    max_tokens=256,
    temperature=0.8,
    top_k=40,
    top_p=0.95,
    min_p=0.05,
    repeat_penalty=1.0,
    seed=None,
    stop=(),
    ignore_eos=False,
)
CHAT_MAX_TOKENS = 512  # one chat answer at most: a chat turn is allowed to run longer than a `run` completion


def make_params(
    *,
    max_tokens: Any = DEFAULTS.max_tokens,
    temperature: Any = DEFAULTS.temperature,
    top_k: Any = DEFAULTS.top_k,
    top_p: Any = DEFAULTS.top_p,
    min_p: Any = DEFAULTS.min_p,
    repeat_penalty: Any = DEFAULTS.repeat_penalty,
    seed: Any = DEFAULTS.seed,
    stop: Any = DEFAULTS.stop,
    ignore_eos: Any = DEFAULTS.ignore_eos,
) -> SamplingParams:
    """Validate every parameter; an out-of-range one raises InvalidParameterError naming it."""
    return SamplingParams(
        max_tokens=_int("max_tokens", max_tokens, lo=0),
        temperature=_float("temperature", temperature, lo=0.0),
        top_k=_int("top_k", top_k, lo=0),
        top_p=_float("top_p", top_p, lo=0.0, hi=1.0, lo_open=True),
        min_p=_float("min_p", min_p, lo=0.0, hi=1.0),
        repeat_penalty=_float("repeat_penalty", repeat_penalty, lo=0.0, lo_open=True),
        seed=None if seed is None else _int("seed", seed, lo=0, hi=_SEED_MAX),
        stop=_stops(stop),
        ignore_eos=_bool("ignore_eos", ignore_eos),
    )


def _int(name: str, value: Any, *, lo: int | None = None, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameterError(f"{name} must be an integer, not {value!r}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InvalidParameterError(f"{name} must be {bounds}, not {value}")
    return value


def _float(name: str, value: Any, *, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidParameterError(f"{name} must be a finite number, not {value!r}")
    value = float(value)
    bad_lo = value <= lo if lo_open else value < lo
    if bad_lo or (hi is not None and value > hi):
        left = "(" if lo_open else "["
        bounds = f"in {left}{lo:g}, {hi:g}]" if hi is not None else (f"> {lo:g}" if lo_open else f">= {lo:g}")
        raise InvalidParameterError(f"{name} must be {bounds}, not {value:g}")
    return value


def _bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise InvalidParameterError(f"{name} must be True or False, not {value!r}")
    return value


def _stops(stop: Any) -> tuple[str, ...]:
    if stop is None:
        return ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, Sequence) or not all(isinstance(s, str) for s in stop):
        raise InvalidParameterError(f"stop must be a string or a sequence of strings, not {stop!r}")
    if any(s == "" for s in stop):
        raise InvalidParameterError("stop strings must not be empty")
    return tuple(dict.fromkeys(stop))


class SamplerChain:
    """A llama.cpp sampler chain for one request; free it with close()."""

    def __init__(self, lib: Any, params: SamplingParams, seed: int, n_vocab: int, history: Sequence[int] = ()):
        self._lib = lib
        chain_params = lib.llama_sampler_chain_default_params()
        chain_params.no_perf = True
        self.ptr = lib.llama_sampler_chain_init(chain_params)
        if not self.ptr:
            raise EngineError("llama.cpp could not create a sampler chain")
        add = lambda s: lib.llama_sampler_chain_add(self.ptr, s)  # noqa: E731 - the chain owns s
        if params.repeat_penalty != 1.0:
            add(lib.llama_sampler_init_penalties(n_vocab, PENALTY_LAST_N, params.repeat_penalty, 0.0, 0.0))
        if params.greedy:
            add(lib.llama_sampler_init_greedy())
        else:
            if params.top_k > 0:
                add(lib.llama_sampler_init_top_k(params.top_k))
            if params.top_p < 1.0:
                add(lib.llama_sampler_init_top_p(params.top_p, 1))
            if params.min_p > 0.0:
                add(lib.llama_sampler_init_min_p(params.min_p, 1))
            add(lib.llama_sampler_init_temp(params.temperature))
            add(lib.llama_sampler_init_dist(seed))
        if params.repeat_penalty != 1.0:
            for token in list(history)[-PENALTY_LAST_N:]:
                lib.llama_sampler_accept(self.ptr, token)

    def close(self) -> None:
        if self.ptr:
            self._lib.llama_sampler_free(self.ptr)
            self.ptr = None
