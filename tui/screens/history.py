"""Ctrl+O: pick a saved conversation. Dismisses with its id, or None."""

from __future__ import annotations

import time
from collections.abc import Sequence

from ondevice.tui.store import ConversationSummary
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import OptionList, Static
from textual.widgets.option_list import Option

__all__ = ["HistoryScreen"]


def _when(t: float) -> str:
    return time.strftime("%m-%d %H:%M", time.localtime(t))


class HistoryScreen(ModalScreen[int | None]):
    BINDINGS = [Binding("escape", "close", "Close")]

    def __init__(self, conversations: Sequence[ConversationSummary]):
        super().__init__()
        self.conversations = list(conversations)

    def compose(self) -> ComposeResult:
        with Vertical(id="history-dialog", classes="dialog"):
            if self.conversations:
                options = [
                    Option(f"{_when(c.updated_at)}  {c.title or '(untitled)'}  · {c.n_messages} msg", id=str(c.id))
                    for c in self.conversations
                ]
                yield OptionList(*options, id="history-list")
            else:
                yield Static("No saved conversations yet.", markup=False)

    def on_mount(self) -> None:
        dialog = self.query_one(Vertical)
        dialog.border_title = "Saved conversations"
        dialog.border_subtitle = "Enter opens · Esc closes"

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(int(event.option.id))

    def action_close(self) -> None:
        self.dismiss(None)
