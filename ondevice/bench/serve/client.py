"""One streamed request to an OpenAI-compatible server, every chunk timestamped on arrival.

The standard library's http.client, one connection per request, one thread per request in
flight: a blocking read releases the GIL, so a chunk is stamped as soon as its reader runs,
and the load levels a single machine's server sustains (tens of requests in flight) need no
event loop. The request starts when the client opens the connection to send it
(time.perf_counter_ns(), the same clock as the in-process engine).

Nothing raises for a bad server: refused or unreachable addresses, HTTP errors, a body that is
not an SSE stream, malformed SSE, an error event mid-stream and a stream that stalls past its
deadline all come back as a StreamLog with status "failed" or "timeout" and the reason. The API
key goes only into the Authorization header; `Target.scrub` takes it out of any text kept.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from dataclasses import dataclass, field
from time import perf_counter_ns
from typing import Any
from urllib.parse import urlsplit

from ondevice.bench.runs import RunStatus
from ondevice.bench.serve.sse import MAX_LINE, StreamError, iter_events, parse_chunk
from ondevice.core.errors import BenchError
from ondevice.core.textclean import printable

__all__ = ["Target", "Chunk", "StreamLog", "stream_request", "get_json", "parse_base_url"]

CONNECT_S = 10.0  # at most this long to connect (less when the request's own timeout is shorter)
_BODY_SNIPPET = 300


def parse_base_url(url: str) -> tuple[str, str, int, str]:
    """'http://127.0.0.1:8000/v1' -> (scheme, host, port, '/v1'); BenchError on anything else."""
    try:
        parts = urlsplit(str(url).strip())
        port = parts.port
    except ValueError as exc:
        raise BenchError(f"--url {url!r}: {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise BenchError(f"--url {url!r}: expected http://HOST:PORT/v1 (or https://...)")
    if parts.query or parts.fragment:
        raise BenchError(f"--url {url!r}: give the API's base URL, without a query or fragment")
    path = parts.path.rstrip("/")
    for tail in ("/chat/completions", "/completions"):  # an endpoint given instead of the base
        if path.endswith(tail):
            path = path[: -len(tail)]
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80), path


@dataclass(frozen=True)
class Target:
    """Where requests go and how they are shaped."""

    url: str  # the API's base URL, e.g. http://127.0.0.1:8000/v1
    model: str | None = None  # the "model" field sent (None: not sent)
    chat: bool = False  # /chat/completions with a user message, else /completions with the prompt
    api_key: str | None = field(default=None, repr=False)  # never written anywhere
    timeout_s: float = 300.0  # per request, from send to the end of the stream

    def __post_init__(self) -> None:
        parse_base_url(self.url)
        if not self.timeout_s > 0:
            raise BenchError(f"--timeout {self.timeout_s}: must be a positive number of seconds")

    @property
    def path(self) -> str:
        """The endpoint's path, e.g. /v1/completions."""
        return parse_base_url(self.url)[3] + ("/chat/completions" if self.chat else "/completions")

    @property
    def endpoint(self) -> str:
        scheme, host, port, _ = parse_base_url(self.url)
        return f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}{self.path}"

    def headers(self) -> dict[str, str]:
        h = {"Content-Type": "application/json", "Accept": "text/event-stream", "User-Agent": "ondevice-bench"}
        if self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        return h

    def scrub(self, text: str) -> str:
        """Text with the API key, should a server echo it, replaced by ***."""
        return text.replace(self.api_key, "***") if self.api_key else text


@dataclass(frozen=True)
class Chunk:
    t_ns: int  # perf_counter_ns() at arrival
    text: str  # output text
    reasoning: str = ""  # reasoning text split out by the server


@dataclass
class StreamLog:
    """What the client saw of one request."""

    start_ns: int  # perf_counter_ns() when the request was sent (connection opened)
    end_ns: int = 0  # when the stream ended (or the request failed)
    chunks: list[Chunk] = field(default_factory=list)  # chunks that carried output or reasoning text
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    server_timings: dict[str, Any] | None = None
    http_status: int | None = None
    done: bool = False  # the [DONE] sentinel arrived
    status: RunStatus = "ok"  # "ok" | "failed" | "timeout"
    reason: str = ""


def _connection(target: Target, timeout: float) -> http.client.HTTPConnection:
    scheme, host, port, _ = parse_base_url(target.url)
    cls = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
    return cls(host, port, timeout=timeout)


def get_json(target: Target, path: str, timeout_s: float = 5.0) -> Any:
    """GET base_url + path (e.g. "/models") -> the JSON body; OSError/ValueError on failure (an answer that
    is not HTTP, e.g. a bad status line, is ValueError)."""
    conn = _connection(target, timeout_s)
    deadline = _Deadline(conn, timeout_s)  # a server trickling its answer a byte at a time is cut off too
    try:
        return _get_json(conn, deadline, target, path, timeout_s)
    except http.client.HTTPException as exc:
        raise ValueError(f"not an HTTP answer ({type(exc).__name__}: {printable(str(exc))[:100]})") from None
    finally:
        deadline.cancel()
        conn.close()


def _get_json(conn: http.client.HTTPConnection, deadline: _Deadline, target: Target, path: str, timeout_s: float):
    h = {k: v for k, v in target.headers().items() if k != "Content-Type"}
    conn.request("GET", parse_base_url(target.url)[3] + path, headers=h)
    deadline.hold(conn.sock)
    resp = conn.getresponse()
    body = resp.read(1 << 20)
    if deadline.fired.is_set():
        raise TimeoutError(f"no whole answer within {timeout_s:g} s")
    if resp.status >= 400:
        raise ValueError(f"HTTP {resp.status}")
    return json.loads(body)


def stream_request(target: Target, body: dict[str, Any]) -> StreamLog:
    """POST body (stream: true is set) and read the SSE stream to its end. Never raises but for
    KeyboardInterrupt; ends by target.timeout_s whatever the server does."""
    conn = _connection(target, min(CONNECT_S, target.timeout_s))
    log = StreamLog(start_ns=perf_counter_ns())
    deadline = _Deadline(conn, target.timeout_s)
    fired = deadline.fired
    try:
        payload = json.dumps(dict(body, stream=True)).encode()
        conn.request("POST", target.path, body=payload, headers=target.headers())
        deadline.hold(conn.sock)
        if conn.sock is not None:
            conn.sock.settimeout(target.timeout_s)
        resp = conn.getresponse()
        log.http_status = resp.status
        _read(resp, log)
    except StreamError as exc:
        log.status, log.reason = "failed", f"{exc.kind.replace('_', ' ')}: {exc}"
    except TimeoutError:
        log.status, log.reason = "timeout", ""
    except ConnectionRefusedError:
        log.status, log.reason = "failed", f"connection refused by {target.url}"
    except (OSError, http.client.HTTPException) as exc:
        log.status, log.reason = "failed", f"{type(exc).__name__}: {exc}"
    finally:
        deadline.cancel()
        conn.close()
        log.end_ns = perf_counter_ns()
    if fired.is_set() or log.status == "timeout":
        log.status = "timeout"
        log.reason = f"timeout after {target.timeout_s:g} s ({len(log.chunks)} chunks received)"
    log.reason = target.scrub(log.reason)
    return log


class _Deadline:
    """A whole request's deadline: when it passes, the socket is shut so a blocked read returns. The socket is held
    from the moment the request is sent: http.client lets go of it (conn.sock = None) once a response that ends with
    the connection has begun, while the response goes on reading from it."""

    def __init__(self, conn: http.client.HTTPConnection, timeout_s: float):
        self.fired = threading.Event()
        self._conn = conn
        self._sock: socket.socket | None = None
        self._timer = threading.Timer(timeout_s, self._cut)
        self._timer.daemon = True
        self._timer.start()

    def hold(self, sock: socket.socket | None) -> None:
        self._sock = sock

    def cancel(self) -> None:
        self._timer.cancel()

    def _cut(self) -> None:
        self.fired.set()
        sock = self._sock or self._conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def _read(resp: http.client.HTTPResponse, log: StreamLog) -> None:
    ctype = resp.getheader("Content-Type", "") or ""
    if resp.status >= 400:
        raise StreamError("http", f"HTTP {resp.status} {printable(resp.reason)}: {_snippet(resp)}")
    if "text/event-stream" not in ctype.lower():
        raise StreamError(
            "not_openai", f"not an SSE stream (HTTP {resp.status}, Content-Type {ctype or 'none'!r}): {_snippet(resp)}"
        )
    for event in iter_events(lambda: resp.readline(MAX_LINE + 1), perf_counter_ns):
        delta = parse_chunk(event)
        if delta.done:
            log.done = True
            break
        if delta.text or delta.reasoning:
            log.chunks.append(Chunk(event.t_ns, delta.text, delta.reasoning))
        log.finish_reason = delta.finish_reason or log.finish_reason
        log.usage = delta.usage or log.usage
        log.server_timings = delta.timings or log.server_timings
    if not log.done and log.finish_reason is None:
        raise StreamError(
            "malformed", f"the stream ended after {len(log.chunks)} chunks without a finish_reason or [DONE]"
        )
    if log.finish_reason is None:
        raise StreamError(
            "malformed",
            f"the stream ended after {len(log.chunks)} chunks without a finish_reason (cut off by the server?)",
        )


def _snippet(resp: http.client.HTTPResponse) -> str:
    try:
        body = resp.read(_BODY_SNIPPET + 1)
    except (OSError, http.client.HTTPException):
        return "(no body)"
    text = body.decode("utf-8", "replace").strip().replace("\n", " ")
    return repr(text[:_BODY_SNIPPET] + ("..." if len(text) > _BODY_SNIPPET else "")) if text else "(empty body)"
