"""The `ondevice chat` terminal UI (Textual). Imported lazily by the CLI.

from ondevice.tui.app import ChatApp
ChatApp(engine_factory=lambda: ondevice.load(), ...).run()
"""

__all__: list[str] = []
