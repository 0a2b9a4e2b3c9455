"""The real engine, the tests' fake engines and the roofline's predictors satisfy the Protocols their
consumers rely on (ondevice.engine.interface): every member exists, and every method accepts what the
Protocol passes it. A fake that drifts from the engine fails here, not by silently testing nothing."""

from __future__ import annotations

import inspect
from typing import Any

import pytest

import ondevice
from ondevice.core.errors import InvalidParameterError
from ondevice.engine import Engine
from ondevice.engine.chat import Chat
from ondevice.engine.interface import (
    ChatEngine,
    ChatLike,
    Predictor,
    PredictsBatchCeiling,
    PredictsBatchStep,
    PredictsDecode,
    PredictsPrefill,
    PredictsTTFT,
    StreamingEngine,
)
from ondevice.roofline import Predictor as RooflinePredictor
from ondevice.roofline import TimedPredictor
from tests import bench_fakes, tui_fakes


def _members(protocol: type) -> dict[str, Any]:
    names = {n for n in vars(protocol) if not n.startswith("_")} | set(getattr(protocol, "__annotations__", {}))
    return {n: getattr(protocol, n, None) for n in names}


def mismatches(impl: Any, protocol: type) -> list[str]:
    """What `impl` (an instance or a class) lacks of `protocol`, one line per problem."""
    out = []
    for name, member in sorted(_members(protocol).items()):
        if not hasattr(impl, name) and name not in getattr(impl, "__annotations__", {}):
            out.append(f"{name}: missing")
            continue
        if not callable(member) or isinstance(member, property):
            continue
        want = inspect.signature(member)
        have = inspect.signature(getattr(impl, name))
        takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in have.parameters.values())
        for p in list(want.parameters.values())[1:]:  # after self
            if p.kind is p.VAR_KEYWORD:
                if not takes_kwargs:
                    out.append(f"{name}: takes no **kwargs")
            elif p.name not in have.parameters and not takes_kwargs:
                out.append(f"{name}: no parameter {p.name!r}")
    return out


def test_the_engine_satisfies_both_protocols(engine):
    assert isinstance(engine, Engine)
    assert mismatches(engine, StreamingEngine) == [] and isinstance(engine, StreamingEngine)
    assert mismatches(engine, ChatEngine) == [] and isinstance(engine, ChatEngine)
    chat = engine.chat()
    assert isinstance(chat, Chat) and mismatches(chat, ChatLike) == []


def test_the_bench_fake_is_a_streaming_engine():
    fake = bench_fakes.FakeEngine()
    assert mismatches(fake, StreamingEngine) == []
    assert isinstance(fake, StreamingEngine)


def test_the_chat_fake_is_a_chat_engine():
    fake = tui_fakes.FakeEngine()
    assert mismatches(fake, ChatEngine) == []
    assert isinstance(fake, ChatEngine)
    assert mismatches(fake.chat(), ChatLike) == []


def test_the_check_finds_a_drifted_fake():
    class Drifted:
        info = predictor = None

        def tokenize(self, text):  # lost add_bos/special
            return []

        def close(self):
            pass

    assert mismatches(Drifted(), StreamingEngine) == [
        "stream: missing",
        "tokenize: no parameter 'add_bos'",
        "tokenize: no parameter 'special'",
    ]
    with pytest.raises(AssertionError):
        assert isinstance(Drifted(), StreamingEngine)


PREDICTOR_PROTOCOLS = (
    Predictor,
    PredictsTTFT,
    PredictsPrefill,
    PredictsDecode,
    PredictsBatchStep,
    PredictsBatchCeiling,
)


@pytest.mark.parametrize("cls", [RooflinePredictor, TimedPredictor], ids=lambda c: c.__name__)
@pytest.mark.parametrize("protocol", PREDICTOR_PROTOCOLS, ids=lambda p: p.__name__)
def test_the_roofline_predictors_satisfy_every_predictor_protocol(cls, protocol):
    assert mismatches(cls, protocol) == []
    assert issubclass(cls, protocol)


def test_a_predictor_of_another_shape_is_caught():
    class StepOnly:
        def step_s(self, n_ctx):
            return 1.0, 1.0

    class Drifted:
        def step_s(self):  # lost n_ctx
            return 1.0, 1.0

    assert isinstance(StepOnly(), Predictor) and not isinstance(StepOnly(), PredictsTTFT)
    assert mismatches(Drifted(), Predictor) == ["step_s: no parameter 'n_ctx'"]
    assert mismatches(StepOnly(), PredictsBatchStep) == ["tokens_step_s: missing"]


@pytest.mark.parametrize("bad", ["fast", 3, object()], ids=["a-string", "a-number", "no-step_s"])
def test_load_refuses_what_is_not_a_predictor(tiny_model, bad):
    with pytest.raises(InvalidParameterError, match="predictor must be"):
        ondevice.load(tiny_model, n_ctx=256, n_threads=1, predictor=bad)
