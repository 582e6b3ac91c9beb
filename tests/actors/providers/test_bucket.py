"""The bucket server (``bucket_server.py``) enforces its limits and says so as the
providers' servers do, and both providers hear it: ``ModelResponse.limits`` on every
answer, a 429 as a retryable ``ProviderError`` with ``retry_after`` and ``limits``,
streamed or not."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

import anyio
import pytest

from fractor.actors import ModelRequest, ModelResponse, ProviderError, UserMessage

from .bucket_server import BucketServer
from .wires import Wire

pytestmark = pytest.mark.filterwarnings("error")


def _request(text: str = "hello there", max_tokens: int = 40) -> ModelRequest:
    return ModelRequest(messages=(UserMessage(content=text),), max_tokens=max_tokens)


def _model(wire: Wire, server: BucketServer, *, stream: bool = False) -> Any:
    return wire.model_class(
        wire.model_name,
        base_url=server.base_url(wire.provider),
        api_key=wire.key,
        timeout=5.0,
        stream=stream,
    )


async def _ask(model: Any, request: ModelRequest, *, stream: bool) -> ModelResponse:
    if stream:
        pieces: list[str] = []
        response: ModelResponse = await model.stream(request, pieces.append)
        assert "".join(pieces) == response.text
        return response
    answered: ModelResponse = await model.request(request)
    return answered


def _post(url: str, body: dict[str, Any]) -> tuple[int, dict[str, str], dict[str, Any]]:
    """One raw request: status, headers (lowercased) and the JSON body."""
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            status, headers, data = response.status, response.headers, response.read()
    except urllib.error.HTTPError as error:
        status, headers, data = error.code, error.headers, error.read()
    return status, {k.lower(): v for k, v in headers.items()}, json.loads(data)


def _chat(max_tokens: int = 40) -> dict[str, Any]:
    return {
        "model": "test-model",
        "messages": [{"role": "user", "content": "hello there"}],
        "max_tokens": max_tokens,
    }


# -- the server itself ----------------------------------------------------------------------


async def test_past_the_requests_limit_it_answers_429_as_openai_does() -> None:
    with BucketServer(requests=3, window=5.0) as server:
        url = f"{server.url}/v1/chat/completions"
        answers = [await anyio.to_thread.run_sync(_post, url, _chat()) for _ in range(5)]
        statistics = server.statistics()
    assert [status for status, _, _ in answers] == [200, 200, 200, 429, 429]
    remaining = [int(h["x-ratelimit-remaining-requests"]) for _, h, _ in answers]
    assert remaining == [2, 1, 0, 0, 0]
    _, headers, body = answers[3]
    assert headers["x-ratelimit-limit-requests"] == "3"
    wait_ms = int(headers["retry-after-ms"])
    assert 4000 < wait_ms <= 5000  # the first request leaves the 5 s window
    assert headers["retry-after"] == "5"  # whole seconds, rounded up
    assert body["error"]["code"] == "rate_limit_exceeded"
    assert body["error"]["type"] == "requests"
    assert "Please try again in" in body["error"]["message"]
    assert answers[0][2]["usage"]["completion_tokens"] == 5
    assert (statistics.served, statistics.refused, statistics.peak_requests) == (3, 2, 3)


async def test_tokens_are_charged_input_and_cap_up_front_and_settled_after() -> None:
    # Each request: 2 input tokens of text + 1 a message + 1, cap 40: charged 44.
    with BucketServer(tokens=100, window=5.0, latency=1.0) as server:
        url = f"{server.url}/v1/chat/completions"
        answers: list[int] = []

        async def post() -> None:
            status, _, _ = await anyio.to_thread.run_sync(_post, url, _chat())
            answers.append(status)

        async with anyio.create_task_group() as tg:
            for _ in range(3):
                tg.start_soon(post)
        # Settled to their usage (4 + 5 each): two more fit where one would not have.
        for _ in range(2):
            await post()
        statistics = server.statistics()
        arrivals = server.arrivals()
    assert sorted(answers) == [200, 200, 200, 200, 429]
    assert [a.why for a in arrivals if a.status == 429] == ["tokens"]
    assert {a.charged for a in arrivals} == {44}
    # The most charged at once: the two first requests in flight, up front (the
    # later two came to 2 x 9 settled + 44, and 3 x 9 + 44); all five asked 5 x 44.
    assert statistics.peak_tokens == 2 * 44
    assert statistics.peak_tokens_asked == 5 * 44


async def test_past_the_concurrency_limit_it_answers_429() -> None:
    with BucketServer(concurrent=2, latency=1.0) as server:
        url = f"{server.url}/v1/messages"
        statuses: list[int] = []

        async def post() -> None:
            status, headers, body = await anyio.to_thread.run_sync(_post, url, _chat())
            statuses.append(status)
            if status == 429:
                assert body["error"]["type"] == "rate_limit_error"
                assert "retry-after" in headers

        async with anyio.create_task_group() as tg:
            for _ in range(4):
                tg.start_soon(post)
        statistics = server.statistics()
    assert sorted(statuses) == [200, 200, 429, 429]
    assert statistics.peak_concurrency == 2
    assert {a.why for a in server.arrivals() if a.status == 429} == {"concurrent"}


async def test_a_request_larger_than_the_token_limit_is_too_large_and_never_retried(
    wire: Wire,
) -> None:
    with BucketServer(tokens=30) as server:
        async with _model(wire, server) as model:
            with pytest.raises(ProviderError) as caught:
                await model.request(_request(max_tokens=100))
    error = caught.value
    assert error.status == 429
    assert not error.retryable
    assert error.retry_after is None
    assert "Request too large" in str(error)


# -- the providers against it -----------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_each_answer_says_what_remains(wire: Wire, stream: bool) -> None:
    with BucketServer(requests=10, tokens=1000, window=5.0) as server:
        async with _model(wire, server, stream=stream) as model:
            answers = [await _ask(model, _request(), stream=stream) for _ in range(3)]
    assert [answer.text for answer in answers] == ["ok"] * 3
    limits = [answer.limits for answer in answers]
    assert all(limit is not None for limit in limits)
    assert [limit.requests_remaining for limit in limits if limit] == [9, 8, 7]
    assert [limit.requests_limit for limit in limits if limit] == [10] * 3
    # Each request charged 44 up front (4 of input, a cap of 40), settled to 9 (4 + 5
    # of output) once answered.
    assert [limit.tokens_remaining for limit in limits if limit] == [956, 947, 938]
    for limit in limits:
        assert limit is not None
        assert limit.requests_reset is not None
        assert 0 < limit.requests_reset <= 5.0
        assert limit.retry_after is None


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_429_is_a_retryable_provider_error_with_the_wait_and_the_limits(
    wire: Wire, stream: bool
) -> None:
    with BucketServer(requests=1, window=1.0) as server:
        async with _model(wire, server, stream=stream) as model:
            first = await _ask(model, _request(), stream=stream)
            with pytest.raises(ProviderError) as caught:
                await _ask(model, _request(), stream=stream)
            error = caught.value
            assert error.retry_after is not None
            # The server lets the next request through once the wait it asked is over.
            await anyio.sleep(error.retry_after)
            again = await _ask(model, _request(), stream=stream)
        statistics = server.statistics()
    assert first.limits is not None
    assert first.limits.requests_remaining == 0
    assert error.status == 429
    assert error.retryable
    assert error.limits is not None
    assert error.limits.requests_remaining == 0
    assert error.limits.requests_limit == 1
    assert error.limits.retry_after == error.retry_after
    if wire.provider == "openai":  # retry-after-ms: the exact wait
        assert 0 < error.retry_after <= 1.0
    else:  # retry-after in whole seconds, as Anthropic sends it
        assert error.retry_after == 1.0
    assert again.text == "ok"
    assert (statistics.served, statistics.refused) == (2, 1)
