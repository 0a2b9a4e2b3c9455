"""Widgets of the chat app: transcript, stats panel, charts."""

__all__: list[str] = []
