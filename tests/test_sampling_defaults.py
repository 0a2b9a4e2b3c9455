"""One home for the sampling defaults (engine.sampling.DEFAULTS): every door starts from it."""

from __future__ import annotations

import dataclasses
import inspect

from ondevice.tui.session import ChatSettings

from ondevice.bench.runner import DEFAULT_SAMPLING, BenchConfig
from ondevice.cli.main import build_parser
from ondevice.engine.engine import Engine
from ondevice.engine.sampling import CHAT_MAX_TOKENS, DEFAULTS, make_params

FIELDS = [f.name for f in dataclasses.fields(DEFAULTS)]


def test_the_defaults_are_valid_and_make_params_gives_them():
    assert make_params() == DEFAULTS
    assert make_params(**{name: getattr(DEFAULTS, name) for name in FIELDS}) == DEFAULTS
    assert (DEFAULTS.temperature, DEFAULTS.top_k, DEFAULTS.top_p, DEFAULTS.min_p) == (0.8, 40, 0.95, 0.05)


def test_engine_stream_defaults_are_the_engine_defaults():
    params = inspect.signature(Engine.stream).parameters
    assert {name: params[name].default for name in FIELDS} == dataclasses.asdict(DEFAULTS)


def test_cli_flags_default_to_the_engine_defaults():
    parser = build_parser()
    run = parser.parse_args(["run", "a prompt"])
    for name in ("max_tokens", "temperature", "top_k", "top_p", "min_p", "repeat_penalty", "seed", "ignore_eos"):
        assert getattr(run, name) == getattr(DEFAULTS, name), name
    chat = parser.parse_args(["chat"])
    assert (chat.temperature, chat.top_p, chat.max_tokens) == (DEFAULTS.temperature, DEFAULTS.top_p, CHAT_MAX_TOKENS)
    assert parser.parse_args(["bench"]).temperature == DEFAULTS.temperature


def test_bench_and_chat_app_start_from_the_engine_defaults():
    assert DEFAULT_SAMPLING == DEFAULTS.sampler_settings()
    assert set(DEFAULT_SAMPLING) == {"temperature", "top_k", "top_p", "min_p", "repeat_penalty"}
    cfg = BenchConfig(models=(None,), suite=None, scenarios=())  # type: ignore[arg-type]
    assert cfg.sampling == DEFAULT_SAMPLING and cfg.sampling is not DEFAULT_SAMPLING
    s = ChatSettings()
    assert (s.temperature, s.top_p, s.max_tokens) == (DEFAULTS.temperature, DEFAULTS.top_p, CHAT_MAX_TOKENS)
