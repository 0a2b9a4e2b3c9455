"""Draw docs/img/chat.svg: the real chat (`ondevice chat` with its built-in instruct model) answering one question,
saved by Textual's own screenshot (the terminal's cells as SVG, not a drawing).

    python docs/make_chat_svg.py [--out docs/img/chat.svg]
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

QUESTION = "What is the capital of France?"


async def _draw(out: Path) -> None:
    from ondevice.tui.app import ChatApp
    from ondevice.tui.session import ChatSettings
    from ondevice.tui.widgets.transcript import AssistantMessage

    import ondevice
    from ondevice.cli.chat import CHAT_MODEL_SYSTEM
    from ondevice.models.materialize import resolve_chat_model

    path = resolve_chat_model()
    engine = ondevice.load(path, n_ctx=2048)
    settings = ChatSettings(system=CHAT_MODEL_SYSTEM, temperature=0.0, top_p=1.0, max_tokens=64)
    app = ChatApp(lambda: engine, settings=settings, model_label=path.name)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await _until(pilot, lambda: app.controller.session is not None, "the model did not load")
            app.chat_screen.query_one("#prompt").value = QUESTION
            await pilot.press("enter")
            answers = lambda: [m.text for m in app.chat_screen.query(AssistantMessage)]  # noqa: E731
            await _until(pilot, lambda: not app.controller.generating and any(answers()), "no answer came")
            await pilot.pause(0.5)  # the stats panel's last refresh
            app.save_screenshot(filename=out.name, path=str(out.parent))
    finally:
        engine.close()


async def _until(pilot, done, what: str, timeout_s: float = 300.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        if loop.time() > deadline:
            raise SystemExit(f"make_chat_svg: {what} within {timeout_s:.0f} s")
        await pilot.pause(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "img" / "chat.svg")
    out = ap.parse_args().out
    out.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(_draw(out))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
