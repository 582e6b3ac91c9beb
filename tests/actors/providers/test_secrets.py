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
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from actors import Agent, ModelRequest, ModelResponse, ProviderError, RetryPolicy, UserMessage
from runtime import Event, Runtime, SQLiteStore

from ..loopback import LoopbackServer, json_reply, text_reply
from .wires import Wire

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

        async def below(client: object, request: ModelRequest) -> tuple[int, bytes]:
            raise ValueError(f"Illegal header value b'Bearer {CANARY}'")

        monkeypatch.setattr(model, "send", below)
        with pytest.raises(ProviderError, match="the request failed: ValueError") as caught:
            await model.request(_request())
        failures.append(caught.value)

        async def answered(client: object, request: ModelRequest) -> tuple[int, bytes]:
            return 200, b"{}"

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
