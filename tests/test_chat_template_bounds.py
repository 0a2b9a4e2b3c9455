"""A GGUF's chat template is code from the file: its render is bounded in loop steps and in the size of what it
builds, so a hostile template is refused in a moment instead of taking seconds and gigabytes."""

from __future__ import annotations

import pytest
from jinja2.exceptions import SecurityError

from ondevice.llama.model import chat_formatter

PLAIN = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
HOSTILE = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "a huge string": "{{ 'x' * 1000000000 }}",
    "a huge list": "{{ ([1] * 1000000000) | length }}",
    "a huge power": "{{ 10 ** 100000000 }}",
    "a long output": "{% for i in range(900000) %}xxxxxxxxxx{% endfor %}",
}


def render(template: str) -> str:
    fmt = chat_formatter(template, bos_token="<s>", eos_token="</s>")
    return fmt(messages=[{"role": "user", "content": "Hi"}]).prompt


def test_a_plain_template_renders():
    assert render(PLAIN) == "<|user|>Hi\n<|assistant|>"


def test_loops_within_the_bound_render_and_the_budget_is_per_render():
    fmt = chat_formatter("{% for i in range(600000) %}{% endfor %}ok", bos_token="", eos_token="")
    for _ in range(3):  # 3 x 600,000 steps in all: over the bound if it were not reset per render
        assert fmt(messages=[]).prompt == "ok"


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_template_is_refused(case):
    with pytest.raises(SecurityError):
        render(HOSTILE[case])
