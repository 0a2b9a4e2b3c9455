"""End to end on the real default model (Gemma 3 270M Q4_K_M): greedy facts, chat, prefix reuse."""

from __future__ import annotations

import pytest

from ondevice.engine import load

pytestmark = pytest.mark.default_model

LONG_SYSTEM = (
    "You are a geography tutor. You answer questions about countries, their capital cities, rivers, "
    "mountains and famous buildings. Keep every answer to one short sentence, give the plain fact first, "
    "and do not add lists, jokes or follow-up questions. When a question is ambiguous, answer the most "
    "common reading of it. Use the English names of places. "
) * 3


@pytest.fixture(scope="module")
def engine(default_model):
    eng = load(default_model, n_ctx=2048)
    yield eng
    eng.close()


def test_greedy_continuation_names_paris(engine):
    g = engine.generate("The Eiffel Tower is located in the city of", max_tokens=16, temperature=0)
    assert "Paris" in g.text
    assert g.timings.output_tokens == len(g.token_ids) >= 1
    assert engine.info.spec.arch == "gemma3" and engine.info.spec.quant == "Q4_K_M"


def test_chat_answers_paris(engine):
    chat = engine.chat(temperature=0, max_tokens=32)
    g = chat.send("What is the capital of France?")
    assert "Paris" in g.text
    assert chat.messages[-1]["role"] == "assistant" and "Paris" in chat.messages[-1]["content"]


def test_second_turn_reuses_the_whole_first_turn(engine):
    chat = engine.chat(system=LONG_SYSTEM, temperature=0, max_tokens=24)
    g1 = chat.send("What is the capital of France?")
    kv_after_first = engine.kv_cache_tokens
    assert kv_after_first == g1.prompt_tokens + len(g1.token_ids) - 1
    second = "And the capital of Italy?"
    ids2 = chat.prompt_tokens(second)  # what turn two prefills, rendered the same way
    g2 = chat.send(second)
    assert g2.prompt_tokens == len(ids2)
    assert g2.cached_prompt_tokens == kv_after_first
    assert g2.timings.prompt_tokens_computed == len(ids2) - kv_after_first
    cold = engine.generate(ids2, max_tokens=1, temperature=0, reuse_prefix=False)
    assert cold.cached_prompt_tokens == 0 and cold.timings.prompt_tokens_computed == len(ids2)
    # the cold prefill computes every token (> 200 here), the warm one only the new turn (~15); that
    # this makes the warm prefill faster is a timing verdict: benchmarks/prefix_reuse.py checks it
    assert cold.timings.prompt_tokens_computed > 200 and 10 * g2.timings.prompt_tokens_computed < len(ids2)


def test_stream_pieces_concatenate_to_text(engine):
    stream = engine.stream("Write one sentence about the sea:", max_tokens=24, temperature=0.7, seed=11)
    pieces = [ev.text for ev in stream]
    g = stream.generation
    assert "".join(pieces) == g.text and len(pieces) == len(g.token_ids)
    assert len(g.timings.itl_s) == len(pieces) - 1


def test_cli_run_default_model(capsys):
    from ondevice.cli.main import main

    rc = main(["run", "The Eiffel Tower is located in the city of", "-t", "0", "-n", "8", "-c", "512"])
    out, err = capsys.readouterr()
    assert rc == 0 and "Paris" in out and "TTFT" in err
