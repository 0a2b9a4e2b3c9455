"""The chat's own model (the registry's default_chat, an instruct model) answers a question through the real TUI."""

from __future__ import annotations

import pytest
from ondevice.tui.app import ChatApp
from ondevice.tui.session import ChatSettings
from ondevice.tui.store import HistoryStore
from ondevice.tui.widgets.transcript import AssistantMessage

import ondevice
from ondevice.models.materialize import resolve_chat_model
from tests.tui_fakes import aio
from tests.tui_pilot import FIXED_MEMORY, close_when_idle, send, settle


@pytest.mark.default_model
@aio
async def test_the_chat_model_answers_in_the_tui(tmp_path):
    path = resolve_chat_model()  # what `ondevice chat` loads when given no model
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    eng = ondevice.load(path, n_ctx=1024)
    try:
        # greedy under the template's own default system prompt lists French landmarks instead (a 135M model);
        # a plain assistant system prompt gets the answer
        settings = ChatSettings(system="You are a helpful assistant.", temperature=0.0, top_p=1.0, max_tokens=24)
        store = HistoryStore(tmp_path / "h.sqlite3")
        app = ChatApp(lambda: eng, settings=settings, store=store, memory_reader=FIXED_MEMORY)
        async with app.run_test(size=(80, 24)) as pilot:
            await settle(pilot, app, timeout_s=60)
            await send(pilot, app, "What is the capital of France?", timeout_s=300)  # a busy 2-core box is slow
            answer = app.chat_screen.query_one(AssistantMessage)
            assert "Paris" in answer.text, answer.text
    finally:
        await close_when_idle(eng)


@pytest.mark.default_model
def test_the_chat_model_repeats_a_greedy_request_with_prefix_reuse():
    """The same greedy request twice in one engine: the second is served from the cache and gives the same text."""
    with ondevice.load(resolve_chat_model(), n_ctx=1024) as eng:
        prompt = "Once upon a time there was a lighthouse keeper who had nothing but"
        first = eng.generate(prompt, max_tokens=32, temperature=0, ignore_eos=True)
        again = eng.generate(prompt, max_tokens=32, temperature=0, ignore_eos=True)
        cold = eng.generate(prompt, max_tokens=32, temperature=0, ignore_eos=True, reuse_prefix=False)
        assert again.cached_prompt_tokens == again.prompt_tokens
        assert again.text == first.text == cold.text


def test_the_built_in_chat_model_gets_an_assistant_system_prompt_unless_told_otherwise():
    from ondevice.cli.chat import CHAT_MODEL_SYSTEM, system_prompt
    from ondevice.cli.main import build_parser

    parse = build_parser().parse_args
    assert system_prompt(parse(["chat"])) == CHAT_MODEL_SYSTEM
    assert system_prompt(parse(["chat", "--system", ""])) == ""
    assert system_prompt(parse(["chat", "--system", "Be terse."])) == "Be terse."
    assert system_prompt(parse(["chat", "some.gguf"])) is None  # another model: its own template's default
