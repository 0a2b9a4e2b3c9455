"""Server-sent events from OpenAI-compatible streams: lines -> events -> chunk deltas (pure).

Events follow the SSE rules: `data:` lines (one optional space after the colon) joined by
newlines, dispatched at a blank line (or at the end of the stream), `event:` naming the type,
lines starting with ":" being comments (keep-alive pings). Each event's time is the moment its
first data line was read, so a chunk's timestamp is its arrival, not its parsing.

A chunk's delta: output text (`choices[0].text` for completions, `choices[0].delta.content` for
chat), reasoning text (`delta.reasoning_content` or `delta.reasoning`, from servers that split
it), finish_reason, usage (`stream_options.include_usage`), and the server's own timings
(llama-server's `timings`, Ollama's `eval_count`/`eval_duration`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from ondevice.core.textclean import printable

__all__ = ["Event", "Delta", "StreamError", "iter_events", "parse_chunk", "server_timings"]

MAX_LINE = 1 << 20  # a longer line is malformed


class StreamError(Exception):
    """The stream broke the protocol or reported an error; `kind` says which."""

    def __init__(self, kind: str, message: str):
        super().__init__(message)
        self.kind = kind  # "malformed" | "server_error" | "not_openai"


@dataclass(frozen=True)
class Event:
    t_ns: int  # clock reading when the event's first data line arrived
    type: str  # the `event:` field ("message" when absent)
    data: str  # data lines joined by "\n"


@dataclass(frozen=True)
class Delta:
    text: str = ""  # output text of the chunk
    reasoning: str = ""  # reasoning text the server split out of the output
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None  # {"prompt_tokens", "completion_tokens", ...} when sent
    timings: dict[str, Any] | None = None  # server_timings() of the chunk, when it carries any
    done: bool = False  # the "[DONE]" sentinel


def iter_events(readline: Callable[[], bytes], clock: Callable[[], int]) -> Iterator[Event]:
    """Events from a byte-line reader (b"" at the end of the stream)."""
    data: list[str] = []
    etype, t0 = "message", 0
    while True:
        raw = readline()
        if not raw:
            break
        if len(raw) > MAX_LINE:
            raise StreamError("malformed", f"an SSE line longer than {MAX_LINE} bytes")
        line = raw.decode("utf-8", "replace").rstrip("\r\n")
        if not line:
            if data:
                yield Event(t0, etype, "\n".join(data))
            data, etype = [], "message"
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if field == "data":
            if not data:
                t0 = clock()
            data.append(value)
        elif field == "event":
            etype = value or "message"
        elif field not in ("id", "retry"):
            raise StreamError("malformed", f"not an SSE line: {_short(line)}")
    if data:  # a last event without its blank line
        yield Event(t0, etype, "\n".join(data))


def parse_chunk(event: Event) -> Delta:
    """One event's delta; StreamError for an error event, bad JSON or a non-OpenAI chunk."""
    if event.data.strip() == "[DONE]":
        return Delta(done=True)
    try:
        obj = json.loads(event.data)
    except ValueError:
        raise StreamError("malformed", f"a data line that is not JSON: {_short(event.data)}") from None
    if event.type == "error" or (isinstance(obj, dict) and obj.get("error")):
        raise StreamError("server_error", f"error in the stream: {_error_text(obj)}")
    if not isinstance(obj, dict):
        raise StreamError("not_openai", f"not an OpenAI-compatible chunk: {_short(event.data)}")
    choices = obj.get("choices")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    timings = server_timings(obj)
    if not isinstance(choices, list) or (not choices and usage is None and timings is None):
        if usage is None and timings is None:
            raise StreamError("not_openai", f"not an OpenAI-compatible chunk (no choices): {_short(event.data)}")
        choices = []
    text, reasoning, finish = "", "", None
    if choices and isinstance(choices[0], dict):
        c = choices[0]
        delta = c.get("delta")
        if not isinstance(delta, dict):
            delta = {}
        text = _str(c.get("text")) + _str(delta.get("content"))
        reasoning = _str(delta.get("reasoning_content")) or _str(delta.get("reasoning"))
        finish = c.get("finish_reason") if isinstance(c.get("finish_reason"), str) else None
    return Delta(text, reasoning, finish, usage, timings)


def server_timings(obj: dict[str, Any]) -> dict[str, Any] | None:
    """The server's own counts and durations, normalised: tokens and seconds. StreamError
    ("malformed") for a count or duration that is negative, NaN, infinite or absurdly large
    (JSON's 1e400 parses as inf): that request fails, labelled, and the bench goes on."""
    t = obj.get("timings")
    if isinstance(t, dict) and _is_number(t.get("predicted_n")):
        return {
            "source": "llama-server timings",
            "output_tokens": _int("predicted_n", t["predicted_n"]),
            "decode_s": _num("predicted_ms", t.get("predicted_ms"), 1e-3),
            "prompt_tokens": _int("prompt_n", t.get("prompt_n")),
            "prompt_s": _num("prompt_ms", t.get("prompt_ms"), 1e-3),
        }
    if _is_number(obj.get("eval_count")):
        return {
            "source": "ollama eval counts",
            "output_tokens": _int("eval_count", obj["eval_count"]),
            "decode_s": _num("eval_duration", obj.get("eval_duration"), 1e-9),
            "prompt_tokens": _int("prompt_eval_count", obj.get("prompt_eval_count")),
            "prompt_s": _num("prompt_eval_duration", obj.get("prompt_eval_duration"), 1e-9),
        }
    return None


_MAX_SERVER_NUMBER = 1e15  # tokens, ms or ns: far above any real request, far below overflow


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _checked(name: str, v: Any) -> float | None:
    if not _is_number(v):
        return None
    if not (math.isfinite(v) and 0 <= v <= _MAX_SERVER_NUMBER):
        raise StreamError("malformed", f"server timing {name} = {_short(str(v), 40)} is not a count or duration")
    return float(v)


def _num(name: str, v: Any, scale: float) -> float | None:
    value = _checked(name, v)
    return None if value is None else value * scale


def _int(name: str, v: Any) -> int | None:
    value = _checked(name, v)
    return None if value is None else int(value)


def _str(v: Any) -> str:
    return v if isinstance(v, str) else ""


def _error_text(obj: Any) -> str:
    """The server's error message, control characters removed: it reaches the terminal in the table."""
    err = obj.get("error") if isinstance(obj, dict) else obj
    if isinstance(err, dict):
        return printable(str(err.get("message") or err.get("type") or err)[:300])
    return printable(str(err)[:300])


def _short(text: str, n: int = 120) -> str:
    text = text.replace("\n", "\\n")
    return repr(text[:n] + ("..." if len(text) > n else ""))
