"""One model request of an execution (``actors._requests``): its retries.

A retry waits what the agent's ``RetryPolicy`` says, and at least what the server
asked (``Retry-After``); a wait that would pass the execution's deadline is not
waited: the execution ends ``timed_out`` at once, without the retry.
"""

from __future__ import annotations

import socket
import time

import anyio

from fractor.actors import Agent, OpenAIModel, RetryPolicy
from fractor.actors._agent._policy import retry_after
from fractor.runtime import Budget, Runtime

from ..loopback import LoopbackServer, Received, json_reply
from ..providers.wires import completion, openai_error


def _model(server: LoopbackServer) -> OpenAIModel:
    return OpenAIModel("test-model", base_url=f"{server.url}/v1", api_key="sk-test", timeout=5.0)


def _arrivals(server: LoopbackServer) -> list[float]:
    """When each request reached the server (``time.monotonic()``, server side)."""
    arrived: list[float] = []

    def note(received: Received) -> None:
        arrived.append(time.monotonic())

    server.refuse(note)
    return arrived


def _rate_limited_then_ok(server: LoopbackServer, seconds: str) -> None:
    server.queue(
        json_reply(
            openai_error("slow down", "rate_limit_exceeded"),
            status=429,
            headers=[("retry-after", seconds)],
        ),
        json_reply(completion("Done.")),
    )


async def test_a_retry_waits_at_least_what_the_server_asked(server: LoopbackServer) -> None:
    arrived = _arrivals(server)
    _rate_limited_then_ok(server, "1")
    model = _model(server)
    agent = Agent("a", model, retry=RetryPolicy(retries=2, initial_delay=0.01))
    async with model, Runtime() as rt:
        with anyio.fail_after(10):
            result = await (await rt.spawn(agent)).ask("Go.")
    assert (result.status, result.text) == ("completed", "Done."), result.stop_reason
    assert result.usage.requests == 1  # the refused one was not billed, nor counted
    assert len(arrived) == 2
    assert arrived[1] - arrived[0] >= 1.0  # not the policy's 0.01 s


async def test_a_refused_request_counts_only_when_refusals_are_counted(
    server: LoopbackServer,
) -> None:
    _rate_limited_then_ok(server, "0")
    model = _model(server)
    agent = Agent("a", model, retry=RetryPolicy(retries=2, initial_delay=0.01))
    async with model, Runtime(count_refused=True) as rt:
        with anyio.fail_after(10):
            result = await (await rt.spawn(agent)).ask("Go.")
    assert (result.status, result.text) == ("completed", "Done."), result.stop_reason
    assert result.usage.requests == 2  # the attempt the server refused counts
    assert result.usage.input_tokens == completion("Done.")["usage"]["prompt_tokens"]


async def test_a_retry_the_deadline_leaves_no_time_for_ends_timed_out_at_once(
    server: LoopbackServer,
) -> None:
    arrived = _arrivals(server)
    _rate_limited_then_ok(server, "1")
    model = _model(server)
    agent = Agent("a", model, retry=RetryPolicy(retries=2, initial_delay=0.01))
    async with model, Runtime() as rt:
        ref = await rt.spawn(agent)
        with anyio.fail_after(10):
            result = await ref.ask("Go.", budget=Budget(seconds=0.5))
    assert result.status == "timed_out", result.stop_reason
    # At once, before the retry: not a sleep until the deadline passed.
    assert "would pass before the retry" in result.stop_reason
    assert "Retry-After" in result.stop_reason
    assert len(arrived) == 1  # no second request
    assert result.usage.requests == 0  # the one sent was refused: not billed


def test_the_wait_before_a_retry_is_at_least_what_the_server_asked() -> None:
    policy = RetryPolicy(retries=3, initial_delay=0.01, max_delay=0.02, jitter=0.0)
    assert policy.delay(1) == 0.01
    assert policy.delay(1, at_least=3.0) == 3.0  # max_delay bounds the backoff only
    assert policy.delay(5, at_least=0.001) == 0.02


class _Asked(Exception):
    def __init__(self, retry_after: object) -> None:
        super().__init__("asked")
        self.retry_after = retry_after


def test_what_the_server_asked_is_read_from_the_error() -> None:
    assert retry_after(_Asked(1.5)) == 1.5
    assert retry_after(_Asked(2)) == 2.0
    assert retry_after(ValueError("no ask")) == 0.0
    for nonsense in (None, -1.0, float("nan"), float("inf"), True, "3"):
        assert retry_after(_Asked(nonsense)) == 0.0


def _closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on (a connection to it is refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


async def test_a_request_that_never_reached_a_server_is_not_billed() -> None:
    # Issue 40: a refused connection was charged the input estimate and a request
    # for each attempt (24 tokens, 3 requests), though nothing was sent.
    url = f"http://127.0.0.1:{_closed_port()}/v1"
    model = OpenAIModel("llama3.2", base_url=url, api_key="sk-test", timeout=5.0)
    agent = Agent("a", model, retry=RetryPolicy(retries=2, initial_delay=0.01))
    for count_refused, requests in ((False, 0), (True, 3)):
        async with model, Runtime(count_refused=count_refused) as rt:
            with anyio.fail_after(10):
                result = await (await rt.spawn(agent)).ask("Hello")
        assert result.status == "failed"
        assert "could not reach" in result.stop_reason
        # Each attempt counts only as the refusals a server makes do (count_refused).
        assert (result.usage.requests, result.usage.input_tokens) == (requests, 0)
        assert result.usage.cost == 0
