"""The README and docs/: every relative link points at a file that exists, and the README's set-up commands are
the ones .ci/run runs."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def relative_links(doc: Path) -> list[str]:
    """The link targets in a Markdown file that are paths in the checkout (no URL, no in-page anchor)."""
    targets = [m.group(1) for m in LINK.finditer(doc.read_text())]
    return [t.split("#", 1)[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def setup_commands() -> list[str]:
    """The lines of the README's first ```sh block under its set-up heading."""
    text = (ROOT / "README.md").read_text()
    setup = text[text.index("## Set-up") :]
    block = re.search(r"```sh\n(.*?)```", setup, re.S)
    assert block, "the README's set-up section has no ```sh block"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def test_every_relative_link_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "benchmarks" / "README.md"]
    missing = [f"{d.relative_to(ROOT)} -> {t}" for d in docs for t in relative_links(d) if not (d.parent / t).exists()]
    assert missing == []


def test_link_finder_sees_a_broken_link(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text("[ok](x.md) [gone](nowhere.md#part) [web](https://example.org) [here](#top)")
    assert relative_links(doc) == ["x.md", "nowhere.md"]


def test_readme_setup_commands_are_the_ones_ci_runs():
    install, test = setup_commands()
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install.startswith('python -m pip install -e ".[model,test]"')
    assert 'python -m pip install -q -e ".[model,test]"' in ci  # the same install, quiet
    assert test in ci


def readme_commands() -> list[list[str]]:
    """Every `ondevice ...` line in the README's ```sh blocks, split as a shell would."""
    text = (ROOT / "README.md").read_text()
    lines = [line.strip() for block in re.findall(r"```sh\n(.*?)```", text, re.S) for line in block.splitlines()]
    commands = []
    for line in lines:
        for part in line.split("&&"):
            argv = shlex.split(part)
            if argv and argv[0] == "ondevice":
                commands.append(argv[1:])
    return commands


def test_every_command_the_readme_shows_is_one_the_cli_takes(capsys):
    from ondevice.cli.main import build_parser

    commands = readme_commands()
    assert {argv[0] for argv in commands} >= {"run", "chat", "bench", "predict"}
    parser = build_parser()
    for argv in commands:
        try:
            parser.parse_args(argv)
        except SystemExit:
            raise AssertionError(f"ondevice {shlex.join(argv)}: {capsys.readouterr().err}") from None


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160
