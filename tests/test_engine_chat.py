"""Chat: fallback transcript and a GGUF chat template, KV prefix reuse between turns, message bookkeeping."""

from __future__ import annotations

import threading

import pytest

from ondevice.engine import load
from ondevice.engine.chat import FALLBACK_STOPS, render_plain
from tests._engine_models import BOS, EOS, build_successor_model, token_id

SP = "\u2581"
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def reply_chain():
    # whatever the conversation, a prompt ending in ":" is answered " paris." then EOS
    return [token_id(":"), token_id(SP + "paris"), token_id("."), EOS]


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    path = build_successor_model(tmp_path_factory.mktemp("chat") / "plain.gguf", [reply_chain()])
    eng = load(path, n_ctx=256, n_threads=1)
    yield eng
    eng.close()


@pytest.fixture(scope="module")
def templated(tmp_path_factory):
    path = build_successor_model(tmp_path_factory.mktemp("chat") / "tmpl.gguf", [reply_chain()], chat_template=TEMPLATE)
    eng = load(path, n_ctx=256, n_threads=1)
    yield eng
    eng.close()


def test_render_plain():
    msgs = [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "Bye"},
    ]
    assert render_plain(msgs) == "Be terse.\n\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"
    assert FALLBACK_STOPS == ("\nUser:", "\nAssistant:")


def test_fallback_chat_and_prefix_reuse(plain):
    chat = plain.chat(system="Be terse.", temperature=0, max_tokens=16)
    assert chat.template_source == "fallback"
    g1 = chat.send("where is the tower?")
    assert g1.text == " paris." and g1.finish_reason == "stop" and g1.cached_prompt_tokens == 0
    kv1 = plain.kv_cache_tokens
    assert kv1 == g1.prompt_tokens + len(g1.token_ids) - 1  # the conversation so far, minus the undecoded EOS
    assert chat.messages == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "where is the tower?"},
        {"role": "assistant", "content": "paris."},
    ]
    g2 = chat.send("and the city?")
    assert g2.cached_prompt_tokens == kv1  # the whole first turn came from the cache
    assert g2.timings.prompt_tokens_computed == g2.prompt_tokens - kv1
    assert len(chat.messages) == 5


def test_template_chat(templated):
    chat = templated.chat(temperature=0, max_tokens=16)
    assert chat.template_source == "model"
    ids = chat.prompt_tokens("hi")
    assert ids[0] == BOS and ids[1] != BOS  # the template's own BOS, not a second one
    assert templated.detokenize(ids[1:]) == "user: hi\nassistant:"
    g1 = chat.send("hi")
    assert g1.text == " paris." and g1.finish_reason == "stop"
    g2 = chat.send("again")
    assert g2.cached_prompt_tokens >= g1.prompt_tokens
    assert [m["role"] for m in chat.messages] == ["user", "assistant", "user", "assistant"]


def test_stream_appends_reply_when_it_ends(plain):
    chat = plain.chat(temperature=0, max_tokens=16)
    stream = chat.stream("hello")
    assert chat.messages == [{"role": "user", "content": "hello"}]
    texts = [ev.text for ev in stream]
    assert chat.messages[-1] == {"role": "assistant", "content": "".join(texts).removeprefix(" ")}


def test_cancelled_turn_keeps_partial_reply(plain):
    chat = plain.chat(temperature=0, max_tokens=16)
    stream = chat.stream("hello")
    first = next(stream)
    t = threading.Thread(target=plain.cancel)
    t.start()
    t.join()
    assert list(stream) == []
    g = stream.generation
    assert g.finish_reason == "cancelled" and g.token_ids == (first.token_id,) and g.text == " paris"
    assert chat.messages[-1] == {"role": "assistant", "content": "paris"}
    assert chat.send("again").text == " paris."  # the chat and the engine carry on


def test_drop_oldest_turn_and_reset(plain):
    chat = plain.chat(system="sys", temperature=0, max_tokens=16)
    assert chat.drop_oldest_turn() is False
    chat.send("one")
    chat.send("two")
    assert chat.drop_oldest_turn() is True
    assert [m["content"] for m in chat.messages] == ["sys", "two", "paris."]
    chat.reset()
    assert chat.messages == [{"role": "system", "content": "sys"}]


def test_per_call_parameters_override_defaults(plain):
    chat = plain.chat(temperature=0, max_tokens=16)
    g = chat.send("x", max_tokens=1)
    assert len(g.token_ids) == 1 and g.finish_reason == "length"


def test_user_stop_strings_combine_with_the_fallback_stop(plain):
    chat = plain.chat(temperature=0, max_tokens=16, stop=["ris"])
    g = chat.send("x")
    assert g.text == " pa" and g.finish_reason == "stop"
