"""Secrets are never recorded: a canary key that servers echo back, and credentials in a
base URL, appear nowhere fractor keeps or prints.

A real HTTP server on 127.0.0.1 answers 401, 403, 429, 500 and garbage, each with the
key written into its body (some servers do). The agent runs with a SQLite store, an
event subscription and captured logs; then the error texts, results, conversations,
traces, events, logs, the store's file, the model's repr and the CLI-style usage
report are scanned for the canary and the URL's password.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import httpx2
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from structlog.testing import capture_logs

from fractor.actors import (
    Agent,
    ModelRequest,
    ModelResponse,
    ProviderError,
    RetryPolicy,
    UserMessage,
)
from fractor.actors.integrations import otel
from fractor.runtime import Event, Runtime, SQLiteStore

from ..loopback import LoopbackServer, Reply, json_reply, sse_reply, text_reply
from .wires import Wire, stream_opening

CANARY = "sk-canary-5f3a9e1c7b2d48e6"
PASSWORD = "hunter2-canary-pw"


def echoes(status: int, wire: Wire) -> list[object]:
    """Error bodies that repeat the key, in the provider's shape and as plain text."""
    said = f"Incorrect API key provided: {CANARY}. Your key {CANARY} is not valid."
    if wire.provider == "openai":
        shaped: object = {"error": {"message": said, "type": "invalid", "code": str(status)}}
    else:
        shaped = {"type": "error", "error": {"type": "api_error", "message": said}}
    return [shaped, f"<html>{said}</html>"]


@pytest.mark.parametrize("status", [401, 403, 429, 500, 200])
async def test_a_key_echoed_by_the_server_is_recorded_nowhere(
    wire: Wire,
    server: LoopbackServer,
    tmp_path: Path,
    status: int,
) -> None:
    for body in echoes(status, wire):
        if status == 200:  # garbage with a 200: a malformed reply that names the key
            server.queue(text_reply(f"{{not json {CANARY}", status=200))
        elif isinstance(body, str):
            server.queue(text_reply(body, status=status, content_type="text/html"))
        else:
            server.queue(json_reply(body, status=status))
    root = server.url.replace("http://", f"http://user:{PASSWORD}@")
    model = wire.model_class(wire.model_name, api_key=CANARY, base_url=wire.base_url(root))
    db = tmp_path / "agents.db"
    events: list[Event] = []
    seen: list[str] = [repr(model)]
    with capture_logs() as logs:
        async with model, SQLiteStore(db) as store:
            async with Runtime(store=store, log_events=True) as rt, rt.events() as subscription:
                agent = Agent("support", model, retry=RetryPolicy(retries=1, initial_delay=0))
                ref = await rt.spawn(agent, id="support")
                result = await ref.ask("hello")
                conversation = await ref.conversation()
                traces = await ref.trace()
                while (event := subscription.receive_nowait()) is not None:
                    events.append(event)
            try:
                await model.request(_request())
            except ProviderError as exc:
                seen += [str(exc), repr(exc), exc.what, exc.advice]
    assert result.status == "failed"
    assert "ProviderError" in result.stop_reason
    seen += [result.text, result.stop_reason, repr(result)]
    seen += [json.dumps(conversation.messages, default=repr), repr(conversation)]
    seen += [repr(trace) for trace in traces]
    seen += [repr(event) for event in events]
    seen += [repr(entry) for entry in logs]
    stored = _bytes_of(tmp_path)
    assert events  # the events and logs really were recorded, and hold the error
    assert any("ProviderError" in repr(event) or "failed" in repr(event) for event in events)
    everything = "\n".join(seen)
    assert "[redacted]" in everything  # what was echoed was taken out, not dropped silently
    for secret in (CANARY, PASSWORD):
        assert secret not in everything
        assert secret.encode() not in stored


def _bytes_of(folder: Path) -> bytes:
    """Everything the store wrote: the database file and its write-ahead log."""
    return b"".join(path.read_bytes() for path in sorted(folder.glob("agents.db*")))


def _request() -> ModelRequest:
    return ModelRequest(messages=(UserMessage(content="x"),))


async def test_a_failure_of_any_kind_carries_no_secret_nor_the_exception_behind_it(
    wire: Wire, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error the SDK raises (here a 401 echoing the key), one from below it (a
    library that puts the key in its message) and a reply the parser chokes on: each
    is a ProviderError without the key, with no ``__cause__`` or ``__context__``
    that would keep the original text (a logger or an error tracker reads those)."""
    server.queue(json_reply({"error": {"message": f"bad key {CANARY}"}}, status=401))
    model = wire.model_class(wire.model_name, api_key=CANARY, base_url=wire.base_url(server.url))
    failures: list[ProviderError] = []
    async with model:
        with pytest.raises(ProviderError) as caught:
            await model.request(_request())
        failures.append(caught.value)

        async def below(client: object, request: ModelRequest) -> tuple[int, bytes, dict[str, str]]:
            raise ValueError(f"Illegal header value b'Bearer {CANARY}'")

        monkeypatch.setattr(model, "send", below)
        with pytest.raises(ProviderError, match=r"the request failed \(ValueError") as caught:
            await model.request(_request())
        failures.append(caught.value)

        async def answered(
            client: object, request: ModelRequest
        ) -> tuple[int, bytes, dict[str, str]]:
            return 200, b"{}", {}

        def choke(status: int, body: bytes, request: ModelRequest) -> ModelResponse:
            raise KeyError(f"choices (key {CANARY})")

        monkeypatch.setattr(model, "send", answered)
        monkeypatch.setattr(model, "parse", choke)
        with pytest.raises(ProviderError, match="could not be read: KeyError") as caught:
            await model.request(_request())
        failures.append(caught.value)
    for failure in failures:
        assert CANARY not in f"{failure} {failure!r}"
        assert "[redacted]" in str(failure)
        assert failure.__cause__ is None
        assert failure.__context__ is None


# -- a key echoed in a message long enough to be clipped ------------------------------

#: A key as long as real ones (34 characters), none of whose 6-character pieces is
#: ordinary text: a piece of it found anywhere is a leak.
LONG_KEY = "sk-Zq7Vw3Lp9Xk2Jm8Rt4Hn6Bc1Df5Gy0"


def echoing(attempt: int) -> str:
    """A message that repeats the key back to back, long past any clipping: wherever
    a cut falls it lands inside one copy. The two attempts' messages are shifted by
    half a key, so in one of them the cut leaves at least 6 characters of a copy."""
    return "x" * (17 * (attempt % 2)) + LONG_KEY * 12


def pieces_of_secrets(text: str, secrets: tuple[str, ...] = (LONG_KEY, PASSWORD)) -> list[str]:
    """Every 6-character piece of a secret that ``text`` holds."""
    return [
        secret[i : i + 6]
        for secret in secrets
        for i in range(len(secret) - 5)
        if secret[i : i + 6] in text
    ]


def _error_event(wire: Wire, said: str) -> Any:
    if wire.provider == "openai":
        return {"error": {"message": said, "type": "server_error", "code": 500}}
    return ("error", {"type": "error", "error": {"type": "overloaded_error", "message": said}})


def _http_error(wire: Wire, said: str) -> Reply:
    if wire.provider == "openai":
        body: object = {"error": {"message": said, "type": "server_error", "code": "server_error"}}
    else:
        body = {"type": "error", "error": {"type": "api_error", "message": said}}
    return json_reply(body, status=500)


class _Failing(httpx2.AsyncBaseTransport):
    """A transport whose failures name the key and the base URL with its credentials,
    as an exception from below the SDK may: the connection fails (a request), or the
    body breaks after the stream's first events (a streamed one)."""

    def __init__(self, wire: Wire, root: str, *, streamed: bool) -> None:
        self.wire, self.root, self.streamed = wire, root, streamed
        self.attempts = 0

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        said = f"{echoing(self.attempts)} at {self.root} " * 3
        self.attempts += 1
        if not self.streamed:
            raise httpx2.ConnectError(said, request=request)
        head = b"".join(sse_reply(stream_opening(self.wire)).events or ())
        return httpx2.Response(
            200,
            headers={"content-type": "text/event-stream"},
            stream=_Breaking(head, httpx2.ReadError(said, request=request)),
            request=request,
        )


class _Breaking(httpx2.AsyncByteStream):
    def __init__(self, head: bytes, error: Exception) -> None:
        self.head, self.error = head, error

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self.head
        raise self.error


#: Where a long message echoing the key comes from, and whether the request is streamed.
_ECHOES = [
    ("http-error-body", False),
    ("http-error-body", True),
    ("error-event-in-stream", True),
    ("garbage-chunk-in-stream", True),
    ("transport-exception", False),
    ("transport-exception", True),
]


@pytest.mark.parametrize(("source", "streamed"), _ECHOES)
async def test_no_piece_of_a_key_echoed_in_a_long_message_is_recorded(
    wire: Wire, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch, source: str, streamed: bool
) -> None:
    """A message long enough to be clipped, repeating the key: the key is taken out
    before the clipping, so no piece of it (6 characters or more) is left at the cut,
    in the stop reason, the execution trace, the events, the logs or the OpenTelemetry
    spans of an agent whose retried request failed that way twice."""
    root = server.url.replace("http://", f"http://user:{PASSWORD}@")
    for attempt in range(2):
        said = echoing(attempt)
        if source == "http-error-body":
            server.queue(_http_error(wire, said))
        elif source == "error-event-in-stream":
            server.queue(sse_reply([*stream_opening(wire), _error_event(wire, said)]))
        elif source == "garbage-chunk-in-stream":
            server.queue(
                sse_reply([*stream_opening(wire), f"data: {{not json {said}\n\n".encode()])
            )
    model = wire.model_class(
        wire.model_name, api_key=LONG_KEY, base_url=wire.base_url(root), stream=streamed
    )
    if source == "transport-exception":
        failing = _Failing(wire, root, streamed=streamed)
        create_client = model.create_client

        def through_failing(sdk: ModuleType) -> Any:
            client = create_client(sdk)
            client._client._transport = failing
            return client

        monkeypatch.setattr(model, "create_client", through_failing)
    exporter = InMemorySpanExporter()
    spans = TracerProvider()
    spans.add_span_processor(SimpleSpanProcessor(exporter))
    events: list[Event] = []
    with capture_logs() as logs, anyio.fail_after(10):
        async with model, Runtime(log_events=True) as rt, rt.events() as subscription:
            with otel.instrument(rt, tracer_provider=spans):
                agent = Agent("support", model, retry=RetryPolicy(retries=1, initial_delay=0))
                ref = await rt.spawn(agent)
                result = await ref.ask("hello")
                traces = await ref.trace()
            while (event := subscription.receive_nowait()) is not None:
                events.append(event)
    assert result.status == "failed"
    assert "ProviderError" in result.stop_reason
    assert len(events) > 2
    assert len(exporter.get_finished_spans()) > 2
    recorded = [result.stop_reason, result.text, repr(result)]
    recorded += [repr(trace) for trace in traces]
    recorded += [repr(event) for event in events]
    recorded += [repr(entry) for entry in logs]
    recorded += [
        repr((span.name, span.attributes, span.status.description))
        + repr([(event.name, event.attributes) for event in span.events])
        for span in exporter.get_finished_spans()
    ]
    everything = "\n".join(recorded)
    if (source, wire.provider) != ("garbage-chunk-in-stream", "anthropic"):  # names no data
        assert "[redacted]" in everything  # what was echoed was taken out, not dropped
    found = pieces_of_secrets(everything)
    at = everything.find(found[0]) if found else 0
    assert found == [], everything[max(0, at - 200) : at + 40]


async def test_the_base_url_a_model_shows_carries_no_credentials(
    wire: Wire, server: LoopbackServer
) -> None:
    """``model.base_url`` is read by whoever prints or logs where a model sends: it
    shows the URL with its credentials redacted, as ``repr`` and the errors do, before
    the first request and after it (when the SDK's client holds the URL)."""
    server.queue(json_reply(wire.reply("hi")))
    root = server.url.replace("http://", f"http://user:{PASSWORD}@")
    model = wire.model_class(wire.model_name, api_key=CANARY, base_url=wire.base_url(root))
    shown = [model.base_url]
    with anyio.fail_after(10):
        async with model:
            response = await model.request(_request())
            shown.append(model.base_url)
    assert response.text == "hi"
    for url in shown:
        assert PASSWORD not in url
        assert url.startswith("http://[redacted]@127.0.0.1:")
