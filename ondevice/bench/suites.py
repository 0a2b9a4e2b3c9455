"""Bench suites (fixed workload groups, docs/bench.md) and exact-length prompts.

A workload is a prompt length P and an output length N, both in the model's own tokens.
Prompts are built from seeded English-like text, tokenized by the model and cut to exactly
P ids, so every run's prompt is new unless a scenario asks for a shared prefix.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from ondevice.core.errors import BenchError

__all__ = [
    "Workload",
    "Suite",
    "SUITE_NAMES",
    "get_suite",
    "custom_suite",
    "fit_suite",
    "with_counts",
    "parse_number_list",
    "PromptBuilder",
]


@dataclass(frozen=True)
class Workload:
    """One request shape."""

    name: str  # "short", "long_context", "long_generation", "quick" or "p{P}_n{N}"
    prompt_tokens: int  # P: prompt length in the model's tokens (BOS included)
    output_tokens: int  # N: output tokens asked for (end-of-sequence ignored)
    capped_from: int | None = None  # the P asked for when it was capped to fit the context
    output_capped_from: int | None = None  # the N asked for when even N alone did not fit


@dataclass(frozen=True)
class Suite:
    """A named set of workloads and how often to measure each."""

    name: str  # "quick", "standard" or "custom"
    workloads: tuple[Workload, ...]  # in the order they run within a repeat
    repeats: int  # measured runs per workload and scenario
    warmup: int  # untimed requests after every model load
    ablation_tokens: int = 16  # output tokens of the --no-kv-cache ablation run (it is O(N * P))


_SUITES = {
    "quick": Suite("quick", (Workload("quick", 128, 32),), repeats=3, warmup=1, ablation_tokens=8),
    "standard": Suite(
        "standard",
        (
            Workload("short", 256, 128),
            Workload("long_context", 8192, 128),
            Workload("long_generation", 1024, 1024),
        ),
        repeats=3,
        warmup=1,
        ablation_tokens=16,
    ),
}
SUITE_NAMES = tuple(_SUITES)


def get_suite(name: str) -> Suite:
    try:
        return _SUITES[name]
    except KeyError:
        raise BenchError(f"unknown suite {name!r} (known: {', '.join(SUITE_NAMES)})") from None


def custom_suite(
    prompt_tokens: Sequence[int], output_tokens: Sequence[int], *, repeats: int = 3, warmup: int = 1
) -> Suite:
    """Every combination of -p and -n, like llama-bench's parameter lists."""
    for flag, values in (("-p", prompt_tokens), ("-n", output_tokens)):
        if not values:
            raise BenchError(f"{flag} needs at least one value")
        for v in values:
            if v <= 0:
                raise BenchError(f"{flag} {v}: token counts must be positive")
    workloads = tuple(Workload(f"p{p}_n{n}", p, n) for p in prompt_tokens for n in output_tokens)
    return Suite("custom", workloads, repeats=repeats, warmup=warmup)


def with_counts(suite: Suite, *, repeats: int | None = None, warmup: int | None = None) -> Suite:
    if repeats is not None and repeats < 1:
        raise BenchError(f"--repeat {repeats}: must be at least 1")
    if warmup is not None and warmup < 0:
        raise BenchError(f"--warmup {warmup}: must be 0 or more")
    return replace(
        suite,
        repeats=suite.repeats if repeats is None else repeats,
        warmup=suite.warmup if warmup is None else warmup,
    )


def fit_suite(suite: Suite, n_ctx: int, *, cap: bool) -> Suite:
    """Check every workload fits a context of n_ctx tokens (P + N <= n_ctx).

    cap=True (the built-in suites): a prompt too long is cut to n_ctx - N and the cut is
    recorded in `capped_from` (when N alone does not fit, N becomes n_ctx // 2).
    cap=False (-p/-n given by the user): raise BenchError.
    """
    out = []
    for w in suite.workloads:
        if w.prompt_tokens + w.output_tokens <= n_ctx:
            out.append(w)
            continue
        if not cap or n_ctx < 2:
            raise BenchError(
                f"workload {w.name}: prompt {w.prompt_tokens} + output {w.output_tokens} tokens "
                f"exceeds the context of {n_ctx} tokens"
            )
        n_out = w.output_tokens if w.output_tokens < n_ctx else n_ctx // 2
        out.append(
            replace(
                w,
                prompt_tokens=min(w.prompt_tokens, n_ctx - n_out),
                output_tokens=n_out,
                capped_from=w.capped_from or w.prompt_tokens,
                output_capped_from=(w.output_capped_from or w.output_tokens) if n_out != w.output_tokens else None,
            )
        )
    return replace(suite, workloads=tuple(out))


def parse_number_list(text: str, flag: str, kind: type = int) -> tuple:
    """'256,1024' -> (256, 1024): positive finite numbers of `kind` (int or float); BenchError
    naming the flag on anything else."""
    try:
        values = tuple(kind(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        whole = "whole " if kind is int else ""
        raise BenchError(f"{flag} {text!r}: expected comma-separated {whole}numbers, e.g. 256,1024") from None
    if not values:
        raise BenchError(f"{flag} {text!r}: expected at least one number")
    for v in values:
        if not (math.isfinite(v) and v > 0):
            raise BenchError(f"{flag} {v:g}: must be greater than 0")
    return values


_WORDS = (
    "time year people way day man thing woman life child world school state family student "
    "group country problem hand part place case week company system program question work "
    "government number night point home water room mother area money story fact month lot "
    "right study book eye job word business issue side kind head house service friend father "
    "power hour game line end member law car city community name president team minute idea "
    "kid body information back parent face others level office door health person art war "
    "history party result change morning reason research girl guy moment air teacher force "
    "education river garden window market music letter paper table mountain bridge train "
    "be have do say get make go know take see come think look want give use find tell ask "
    "seem feel try leave call keep let begin show hear play run move live believe hold bring "
    "happen write provide sit stand lose pay meet include continue set learn lead understand "
    "watch follow stop create speak read allow add spend grow open walk win offer remember "
    "good new first last long great little own other old big high different small large next "
    "early young important few public bad same able quiet green blue cold warm bright "
    "the of and to in for on with at by from up about into over after under between through "
    "during without again often never always still together"
).split()


class PromptBuilder:
    """Exact-length prompts in a model's tokens, from seeded text.

    tokenize(text, add_bos) -> ids. The same (seed, key) gives the same ids; different keys
    give unrelated text, so two prompts share no prefix beyond BOS unless built to.
    """

    def __init__(self, tokenize: Callable[[str, bool], list[int]], seed: int = 0):
        self._tokenize = tokenize
        self._seed = seed

    def text(self, n_words: int, key: str) -> str:
        rng = random.Random(f"ondevice-bench:{self._seed}:{key}")
        sentences, words = [], 0
        while words < n_words:
            k = rng.randint(6, 14)
            ws = [rng.choice(_WORDS) for _ in range(k)]
            if rng.random() < 0.3:
                ws.insert(rng.randint(1, k - 1), str(rng.randint(2, 9999)))
            sentences.append(" ".join(ws).capitalize() + rng.choice(".....?!;"))
            words += len(ws)
        return " ".join(sentences)

    def ids(self, n_tokens: int, key: str, *, add_bos: bool = True) -> list[int]:
        """Exactly n_tokens ids (BOS first when add_bos and the model uses one)."""
        if n_tokens <= 0:
            raise BenchError(f"prompt length {n_tokens}: must be positive")
        n_words = max(8, n_tokens)
        for _ in range(12):
            ids = list(self._tokenize(self.text(n_words, key), add_bos))
            if len(ids) >= n_tokens:
                return ids[:n_tokens]
            n_words *= 2
        raise BenchError(f"could not build a {n_tokens}-token prompt: the tokenizer returns too few tokens")
