"""The contract every provider keeps, run against each wire format in turn.

``OpenAIModel`` and ``AnthropicModel`` speak different APIs, but promise the same
things: HTTP errors classified as retryable or not (and never retried by the SDK
itself), malformed bodies and timeouts reported as retryable ``ProviderError``\\ s,
an agent's retry policy getting past transient errors, an invalid key failing at
once, a key from the environment or a placeholder for local servers, a clear error
without either. Each test runs for each provider (``wires.py`` says how each one
looks on the wire) against a real HTTP server on 127.0.0.1, on both backends. What
is particular to one wire format stays in ``test_openai.py`` / ``test_anthropic.py``.
"""

from __future__ import annotations

import socket
import sys

import anyio
import pytest

from fractor.actors import Agent, ModelRequest, ProviderError, RetryPolicy, UserMessage
from fractor.runtime import Budget, Runtime

from ..loopback import LoopbackServer, json_reply, text_reply
from ..sample_tools import ask_once
from .wires import Wire

REQUEST = ModelRequest(messages=(UserMessage(content="x"),))


# -- one request ----------------------------------------------------------------------


async def test_http_errors_are_classified(wire: Wire, server: LoopbackServer) -> None:
    for status, body, _, _ in wire.http_errors:
        server.queue(
            text_reply(body, status=status, content_type="text/html")
            if isinstance(body, str)
            else json_reply(body, status=status)
        )
    async with wire.model(server) as model:
        for status, body, retryable, says in wire.http_errors:
            with pytest.raises(ProviderError) as caught:
                await model.request(REQUEST)
            error = caught.value
            text = str(error)
            assert (error.status, error.retryable) == (status, retryable), text
            assert error.provider == wire.provider
            assert text.startswith(f"{wire.provider} model {wire.model_name!r}, HTTP {status}: ")
            assert says in text
            if isinstance(body, dict):
                assert body["error"]["message"] in text
                if wire.names_error_type:
                    assert body["error"]["type"] in text
            assert wire.key not in text
    # One request per error: the SDK itself never retries.
    assert len(server.requests) == len(wire.http_errors)


async def test_malformed_responses_are_retryable(wire: Wire, server: LoopbackServer) -> None:
    server.queue(*(text_reply(payload) for payload, _ in wire.malformed))
    async with wire.model(server) as model:
        for payload, detail in wire.malformed:
            with pytest.raises(ProviderError) as caught:
                await model.request(REQUEST)
            text = str(caught.value)
            assert (caught.value.retryable, caught.value.status) == (True, 200), payload
            assert "malformed" in text
            assert detail in text


async def test_a_timeout_is_retryable_and_prompt(wire: Wire, server: LoopbackServer) -> None:
    server.queue(json_reply(wire.reply("late"), delay=10))
    with anyio.fail_after(5):
        async with wire.model(server, timeout=0.2) as model:
            with pytest.raises(ProviderError) as caught:
                await model.request(REQUEST)
    assert caught.value.retryable
    assert caught.value.status is None
    assert "0.2 s timeout" in str(caught.value)


async def test_a_refused_connection_is_retryable(wire: Wire) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on that port now.
    endpoint = wire.base_url(f"http://127.0.0.1:{port}")
    async with wire.model_class("m", base_url=endpoint, api_key=wire.key, timeout=2) as model:
        with pytest.raises(ProviderError) as caught:
            await model.request(REQUEST)
    assert caught.value.retryable
    assert "could not reach" in str(caught.value)


async def test_a_closed_model_opens_a_new_client_at_its_next_request(
    wire: Wire, server: LoopbackServer
) -> None:
    # A runtime closes its agents' models as it exits; the next one may use them again.
    server.queue(json_reply(wire.reply("first")), json_reply(wire.reply("second")))
    model = wire.model(server)
    await model.aclose()  # before any client: nothing to close
    assert (await model.request(REQUEST)).text == "first"
    first = model._client
    await model.aclose()
    await model.aclose()
    closed = model._client
    assert (await model.request(REQUEST)).text == "second"
    second = model._client
    await model.aclose()
    assert closed is None
    assert second is not None
    assert second is not first


# -- through an agent's retry policy ------------------------------------------------------


async def test_transient_errors_then_success_are_retried_by_the_policy(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(
        *(json_reply(body, status=status) for status, body in wire.transient),
        json_reply(wire.reply("Made it.")),
    )
    async with wire.model(server) as model:
        result = await ask_once(model)
    assert (result.status, result.text) == ("completed", "Made it."), result.stop_reason
    attempts = len(wire.transient) + 1
    refused = sum(1 for status, _ in wire.transient if status == 429)  # (not billed)
    assert refused
    assert result.usage.requests == attempts - refused
    assert len(server.requests) == attempts
    assert len({received.body for received in server.requests}) == 1  # the same request


async def test_malformed_then_success_is_retried(wire: Wire, server: LoopbackServer) -> None:
    server.queue(text_reply("{oops"), json_reply(wire.reply("Fine.")))
    async with wire.model(server) as model:
        agent = Agent("assistant", model, retry=RetryPolicy(retries=1, initial_delay=0))
        async with Runtime() as rt:
            result = await (await rt.spawn(agent)).ask("Go")
    assert (result.status, result.text) == ("completed", "Fine.")


async def test_an_invalid_key_fails_at_once(wire: Wire, server: LoopbackServer) -> None:
    server.queue(json_reply(wire.invalid_key, status=401), json_reply(wire.reply("never")))
    async with wire.model(server) as model:
        result = await ask_once(model)
    assert result.status == "failed"
    assert len(server.requests) == 1
    assert wire.provider in result.stop_reason
    assert "HTTP 401" in result.stop_reason
    assert "check the key" in result.stop_reason
    assert "not retried" in result.stop_reason


async def test_server_errors_beyond_the_retries_fail_clearly(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(*[json_reply(wire.server_error, status=500)] * 3)
    async with wire.model(server) as model:
        result = await ask_once(model)
    assert result.status == "failed"
    assert len(server.requests) == 3
    assert result.usage.requests == 3
    assert f"{wire.provider} model {wire.model_name!r}, HTTP 500" in result.stop_reason
    assert "server failed" in result.stop_reason
    assert "[failed]" in result.text  # the synthesized answer


async def test_the_deadline_cancels_a_hanging_request(wire: Wire, server: LoopbackServer) -> None:
    server.queue(json_reply(wire.reply("too late"), delay=10))
    async with wire.model(server, timeout=30) as model:
        agent = Agent("assistant", model)
        with anyio.fail_after(5):
            async with Runtime() as rt:
                result = await (await rt.spawn(agent)).ask("Go", budget=Budget(seconds=0.3))
    assert result.status == "timed_out"


# -- configuration ---------------------------------------------------------------------


async def test_api_key_from_the_environment_or_a_placeholder(
    wire: Wire, server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    server.queue(json_reply(wire.reply("a")), json_reply(wire.reply("b")))
    # No key, but a base URL of its own: a local server, sent a placeholder.
    async with wire.model(server, api_key=None) as local:
        await local.request(REQUEST)
    monkeypatch.setenv(wire.key_variable, "sk-from-env")
    async with wire.model(server, api_key=None) as keyed:
        await keyed.request(REQUEST)
    first, second = server.requests
    assert wire.sent_key(first) == "not-needed"
    assert wire.sent_key(second) == "sk-from-env"


def test_no_key_and_no_base_url_is_a_clear_error(wire: Wire) -> None:
    with pytest.raises(ProviderError, match=wire.key_variable) as caught:
        wire.model_class("some-model")
    assert not caught.value.retryable
    assert caught.value.kind == "no_key"  # what the command line words in its own options
    assert "pass api_key=..." in str(caught.value)  # a library user's advice, in Python


def test_a_missing_sdk_says_which_extra_to_install(
    wire: Wire, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, wire.sdk, None)
    with pytest.raises(ProviderError, match=rf"pip install 'fractor\[{wire.sdk}\]'"):
        wire.model_class("some-model", api_key=wire.key)


@pytest.mark.parametrize(
    ("base_url", "problem"),
    [
        ("localhost:8000/v1", "the scheme must be http or https"),
        ("ftp://host/v1", "the scheme must be http or https"),
        ("http:///v1", "it names no host"),
        ("http://host:port/v1", "Port could not be cast"),
        ("https://user:s3cret-pw@[::1/v1", "Invalid IPv6 URL"),
    ],
)
def test_a_base_url_that_is_no_http_url_is_refused_at_once_with_no_credentials(
    wire: Wire, base_url: str, problem: str
) -> None:
    with pytest.raises(ValueError, match="base_url must be an http") as caught:
        wire.model_class("some-model", api_key=wire.key, base_url=base_url)
    assert problem in str(caught.value)
    assert "s3cret-pw" not in str(caught.value)


def test_a_base_url_or_key_that_is_no_text_is_refused(wire: Wire) -> None:
    with pytest.raises(
        TypeError, match=f"{wire.provider}: base_url must be a str or None, got int"
    ):
        wire.model_class("some-model", api_key=wire.key, base_url=8080)
    with pytest.raises(TypeError, match=f"{wire.provider}: api_key must be a str or None, got int"):
        wire.model_class("some-model", api_key=12345678)
