"""Screens of the chat app: main chat, settings, keys (help), history picker."""

__all__: list[str] = []
