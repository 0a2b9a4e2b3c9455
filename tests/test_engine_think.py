"""The in-process engine's first *visible* token for a chat template that opens a think block:
a synthetic template, and a scripted token stream (a successor model whose greedy output is
"yes</think> paris." after the prompt)."""

from __future__ import annotations

import pytest

from ondevice.engine import load
from tests._engine_models import EOS, build_successor_model, byte_ids, token_id

SP = "\u2581"
THINK_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'].split('</think>')[-1] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:<think>\n{% endif %}"
)
REASONING = byte_ids("yes") + byte_ids("</think>")  # no byte twice: one successor each


@pytest.fixture(scope="module")
def thinker(tmp_path_factory):
    chain = [token_id("\n")] + REASONING + [token_id(SP + "paris"), token_id("."), EOS]
    path = build_successor_model(tmp_path_factory.mktemp("think") / "think.gguf", [chain], chat_template=THINK_TEMPLATE)
    eng = load(path, n_ctx=256, n_threads=1)
    yield eng
    eng.close()


def test_template_opening_a_think_block_times_the_first_visible_token(thinker):
    chat = thinker.chat(temperature=0, max_tokens=32)
    assert chat.prompt_tokens("hi")[-1] == token_id("\n")  # the generation prompt ends "<think>\n"
    markers, _ = thinker._template.think
    assert markers.open == "<think>" and markers.starts_open
    g = chat.send("hi")
    assert g.text == "yes</think> paris."
    t = g.timings
    first_visible = len(REASONING)  # the " paris" token
    expected = t.ttft_s + sum(t.itl_s[:first_visible])
    assert t.ttft_visible_s == pytest.approx(expected, abs=1e-6) and t.ttft_visible_s > t.ttft_s
    assert g.to_dict()["timings"]["ttft_visible_s"] == t.ttft_visible_s


def test_plain_generation_has_no_visible_time(thinker):
    g = thinker.generate([1, 5, 6], max_tokens=2, temperature=0)
    assert g.timings.ttft_visible_s is None
