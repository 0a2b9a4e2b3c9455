"""Settings: system prompt, temperature, top_p, max tokens. Dismisses with ChatSettings or None."""

from __future__ import annotations

from ondevice.tui.session import ChatSettings
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from ondevice.core.errors import InvalidParameterError

__all__ = ["SettingsScreen"]


class SettingsScreen(ModalScreen[ChatSettings | None]):
    BINDINGS = [Binding("escape", "dismiss_none", "Close"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, settings: ChatSettings):
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        s = self.settings
        with Vertical(id="settings-dialog", classes="dialog"):
            yield Label("System prompt (applies from the next message)")
            yield Input(s.system or "", placeholder="none", id="set-system", compact=True)
            with Horizontal(classes="settings-row"):
                yield Label("Temperature", classes="settings-label")
                yield Input(f"{s.temperature:g}", type="number", id="set-temperature", compact=True)
            with Horizontal(classes="settings-row"):
                yield Label("Top p", classes="settings-label")
                yield Input(f"{s.top_p:g}", type="number", id="set-top-p", compact=True)
            with Horizontal(classes="settings-row"):
                yield Label("Max tokens", classes="settings-label")
                yield Input(str(s.max_tokens), type="integer", id="set-max-tokens", compact=True)
            yield Static("", id="settings-error", markup=False)
            with Horizontal(id="settings-buttons"):
                yield Button("Save", variant="primary", id="settings-save", compact=True)
                yield Button("Cancel", id="settings-cancel", compact=True)

    def on_mount(self) -> None:
        self.query_one(Vertical).border_title = "Settings"
        self.query_one("#set-system", Input).focus()

    def read(self) -> ChatSettings:
        """The form's values, validated; raises InvalidParameterError naming the bad field."""

        def number(widget_id: str, name: str, kind: type) -> float:
            raw = self.query_one(widget_id, Input).value.strip()
            try:
                return kind(raw)
            except ValueError:
                raise InvalidParameterError(f"{name}: {raw!r} is not a number") from None

        return ChatSettings(
            system=self.query_one("#set-system", Input).value,
            temperature=number("#set-temperature", "temperature", float),
            top_p=number("#set-top-p", "top_p", float),
            max_tokens=number("#set-max-tokens", "max tokens", int),
            speculative=self.settings.speculative,  # set on the command line (`chat --speculative lookup`)
        ).validated()

    def action_save(self) -> None:
        try:
            settings = self.read()
        except InvalidParameterError as exc:
            self.query_one("#settings-error", Static).update(str(exc))
            return
        self.dismiss(settings)

    def action_dismiss_none(self) -> None:
        self.dismiss(None)

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.action_save()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "settings-save":
            self.action_save()
        else:
            self.dismiss(None)
