"""llama.cpp's log, routed to `logging` (logger "ondevice.llama_cpp") and to listeners; never to the terminal."""

from __future__ import annotations

import _thread
import ctypes
import logging
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LOG_NAME", "route_llama_log", "log_listener", "raise_pending_interrupt"]

LOG_NAME = "ondevice.llama_cpp"
_log = logging.getLogger(LOG_NAME)
# ggml_log_level (ggml.h: NONE 0, DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 = continues the previous line)
_LEVELS = {0: logging.INFO, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}
_log_state: dict[str, Any] = {}  # keeps the C callback alive for the process (llama.cpp holds a raw pointer)
_log_lock = threading.Lock()  # two engines loading at once install one callback; guards _listeners
_listeners: list[Callable[[str], None]] = []  # log_listener callbacks, called with each raw fragment


def route_llama_log(lib: Any = None) -> None:
    """Send llama.cpp/ggml log lines to logging, and to the listeners (log_listener).

    One C callback per process (it must outlive every model: llama.cpp keeps a raw pointer),
    set again on every call, so that a callback installed by someone else since (llama-cpp-
    python installs its own on import) does not keep the lines from us.
    """
    if lib is None:
        import llama_cpp as lib
    with _log_lock:
        if "callback" not in _log_state:
            _log_state["callback"] = lib.llama_log_callback(_forward_log)
            _log.addHandler(logging.NullHandler())  # unconfigured logging: no last-resort printing to stderr
        lib.llama_log_set(_log_state["callback"], ctypes.c_void_p(0))


class log_listener:
    """Context manager: `fn(text)` gets every llama.cpp log fragment (raw, any thread) while inside."""

    def __init__(self, fn: Callable[[str], None]):
        self.fn = fn

    def __enter__(self) -> log_listener:
        route_llama_log()
        with _log_lock:
            _listeners.append(self.fn)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _log_lock:
            _listeners.remove(self.fn)


def _forward_log(level: int, text: bytes, _user: Any) -> None:
    """The C callback. An exception cannot cross back into C: ctypes prints and drops it. So a Ctrl-C that lands
    while llama.cpp is logging (it logs through a whole load) is kept: on the main thread it is raised by
    raise_pending_interrupt once the native call returns; on another thread it is sent to the main one."""
    try:
        _forward(level, text)
    except KeyboardInterrupt:
        if threading.current_thread() is threading.main_thread():
            _log_state["interrupt"] = True
        else:
            _thread.interrupt_main()
    except Exception:  # noqa: BLE001 - a listener's error must not end llama.cpp's call; logging says it
        _log.exception("a llama.cpp log listener failed")


def raise_pending_interrupt() -> None:
    """Raise the KeyboardInterrupt that landed in the log callback during the native call just made, if one did."""
    if _log_state.pop("interrupt", False):
        raise KeyboardInterrupt


def _forward(level: int, text: bytes) -> None:
    if level == 5:  # continuation: same level as the line it continues
        level = _log_state.get("last", 2)
    else:
        _log_state["last"] = level
    py_level = _LEVELS.get(level, logging.INFO)
    line = text.decode("utf-8", "replace") if text else ""
    if line.strip(" .\n") and _log.isEnabledFor(py_level):
        _log.log(py_level, "%s", line.rstrip("\n"))
    if _listeners:
        with _log_lock:
            listeners = list(_listeners)
        for listen in listeners:
            listen(line)
