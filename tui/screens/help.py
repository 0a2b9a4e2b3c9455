"""F1: the keys."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Static

__all__ = ["HelpScreen", "KEYS"]

KEYS = (
    ("Enter", "send the message (queued while an answer streams)"),
    ("Esc", "cancel the answer; the partial text stays, marked cancelled"),
    ("Ctrl+N", "new chat (clears the KV cache)"),
    ("F2", "settings: system prompt, temperature, top p, max tokens"),
    ("Ctrl+O", "open a saved conversation"),
    ("Ctrl+S", "save (export) this conversation as Markdown + JSON"),
    ("F1", "this help"),
    ("Ctrl+Q", "quit"),
)

_ABOUT = (
    "Right panel: TTFT, last inter-token gap (ITL), mean gap (TPOT) and decode tok/s, "
    "against the bandwidth ceiling and the calibrated prediction (run `ondevice probe` "
    "once to get them). In the ITL chart the green band marks the predicted step time; "
    "yellow bars were over 10% slower than predicted."
)


class HelpScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "close", "Close")]

    def compose(self) -> ComposeResult:
        width = max(len(k) for k, _ in KEYS)
        lines = [f"{key:<{width}}  {what}" for key, what in KEYS]
        with Vertical(id="help-dialog", classes="dialog"):
            yield Static("\n".join(lines), id="help-keys", markup=False)
            yield Static(_ABOUT, id="help-about", markup=False)

    def on_mount(self) -> None:
        self.query_one(Vertical).border_title = "Keys"
        self.query_one(Vertical).border_subtitle = "Esc closes"

    def action_close(self) -> None:
        self.dismiss(None)
