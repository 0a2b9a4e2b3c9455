"""A small OpenAI-compatible SSE server for the odd cases, on 127.0.0.1 only.

The base URL's first path segment picks the behaviour: http://127.0.0.1:PORT/<case>/v1.
Every response ends by itself (a stall sleeps at most STALL_S), so a test never waits on it.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STALL_S = 3.0
GAP_S = 0.01  # between chunks


def _chunk(text: str = "", finish: str | None = None, **extra: Any) -> dict:
    return {"object": "text_completion", "choices": [{"index": 0, "text": text, "finish_reason": finish}], **extra}


def _chat(
    content: str | None = None, reasoning: str | None = None, key: str = "reasoning_content", finish: str | None = None
) -> dict:
    delta: dict[str, Any] = {}
    if content is not None:
        delta["content"] = content
    if reasoning is not None:
        delta[key] = reasoning
    return {"object": "chat.completion.chunk", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def script(case: str, body: dict) -> list[Any]:
    """What the server sends for a case: dicts (data lines), raw strings, or ("sleep", s)."""
    n = int(body.get("max_tokens") or 4)
    if case == "multi":  # two or three tokens a chunk, usage only at the end
        out = [_chunk(" a b"), _chunk(" c d e"), _chunk(" f")]
        return (
            [{"object": "text_completion", "choices": [{"index": 0, "text": "", "role": "assistant"}]}]
            + out
            + [
                _chunk("", "length"),
                {"object": "text_completion", "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 6}},
            ]
        )
    if case == "one":  # one token a chunk, no usage
        return [_chunk(f" w{i}") for i in range(n)] + [_chunk("", "length")]
    if case == "timings":  # llama-server's own timings in the last chunk
        return [
            _chunk(" x y"),
            _chunk(" z", "length", timings={"prompt_n": 5, "prompt_ms": 20.0, "predicted_n": 3, "predicted_ms": 30.0}),
        ]
    if case == "reasoning":  # a server that splits reasoning out (chat)
        return [
            _chat(reasoning="Let me"),
            _chat(reasoning=" think.", key="reasoning"),
            _chat(content="\n\n"),
            _chat(content="Paris"),
            _chat(content=".", finish="stop"),
        ]
    if case == "think":  # reasoning inline, the block opened by the template (no <think> in the output)
        return [_chunk("hmm"), _chunk(" ok</think>"), _chunk("\n\n"), _chunk("Paris"), _chunk(".", "length")]
    if case == "error_mid":
        return [_chunk(" a"), _chunk(" b"), {"error": {"message": "the model crashed", "type": "server_error"}}]
    if case == "malformed":
        return [_chunk(" a"), "data: {not json\n\n"]
    if case == "cut":  # [DONE] without a finish_reason (llama-cpp-python's server when interrupted)
        return [_chunk(" a"), _chunk(" b")]
    if case == "stall":
        return [_chunk(" a"), ("sleep", STALL_S), _chunk(" b", "length")]
    raise KeyError(case)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        case = self.path.strip("/").split("/")[0]
        if self.path.endswith("/models") and case != "nomodels":
            self._json(200, {"object": "list", "data": [{"id": f"/models/fake-{case}.gguf", "object": "model"}]})
        else:
            self._json(404, {"error": {"message": "no such route"}})

    def do_POST(self) -> None:
        case = self.path.strip("/").split("/")[0]
        length = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        self.server.bodies.append((case, body, dict(self.headers)))
        if case == "http500":
            return self._json(500, {"error": {"message": "out of memory"}})
        if case == "auth":
            return self._json(401, {"error": {"message": f"bad key in {self.headers.get('Authorization')}"}})
        if case == "notsse":
            return self._json(
                200, {"object": "text_completion", "choices": [{"text": "hello", "finish_reason": "stop"}]}
            )
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(b": ping\n\n")
        try:
            for item in script(case, body):
                if isinstance(item, tuple):
                    time.sleep(item[1])
                    continue
                time.sleep(GAP_S)
                line = item if isinstance(item, str) else f"data: {json.dumps(item)}\n\n"
                self.wfile.write(line.encode())
                self.wfile.flush()
            if case != "malformed":
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
        except (BrokenPipeError, ConnectionResetError):  # the client gave up (a time-out)
            pass
        self.close_connection = True

    def _json(self, status: int, obj: Any) -> None:
        raw = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)


class FakeServer:
    """`with FakeServer() as s: s.url("multi")` -> http://127.0.0.1:PORT/multi/v1"""

    def __enter__(self) -> FakeServer:
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.httpd.daemon_threads = True
        self.httpd.bodies = []
        self.thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    @property
    def bodies(self) -> list:
        return self.httpd.bodies

    def url(self, case: str) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/{case}/v1"

    def __exit__(self, *exc: Any) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(5)


# ---- broken servers: raw sockets, for what no HTTP server library would send ----


def _send_forever(piece: bytes, every_s: float, head: bytes = b""):
    def behave(conn, stop):
        conn.sendall(head)
        while not stop.wait(every_s):
            conn.sendall(piece)

    return behave


SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n"
# what a broken server does after reading a request: never end it, end it wrongly, or never answer in HTTP
BROKEN = {
    "a byte every 0.5 s": _send_forever(b"d", 0.5, SSE_HEAD),
    "silent after the request": _send_forever(b"", 0.5),
    "headers trickled": _send_forever(b"X", 0.3, b"HTTP/1.1 200 OK\r\n"),
    "chunks as fast as it can": _send_forever(b'data: {"choices":[{"text":"x"}]}\n\n' * 64, 0.0, SSE_HEAD),
    "one line that never ends": _send_forever(b"x" * 4096, 0.001, SSE_HEAD + b"data: "),
    "random bytes": _send_forever(bytes(range(256)) * 16, 0.01),
    "cut in the status line": lambda conn, stop: conn.sendall(b"HTTP/1.1 2"),
    "a body longer than it says": _send_forever(b" ", 0.05, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n[]"),
}


def broken_server(behave):
    """A loopback server where each connection, once its request is read, gets `behave(conn, stop)`;
    (listener, stop event): set the event and close the listener to end it."""
    stop = threading.Event()
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()

    def answer(conn):
        with conn:
            try:
                conn.recv(65536)
                behave(conn, stop)
            except OSError:
                pass

    def accept():
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            threading.Thread(target=answer, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener, stop
