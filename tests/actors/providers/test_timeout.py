"""A provider's ``timeout`` bounds the whole request: the headers, the body and every
event of a stream, however the server keeps the connection busy.

Servers on 127.0.0.1 that never go quiet long enough for a wait on the socket to
time out: a stream of keep-alive comments (``: ping`` every 0.2 s) and a body
trickled a byte at a time. Each would run for seconds under a timeout of a fraction
of one if the timeout bounded only each wait for data. Each test runs per wire.
"""

from __future__ import annotations

import json

import anyio
import anyio.to_thread
import pytest

from fractor.actors import Agent, ModelRequest, ProviderError, RetryPolicy, UserMessage
from fractor.runtime import Runtime

from ..loopback import LoopbackServer, Reply, sse_reply
from .wires import Wire, stream_opening

REQUEST = ModelRequest(messages=(UserMessage(content="x"),))

#: The provider's timeout in these tests, and the most any of them may take: far
#: less than the servers keep going (8 s and more).
TIMEOUT = 1.0
BOUND = 5.0


def pinging(wire: Wire) -> Reply:
    """A stream that answers at once, then sends a keep-alive comment every 0.2 s for
    8 s."""
    head = b"".join(sse_reply(stream_opening(wire, text_block=True)).events or ())
    return sse_reply([head, *[b": ping\n\n"] * 40], gap=0.2)


def trickled(wire: Wire) -> Reply:
    """A whole JSON answer sent a byte at a time, 50 ms apart (12 s for 240 bytes)."""
    body = json.dumps(wire.reply("slow " * 30)).encode()
    return Reply(
        content_type="application/json", events=tuple(body[i : i + 1] for i in range(240)), gap=0.05
    )


def assert_timed_out(error: ProviderError) -> None:
    assert error.retryable
    assert f"within the {TIMEOUT:g} s timeout" in str(error)


async def test_keep_alive_comments_do_not_keep_a_stream_past_its_timeout(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(pinging(wire))
    sunk: list[str] = []
    with anyio.fail_after(BOUND):
        async with wire.model(server, timeout=TIMEOUT) as model:
            with pytest.raises(ProviderError) as caught:
                await model.stream(REQUEST, sunk.append)
        # The connection is closed: the server sees the client go.
        gone = await anyio.to_thread.run_sync(server.wait_disconnect, 2.0)
    assert_timed_out(caught.value)
    assert sunk == ["Hel"]
    assert caught.value.status == 200
    assert caught.value.usage is not None  # what the cut stream spent
    assert caught.value.usage.input_tokens > 0
    assert gone > 0


async def test_a_body_trickled_a_byte_at_a_time_does_not_outlast_the_timeout(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(trickled(wire))
    with anyio.fail_after(BOUND):
        async with wire.model(server, timeout=TIMEOUT) as model:
            with pytest.raises(ProviderError) as caught:
                await model.request(REQUEST)
    assert_timed_out(caught.value)


async def test_a_streamed_request_answered_by_a_trickled_json_body_times_out(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(trickled(wire))
    with anyio.fail_after(BOUND):
        async with wire.model(server, timeout=TIMEOUT) as model:
            with pytest.raises(ProviderError) as caught:
                await model.stream(REQUEST, lambda text: None)
    assert_timed_out(caught.value)


@pytest.mark.parametrize("streamed", [False, True], ids=["request", "stream"])
async def test_an_agent_retries_a_request_that_ran_out_of_time(
    wire: Wire, server: LoopbackServer, streamed: bool
) -> None:
    """The timeout is retryable: the agent's retry policy sends the request again, and
    the second answer (on time) is the result."""
    server.queue(trickled(wire) if not streamed else pinging(wire))
    server.queue(Reply(body=json.dumps(wire.reply("on time")).encode()))
    model = wire.model(server, timeout=TIMEOUT, stream=streamed)
    with anyio.fail_after(BOUND):
        async with model, Runtime() as rt:
            agent = Agent("patient", model, retry=RetryPolicy(retries=1, initial_delay=0))
            result = await (await rt.spawn(agent)).ask("hello")
    assert (result.status, result.text) == ("completed", "on time")
    assert len(server.requests) == 2
