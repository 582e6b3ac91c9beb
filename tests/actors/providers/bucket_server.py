"""A loopback model server that enforces rate limits, for the tests of what servers say
of them (and, later, of a limiter that keeps under them).

``BucketServer`` is a real HTTP server on 127.0.0.1 in a thread (as
``tests/actors/loopback.py``'s, so it serves asyncio and trio tests alike) that
speaks two wire formats, chosen by the path:

- ``POST /v1/chat/completions``: OpenAI's chat completions (base URL ``url + "/v1"``),
  in one JSON body or, with ``"stream": true``, as server-sent events (a content
  chunk, a finish chunk, a usage chunk when ``stream_options.include_usage`` asks,
  ``data: [DONE]``).
- ``POST /v1/messages``: Anthropic's Messages API (base URL ``url``), in one body or
  streamed (``message_start`` ... ``message_stop``).

Every answer is ``reply`` (short text) with honest usage: the input counted from
the request's messages (and system text) at ``CHARS_PER_TOKEN`` characters a token,
the output ``output_tokens`` (at most the request's cap).

What it enforces, each over a sliding window of ``window`` seconds (a minute scaled
down to a second by default; a window is a bucket that gets back what was spent
one window after it was spent):

- ``requests``: requests admitted in any window;
- ``tokens``: tokens charged in any window. A request is charged up front its input
  plus its output cap (``max_tokens`` or ``max_completion_tokens``; ``output_tokens``
  when it sends none), as OpenAI documents, and settled to its real usage (input +
  output) once answered;
- ``concurrent``: requests in flight at once.

A request past a limit is answered at once with HTTP 429, the provider's 429 body
(OpenAI: ``rate_limit_exceeded`` whose message says "Please try again in 644ms.";
Anthropic: ``rate_limit_error``), ``retry-after`` (whole seconds, rounded up, as
both providers send it) and, for OpenAI, ``retry-after-ms`` (exact): when the
oldest charges that must go have left the window. A request charged more than the
whole token limit is refused with OpenAI's "Request too large" 429, without
``retry-after`` (waiting never helps). Every answer, 200 or 429, carries the rate
limit headers of its wire format with what remains after it: OpenAI's
``x-ratelimit-{limit,remaining,reset}-{requests,tokens}`` (resets as Go durations),
Anthropic's ``anthropic-ratelimit-{requests,tokens}-{limit,remaining,reset}``
(resets as RFC 3339 times; remaining tokens are not rounded to the thousand as
Anthropic's are). A reset is the time until the window holds nothing of what it
holds now.

``statistics()`` says what it saw: requests served, 429s sent, the peak number in
flight, the most requests and tokens charged in any window (never above a limit,
by construction), and the most tokens asked in any window counting the refused
requests too (above the limit exactly when the clients asked for more than the
bucket; 0 429s is the test of zero overshoot). ``arrivals()`` lists every request
with when it came and how it was answered (a test of a pause checks that none came
during it).
"""

from __future__ import annotations

import datetime
import json
import math
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

__all__ = ["Arrival", "BucketServer", "BucketStatistics"]

#: Characters a token, for the input the server counts.
CHARS_PER_TOKEN = 4
_IDLE_SECONDS = 5.0


@dataclass(frozen=True, slots=True)
class BucketStatistics:
    """What the server saw, at one moment."""

    served: int  # answered with a 200
    refused: int  # answered with a 429
    peak_concurrency: int  # the most requests in flight at once
    peak_requests: int  # the most requests admitted in any window
    peak_tokens: int  # the most tokens charged in any window (admitted requests)
    peak_tokens_asked: int  # the same, counting what refused requests asked too


@dataclass(frozen=True, slots=True)
class Arrival:
    """One request as the server took it."""

    at: float  # time.monotonic() when it came
    wire: str  # "openai" or "anthropic"
    status: int  # 200 or 429
    charged: int  # tokens charged up front (asked, when refused)
    why: str = ""  # for a 429: "requests", "tokens", "concurrent" or "too large"


@dataclass
class _Charge:
    at: float
    tokens: int


@dataclass
class _Bucket:
    """The server's state, under ``lock``."""

    requests: int | None
    tokens: int | None
    concurrent: int | None
    window: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    stopping: threading.Event = field(default_factory=threading.Event)
    charges: deque[_Charge] = field(default_factory=deque)
    asked: deque[tuple[float, int]] = field(default_factory=deque)
    in_flight: int = 0
    served: int = 0
    refused: int = 0
    peak_concurrency: int = 0
    peak_requests: int = 0
    peak_tokens: int = 0
    peak_tokens_asked: int = 0
    arrivals: list[Arrival] = field(default_factory=list)

    def _prune(self, now: float) -> None:
        edge = now - self.window
        while self.charges and self.charges[0].at <= edge:
            self.charges.popleft()
        while self.asked and self.asked[0][0] <= edge:
            self.asked.popleft()

    def _wait_for(self, now: float, over: int, tokens: bool) -> float:
        """Seconds until the oldest charges leaving the window free ``over`` more
        (requests, or ``tokens``)."""
        freed = 0
        for charge in self.charges:
            freed += charge.tokens if tokens else 1
            if freed >= over:
                return max(0.0, charge.at + self.window - now)
        return self.window  # pragma: no cover - only when one request is over the limit

    def admit(self, now: float, wire: str, charge: int) -> tuple[str, float, _Charge | None]:
        """Admit a request charged ``charge`` tokens, or say why not and how long to
        wait: (why, retry_after, the charge held)."""
        self._prune(now)
        self.asked.append((now, charge))
        asked = sum(tokens for _, tokens in self.asked)
        self.peak_tokens_asked = max(self.peak_tokens_asked, asked)
        used = sum(c.tokens for c in self.charges)
        why, wait = "", 0.0
        if self.tokens is not None and charge > self.tokens:
            why = "too large"
        elif self.concurrent is not None and self.in_flight >= self.concurrent:
            why, wait = "concurrent", 0.05
        elif self.requests is not None and len(self.charges) + 1 > self.requests:
            why = "requests"
            wait = self._wait_for(now, len(self.charges) + 1 - self.requests, tokens=False)
        elif self.tokens is not None and used + charge > self.tokens:
            why = "tokens"
            wait = self._wait_for(now, used + charge - self.tokens, tokens=True)
        if why:
            self.refused += 1
            self.arrivals.append(Arrival(now, wire, 429, charge, why))
            return why, wait, None
        held_charge = _Charge(now, charge)
        self.charges.append(held_charge)
        self.in_flight += 1
        self.peak_concurrency = max(self.peak_concurrency, self.in_flight)
        self.peak_requests = max(self.peak_requests, len(self.charges))
        self.peak_tokens = max(self.peak_tokens, used + charge)
        self.arrivals.append(Arrival(now, wire, 200, charge))
        return "", 0.0, held_charge

    def settle(self, held: _Charge, tokens: int) -> None:
        """A request answered: its charge becomes its real usage, and it is out of flight."""
        held.tokens = tokens
        self.in_flight -= 1
        self.served += 1

    def remaining(self, now: float) -> tuple[int | None, int | None, float, float]:
        """(requests left, tokens left, seconds until each window is empty)."""
        self._prune(now)
        reset = self.charges[-1].at + self.window - now if self.charges else 0.0
        requests = None if self.requests is None else max(0, self.requests - len(self.charges))
        tokens = (
            None
            if self.tokens is None
            else max(0, self.tokens - sum(c.tokens for c in self.charges))
        )
        return requests, tokens, max(0.0, reset), max(0.0, reset)


def _go_duration(seconds: float) -> str:
    """Seconds as OpenAI writes a reset (a Go duration): ``644ms``, ``1.5s``, ``6m0s``."""
    if seconds < 1:
        return f"{round(seconds * 1000)}ms"
    minutes, rest = divmod(seconds, 60)
    text = f"{rest:.3f}".rstrip("0").rstrip(".") + "s"
    return f"{int(minutes)}m{text}" if minutes else text


def _rfc3339(seconds_from_now: float) -> str:
    when = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)
    return when.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = _IDLE_SECONDS
    disable_nagle_algorithm = True
    server: _Server

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("content-length") or 0)
        body = json.loads(self.rfile.read(length) or b"{}")
        if self.path.endswith("/chat/completions"):
            wire = "openai"
        elif self.path.endswith("/messages"):
            wire = "anthropic"
        else:
            self._send(404, {"error": {"message": f"no such endpoint {self.path}"}}, [])
            return
        input_tokens = _count_input(body)
        cap = body.get("max_completion_tokens") or body.get("max_tokens")
        output = owner.output_tokens if cap is None else min(owner.output_tokens, int(cap))
        charge = input_tokens + (owner.output_tokens if cap is None else int(cap))
        bucket = owner.bucket
        with bucket.lock:
            now = time.monotonic()
            why, wait, held = bucket.admit(now, wire, charge)
            headers = self._limit_headers(wire, bucket.remaining(now))
        if held is None:
            self._refuse(wire, why, wait, charge, headers)
            return
        try:
            if owner.latency and bucket.stopping.wait(owner.latency):
                self.close_connection = True
                return
        finally:
            # Settled before the answer goes out: a client that has its answer never
            # sees the request still in flight or charged up front.
            with bucket.lock:
                bucket.settle(held, input_tokens + output)
        if body.get("stream"):
            self._stream(wire, body, input_tokens, output, headers)
        else:
            reply = _openai_reply if wire == "openai" else _anthropic_reply
            self._send(200, reply(owner.reply, input_tokens, output), headers)

    def _limit_headers(
        self, wire: str, remaining: tuple[int | None, int | None, float, float]
    ) -> list[tuple[str, str]]:
        bucket = self.server.owner.bucket
        requests, tokens, requests_reset, tokens_reset = remaining
        headers: list[tuple[str, str]] = []
        for name, limit, left, reset in (
            ("requests", bucket.requests, requests, requests_reset),
            ("tokens", bucket.tokens, tokens, tokens_reset),
        ):
            if limit is None:
                continue
            if wire == "openai":
                headers += [
                    (f"x-ratelimit-limit-{name}", str(limit)),
                    (f"x-ratelimit-remaining-{name}", str(left)),
                    (f"x-ratelimit-reset-{name}", _go_duration(reset)),
                ]
            else:
                headers += [
                    (f"anthropic-ratelimit-{name}-limit", str(limit)),
                    (f"anthropic-ratelimit-{name}-remaining", str(left)),
                    (f"anthropic-ratelimit-{name}-reset", _rfc3339(reset)),
                ]
        return headers

    def _refuse(
        self, wire: str, why: str, wait: float, charge: int, headers: list[tuple[str, str]]
    ) -> None:
        bucket = self.server.owner.bucket
        if why == "too large":
            message = (
                f"Request too large for test-model in organization org-bucket on tokens per "
                f"min (TPM): Limit {bucket.tokens}, Requested {charge}. The input or output "
                "tokens must be reduced in order to run successfully."
            )
        else:
            limit = {"requests": bucket.requests, "tokens": bucket.tokens}.get(why)
            unit = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}.get(
                why, "concurrent requests"
            )
            message = (
                f"Rate limit reached for test-model in organization org-bucket on {unit}: "
                f"Limit {limit if limit is not None else bucket.concurrent}, Requested "
                f"{charge if why == 'tokens' else 1}. Please try again in "
                f"{_go_duration(wait)}."
            )
            headers = [*headers, ("retry-after", str(math.ceil(wait)))]
            if wire == "openai":
                headers.append(("retry-after-ms", str(round(wait * 1000))))
        if wire == "openai":
            payload: dict[str, Any] = {
                "error": {
                    "message": message,
                    "type": why if why in ("requests", "tokens") else "requests",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
        else:
            payload = {
                "type": "error",
                "error": {"type": "rate_limit_error", "message": message},
                "request_id": "req_bucket",
            }
        self._send(429, payload, headers)

    def _send(self, status: int, payload: Any, headers: list[tuple[str, str]]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def _stream(
        self,
        wire: str,
        body: dict[str, Any],
        input_tokens: int,
        output: int,
        headers: list[tuple[str, str]],
    ) -> None:
        text = self.server.owner.reply
        if wire == "openai":
            usage = (body.get("stream_options") or {}).get("include_usage", False)
            events = _openai_events(text, input_tokens, output, usage=bool(usage))
        else:
            events = _anthropic_events(text, input_tokens, output)
        self.close_connection = True
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("transfer-encoding", "chunked")
        self.send_header("connection", "close")
        for name, value in headers:
            self.send_header(name, value)
        self.end_headers()
        try:
            for event in events:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(event), event))
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except OSError:
            return

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests read ``statistics()``."""


def _count_input(body: dict[str, Any]) -> int:
    """The input tokens of a request: its messages' (and system's) text, a token per
    ``CHARS_PER_TOKEN`` characters, and one per message."""
    chars = 0
    messages = body.get("messages") or []
    system = body.get("system")
    parts: list[Any] = [system] if system else []
    parts.extend(message.get("content") for message in messages)
    for part in parts:
        if isinstance(part, str):
            chars += len(part)
        elif isinstance(part, list):
            for block in part:
                if isinstance(block, dict):
                    chars += len(str(block.get("text") or block.get("content") or ""))
    return chars // CHARS_PER_TOKEN + len(messages) + 1


def _openai_reply(text: str, input_tokens: int, output: int) -> dict[str, Any]:
    return {
        "id": "chatcmpl-bucket",
        "object": "chat.completion",
        "created": 1,
        "model": "test-model",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": input_tokens,
            "completion_tokens": output,
            "total_tokens": input_tokens + output,
        },
    }


def _anthropic_reply(text: str, input_tokens: int, output: int) -> dict[str, Any]:
    return {
        "id": "msg_bucket",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": output},
    }


def _sse(payload: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(payload)}\n\n".encode()


def _openai_events(text: str, input_tokens: int, output: int, *, usage: bool) -> list[bytes]:
    chunk = {"id": "chatcmpl-bucket", "object": "chat.completion.chunk", "model": "test-model"}
    events = [
        _sse({**chunk, "choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]}),
        _sse({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
    ]
    if usage:
        counts = {
            "prompt_tokens": input_tokens,
            "completion_tokens": output,
            "total_tokens": input_tokens + output,
        }
        events.append(_sse({**chunk, "choices": [], "usage": counts}))
    events.append(b"data: [DONE]\n\n")
    return events


def _anthropic_events(text: str, input_tokens: int, output: int) -> list[bytes]:
    start = {
        "type": "message_start",
        "message": {
            "id": "msg_bucket",
            "type": "message",
            "role": "assistant",
            "model": "claude-test",
            "content": [],
            "stop_reason": None,
            "usage": {"input_tokens": input_tokens, "output_tokens": 1},
        },
    }
    return [
        _sse(start, "message_start"),
        _sse(
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
            "content_block_start",
        ),
        _sse(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": text},
            },
            "content_block_delta",
        ),
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": output},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, owner: BucketServer) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.owner = owner

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that went away is no error of the server."""


class BucketServer:
    """A rate-limited model server on 127.0.0.1, in a thread; use it in a ``with``.

    ``requests``, ``tokens`` and ``concurrent`` are the limits (None: none) over a
    sliding ``window`` of seconds; ``reply`` is every answer's text, ``output_tokens``
    its output usage (at most the request's cap); ``latency`` the seconds an admitted
    request is held before its answer (so that requests overlap).
    """

    def __init__(
        self,
        *,
        requests: int | None = None,
        tokens: int | None = None,
        concurrent: int | None = None,
        window: float = 1.0,
        reply: str = "ok",
        output_tokens: int = 5,
        latency: float = 0.0,
    ) -> None:
        for name, value in (("requests", requests), ("tokens", tokens), ("concurrent", concurrent)):
            if value is not None and value < 1:
                raise ValueError(f"bucket server: {name} must be at least 1 or None, got {value}")
        self.bucket = _Bucket(
            requests=requests, tokens=tokens, concurrent=concurrent, window=window
        )
        self.reply = reply
        self.output_tokens = output_tokens
        self.latency = latency
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``: Anthropic's base URL; OpenAI's is ``url + "/v1"``."""
        if self._server is None:
            raise RuntimeError("the bucket server is not running: use it in a with block")
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def base_url(self, wire: str) -> str:
        """The base URL of a model of the wire format ``wire`` ("openai", "anthropic")."""
        return f"{self.url}/v1" if wire == "openai" else self.url

    def statistics(self) -> BucketStatistics:
        bucket = self.bucket
        with bucket.lock:
            return BucketStatistics(
                served=bucket.served,
                refused=bucket.refused,
                peak_concurrency=bucket.peak_concurrency,
                peak_requests=bucket.peak_requests,
                peak_tokens=bucket.peak_tokens,
                peak_tokens_asked=bucket.peak_tokens_asked,
            )

    def arrivals(self) -> tuple[Arrival, ...]:
        """Every request so far, in the order taken."""
        with self.bucket.lock:
            return tuple(self.bucket.arrivals)

    def __enter__(self) -> BucketServer:
        server = _Server(self)
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.01},
            name=f"bucket-{server.server_address[1]}",
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
        self.bucket.stopping.set()
        server, thread = self._server, self._thread
        if server is not None:
            server.shutdown()
            server.server_close()
        if thread is not None:
            thread.join(timeout=5)
