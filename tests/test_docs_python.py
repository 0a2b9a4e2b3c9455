"""docs/python.md's examples run: every ```python block of the page, in order and in one namespace, against
a tiny synthetic model saved as model.gguf in a scratch folder. An example that no longer matches the API
fails here."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "python.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, re.S)


def test_the_page_has_examples_for_each_door():
    code = "\n".join(python_blocks(DOC.read_text()))
    for call in ("ondevice.load(", ".generate(", ".stream(", ".chat(", "ondevice.inspect(", "ondevice.predict("):
        assert call in code, call


def test_every_example_runs(tiny_model, tmp_path, monkeypatch):
    shutil.copy(tiny_model, tmp_path / "model.gguf")
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    out = io.StringIO()
    for i, block in enumerate(python_blocks(DOC.read_text())):
        with contextlib.redirect_stdout(out):
            exec(compile(block, f"docs/python.md block {i + 1}", "exec"), namespace)
    assert namespace["g"].finish_reason in ("stop", "length")
    assert len(namespace["chat"].messages) == 5
    assert namespace["eng"]._closed and (tmp_path / "state.bin").is_file()
