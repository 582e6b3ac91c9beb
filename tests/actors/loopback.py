"""A small real HTTP server on 127.0.0.1 for the provider tests.

It serves queued replies in order and records every request it receives, so a test
asserts on what a provider really sent over the wire. It runs in its own thread (a
``ThreadingHTTPServer``), so it serves tests on asyncio and on trio alike, and sync
tests too. Use it as a context manager::

    with LoopbackServer() as server:
        server.queue(json_reply({...}), json_reply({...}, status=429))
        ... point a model at server.url ...
        assert server.requests[0].json()["messages"] == [...]

A request that finds no reply queued gets a 500 naming the problem (recorded too).
A reply may be delayed (for timeout tests); stopping the server cuts the delay short.

A streamed reply (``sse_reply``) sends server-sent events one by one with chunked
transfer encoding, ``gap`` seconds apart, then may hold the connection open
(``hang``) as a server still generating would. Between events the server watches
the connection: a client that goes away is seen at once and counted in
``disconnects``, and nothing more is sent to it.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["LoopbackServer", "Received", "Reply", "json_reply", "sse_reply", "text_reply"]

#: How long an idle keep-alive connection is held open by a handler thread.
_IDLE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class Reply:
    """One queued HTTP response."""

    status: int = 200
    body: bytes = b""
    headers: tuple[tuple[str, str], ...] = ()
    content_type: str = "application/json"
    #: Seconds to wait before answering (cut short when the server stops).
    delay: float = 0.0
    #: A streamed reply's events, each sent as it is (``sse_reply``), ``gap`` apart.
    events: tuple[bytes, ...] | None = None
    gap: float = 0.0
    #: Seconds a streamed reply holds the connection open after its last event.
    hang: float = 0.0
    #: Whether a streamed reply ends with the terminating chunk (False: cut off).
    complete: bool = True


def sse_reply(
    events: Iterable[Any],
    *,
    gap: float = 0.0,
    hang: float = 0.0,
    status: int = 200,
    done: bool = False,
    complete: bool = True,
) -> Reply:
    """A streamed reply: each of ``events`` is one server-sent event.

    An event is a dict (sent as ``data: <json>``), a ``(name, dict)`` pair (an
    ``event: name`` line first, as Anthropic's stream has), or bytes sent exactly as
    they are (garbage, comments). ``done`` adds OpenAI's ``data: [DONE]``; ``gap`` is
    the seconds before each event; ``hang`` holds the connection open afterwards;
    ``complete=False`` drops the connection without ending the body (a cut stream).
    """
    raw: list[bytes] = []
    for event in events:
        if isinstance(event, bytes):
            raw.append(event)
        elif isinstance(event, tuple):
            name, payload = event
            raw.append(f"event: {name}\ndata: {json.dumps(payload)}\n\n".encode())
        else:
            raw.append(f"data: {json.dumps(event)}\n\n".encode())
    if done:
        raw.append(b"data: [DONE]\n\n")
    return Reply(
        status=status,
        content_type="text/event-stream",
        events=tuple(raw),
        gap=gap,
        hang=hang,
        complete=complete,
    )


def json_reply(
    payload: Any,
    *,
    status: int = 200,
    headers: Iterable[tuple[str, str]] = (),
    delay: float = 0.0,
) -> Reply:
    """A reply whose body is ``payload`` as JSON."""
    return Reply(
        status=status,
        body=json.dumps(payload).encode(),
        headers=tuple(headers),
        delay=delay,
    )


def text_reply(body: str, *, status: int = 200, content_type: str = "application/json") -> Reply:
    """A reply with a body as it is (malformed JSON, an HTML error page...)."""
    return Reply(status=status, body=body.encode(), content_type=content_type)


@dataclass(frozen=True, slots=True)
class Received:
    """One request the server received."""

    method: str
    path: str
    #: Header names lowercased.
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class _State:
    replies: deque[Reply] = field(default_factory=deque)
    received: list[Received] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    #: Answers a request at once, before the queue, when it returns a reply: the
    #: checks a real server makes of what it is sent.
    refuse: Callable[[Received], Reply | None] | None = None
    #: When each client that went away in the middle of a streamed reply was seen
    #: to go (``time.monotonic()``).
    disconnects: list[float] = field(default_factory=list)


_NOTHING_QUEUED = Reply(
    status=500,
    body=json.dumps(
        {"error": {"message": "loopback server: no reply queued for this request"}}
    ).encode(),
)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = _IDLE_SECONDS
    # Headers and body go out in two writes: without this, Nagle's algorithm holds
    # the body until the client's delayed ACK (40 ms) on a kept-alive connection.
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:
        self._answer()

    def do_GET(self) -> None:
        self._answer()

    def _answer(self) -> None:
        state = self.server.state
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        received = Received(
            method=self.command,
            path=self.path,
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
        )
        with state.lock:
            state.received.append(received)
            refused = state.refuse(received) if state.refuse is not None else None
            if refused is not None:
                reply = refused
            else:
                reply = state.replies.popleft() if state.replies else _NOTHING_QUEUED
        if reply.delay and state.stopping.wait(reply.delay):
            self.close_connection = True
            return
        if reply.events is not None:
            self._stream(reply)
            return
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("content-length", str(len(reply.body)))
        for name, value in reply.headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(reply.body)

    def _stream(self, reply: Reply) -> None:
        """Send a streamed reply event by event, watching for the client to go."""
        self.close_connection = True
        self.send_response(reply.status)
        self.send_header("content-type", reply.content_type)
        self.send_header("transfer-encoding", "chunked")
        self.send_header("connection", "close")
        self.end_headers()
        self.wfile.flush()
        for event in reply.events or ():
            if self._client_gone(reply.gap):
                return
            try:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
                self.wfile.flush()
            except OSError:
                self._gone()
                return
        if reply.hang and self._client_gone(reply.hang):
            return
        if reply.complete:
            try:
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()
            except OSError:
                self._gone()

    def _client_gone(self, seconds: float) -> bool:
        """Wait ``seconds`` (cut short when the server stops); True as soon as the
        client has closed its end of the connection."""
        state = self.server.state
        connection: socket.socket = self.connection
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            readable, _, _ = select.select([connection], [], [], max(0.0, min(left, 0.05)))
            if readable:
                try:
                    peeked = connection.recv(1, socket.MSG_PEEK)
                except OSError:
                    peeked = b""
                if not peeked:
                    self._gone()
                    return True
            if state.stopping.is_set():
                return True
            if left <= 0:
                return False

    def _gone(self) -> None:
        state = self.server.state
        with state.lock:
            state.disconnects.append(time.monotonic())

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests assert on ``requests``."""


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, state: _State) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.state = state

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away (a timeout test) is no error of the server."""


class LoopbackServer:
    """A real HTTP server on 127.0.0.1 and an ephemeral port, in a thread."""

    def __init__(self) -> None:
        self._state = _State()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("the loopback server is not running: use it in a with block")
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT`` (append ``/v1`` for an OpenAI-compatible base URL)."""
        return f"http://127.0.0.1:{self.port}"

    def queue(self, *replies: Reply) -> None:
        """Serve these replies, in order, to the next requests."""
        with self._state.lock:
            self._state.replies.extend(replies)

    def refuse(self, check: Callable[[Received], Reply | None]) -> None:
        """Answer every request ``check`` returns a reply for with that reply, as a
        real server refuses what it cannot take (the queue is left as it is)."""
        with self._state.lock:
            self._state.refuse = check

    @property
    def requests(self) -> list[Received]:
        """Every request received so far, in order (a copy)."""
        with self._state.lock:
            return list(self._state.received)

    @property
    def disconnects(self) -> list[float]:
        """When each client that left in the middle of a streamed reply was seen to go
        (``time.monotonic()``), in order (a copy)."""
        with self._state.lock:
            return list(self._state.disconnects)

    def wait_disconnect(self, timeout: float = 5.0) -> float:
        """Block until a client has left a streamed reply; when it was seen to go."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            gone = self.disconnects
            if gone:
                return gone[0]
            time.sleep(0.005)
        raise AssertionError(f"no client left a streamed reply within {timeout} s")

    @property
    def pending(self) -> int:
        """How many queued replies no request has taken yet."""
        with self._state.lock:
            return len(self._state.replies)

    def __enter__(self) -> LoopbackServer:
        server = _Server(self._state)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"loopback-{self.port}",
            daemon=True,
        )
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._state.stopping.set()
        server, thread = self._server, self._thread
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)
