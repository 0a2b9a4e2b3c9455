"""Which llama.cpp build this process runs: llama-cpp-python's version and llama.cpp's system info."""

from __future__ import annotations

import hashlib
import re

__all__ = ["build_info", "build_id", "llama_cpp_version"]


def build_info() -> tuple[str | None, str | None]:
    """(llama-cpp-python version, llama_print_system_info() text); None parts when unavailable."""
    try:
        from importlib.metadata import version

        llama_version: str | None = version("llama_cpp_python")
    except Exception:  # noqa: BLE001 - not installed as a distribution: unknown
        llama_version = None
    try:
        import llama_cpp

        raw = llama_cpp.llama_print_system_info()
    except Exception:  # noqa: BLE001 - a broken build must not stop a report
        return llama_version, None
    return llama_version, raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def build_id(llama_version: str | None = None, system_info: str | None = None) -> str:
    """llama.cpp build fingerprint: package version + a hash of llama_print_system_info()."""
    if llama_version is None or system_info is None:
        llama_version, system_info = build_info()
    digest = hashlib.sha256((system_info or "").encode()).hexdigest()[:8]
    return f"{re.sub(r'[^A-Za-z0-9_.+]+', '_', llama_version or 'unknown')}.{digest}"


def llama_cpp_version() -> str | None:
    """llama.cpp's own version string (the binding's llama_version), when the binding has it."""
    try:
        import llama_cpp

        raw = llama_cpp.llama_cpp.llama_version()
    except Exception:  # noqa: BLE001 - an older binding without llama_version: the package version says enough
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)
