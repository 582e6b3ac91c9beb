"""A model that falls back (issue 29): ``FallbackModel(primary, fallback)``.

The chain moves on when the model before cannot answer: a request too long for its
context at once, a failing server after its retries, a rate limit that would make
it wait longer than the chain's ``max_wait``; and each attempt is its own request,
at its own model's price, named in the events and the trace.
"""

from __future__ import annotations

import anyio
import pytest

from fractor.actors import (
    Agent,
    ExecutionTrace,
    FallbackModel,
    FunctionModel,
    Model,
    ModelRequest,
    OpenAIModel,
    ProviderError,
    RequestEnd,
    Result,
    RetryPolicy,
    fail,
    reply,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget, Event, Price, RateLimit, Runtime

from ..loopback import LoopbackServer, json_reply, sse_reply, text_reply

PRICES = {
    "primary": Price(input_per_million=10_000, output_per_million=30_000),
    "fallback": Price(input_per_million=1_000, output_per_million=2_000),
}


def server_error() -> ProviderError:
    return ProviderError("openai", "overloaded", status=503, retryable=True, kind="server")


def failing(error: Exception, times: int = 10) -> tuple[FunctionModel, list[int]]:
    """A model that fails with ``error`` ``times`` times (then answers "late")."""
    calls: list[int] = []

    async def answer(request: ModelRequest) -> Turn:
        calls.append(1)
        if len(calls) <= times:
            return fail(error)
        return reply("late")

    return FunctionModel(answer, name="primary"), calls


def answering(name: str = "fallback", text: str = "from the fallback") -> FunctionModel:
    async def answer(request: ModelRequest) -> Turn:
        return reply(text)

    return FunctionModel(answer, name=name)


async def ask(
    model: Model, *, retries: int = 1
) -> tuple[tuple[Result, ExecutionTrace], list[Event]]:
    agent = Agent("a", model, retry=RetryPolicy(retries=retries, initial_delay=0.001))
    events: list[Event] = []
    async with Runtime(prices=PRICES) as rt:
        ref = await rt.spawn(agent)
        async with rt.events() as stream, anyio.create_task_group() as tg:

            async def watch() -> None:
                async for event in stream:  # (until cancelled)
                    events.append(event)  # noqa: PERF401

            tg.start_soon(watch)
            with anyio.fail_after(20):
                result = await ref.ask("Go.")
            trace = (await ref.trace())[-1]
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    return (result, trace), events


async def test_a_failing_server_falls_back_after_its_retries() -> None:
    primary, calls = failing(server_error())
    (result, trace), events = await ask(FallbackModel(primary, answering()), retries=1)
    assert (result.status, result.text) == ("completed", "from the fallback")
    assert len(calls) == 2  # its first try and its one retry
    ends = [e.detail for e in events if isinstance(e.detail, RequestEnd)]
    assert [end.model for end in ends] == ["primary", "primary", "fallback"]
    assert [end.finish_reason for end in ends] == ["error", "error", "stop"]
    assert trace.steps[-1].model == "fallback"
    # Each attempt at its own model's price: the primary's failed tries (their input
    # estimate) at the primary's, the fallback's answer at the fallback's.
    usage = result.usage
    assert usage.requests == 3
    (alone, _), _ = await ask(failing(server_error())[0], retries=1)
    (answer, _), _ = await ask(answering(), retries=1)
    assert alone.usage.cost > 0
    expected = alone.usage.cost + answer.usage.cost
    assert usage.cost == pytest.approx(expected)
    assert usage.input_tokens == alone.usage.input_tokens + answer.usage.input_tokens


async def test_a_request_too_long_for_the_context_falls_back_at_once() -> None:
    too_long = ProviderError(
        "openai", "does not fit", status=400, retryable=False, kind="context_length"
    )
    primary, calls = failing(too_long)
    (result, _trace), _ = await ask(FallbackModel(primary, answering()), retries=3)
    assert (result.status, result.text) == ("completed", "from the fallback")
    assert len(calls) == 1  # no retry: waiting never mends it


async def test_an_error_that_is_the_answer_does_not_fall_back() -> None:
    rejected = ProviderError("openai", "bad key", status=401, retryable=False, kind="auth")
    primary, calls = failing(rejected)
    fallback_calls: list[int] = []

    async def fallback(request: ModelRequest) -> Turn:
        fallback_calls.append(1)
        return reply("no")

    (result, _), _ = await ask(
        FallbackModel(primary, FunctionModel(fallback, name="fallback")), retries=2
    )
    assert result.status == "failed"
    assert "bad key" in result.stop_reason
    assert (len(calls), fallback_calls) == (1, [])


async def test_a_rate_limit_pause_longer_than_the_chain_waits_falls_back() -> None:
    limited = ProviderError(
        "openai", "slow down", status=429, retryable=True, retry_after=30.0, kind="rate_limited"
    )
    primary, calls = failing(limited)
    began = anyio.current_time()
    (result, _), _ = await ask(FallbackModel(primary, answering(), max_wait=1.0))
    assert (result.status, result.text) == ("completed", "from the fallback")
    assert anyio.current_time() - began < 5  # not the 30 s the primary's server asked
    assert len(calls) == 1
    assert result.usage.requests == 1  # (the 429 was not billed)


async def test_a_short_pause_is_waited_for_and_the_primary_answers() -> None:
    limited = ProviderError(
        "openai", "slow down", status=429, retryable=True, retry_after=0.2, kind="rate_limited"
    )
    primary, calls = failing(limited, times=1)
    (result, trace), _ = await ask(FallbackModel(primary, answering(), max_wait=5.0))
    assert (result.status, result.text) == ("completed", "late")
    assert len(calls) == 2
    assert trace.steps[-1].model == "primary"


async def test_a_paused_lane_sends_the_request_to_the_next_model_without_trying() -> None:
    primary, calls = failing(server_error(), times=0)
    chain = FallbackModel(primary, answering(), max_wait=0.5)
    agent = Agent("a", chain)
    async with Runtime(rate_limits={"primary": RateLimit()}) as rt:
        rates = rt.supervisor.rates
        rates.pause(rates.lane("primary"), 60)  # the primary's server asked for a minute
        with anyio.fail_after(10):
            result = await (await rt.spawn(agent)).ask("Go.")
    assert (result.status, result.text) == ("completed", "from the fallback")
    assert calls == []


async def test_a_real_servers_context_error_falls_back(server: LoopbackServer) -> None:
    server.queue(
        json_reply(
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
            status=400,
        )
    )
    primary = OpenAIModel("small", base_url=f"{server.url}/v1", api_key="sk-test", timeout=5.0)
    async with primary:
        (result, trace), _ = await ask(FallbackModel(primary, answering("large")), retries=2)
    assert (result.status, result.text) == ("completed", "from the fallback")
    assert len(server.requests) == 1
    assert trace.steps[-1].model == "large"


async def test_outside_an_agent_the_chain_is_tried_in_order() -> None:
    primary, calls = failing(server_error())
    chain = FallbackModel(primary, answering())
    response = await chain.request(ModelRequest(messages=()))
    assert response.text == "from the fallback"
    assert len(calls) == 1
    assert chain.name == "primary | fallback"
    await chain.aclose()


def test_a_chain_needs_two_models_that_answer_themselves() -> None:
    from fractor.actors import ReActModel

    with pytest.raises(ValueError, match="2 models"):
        FallbackModel(answering())
    with pytest.raises(TypeError, match="built on another"):
        FallbackModel(ReActModel(answering()), answering())
    with pytest.raises(ValueError, match="max_wait"):
        FallbackModel(answering(), answering("b"), max_wait=-1)


async def test_a_cost_budget_over_a_chain_reads_each_links_price() -> None:
    # Issue 40: the price was looked up under the chain's name ("primary | fallback").
    primary, _calls = failing(server_error(), times=1)
    agent = Agent("a", FallbackModel(primary, answering()))
    async with Runtime(prices=PRICES) as rt:
        with anyio.fail_after(10):
            result = await (await rt.spawn(agent)).ask("Go.", budget=Budget(cost=100.0))
    assert (result.status, result.text) == ("completed", "from the fallback"), result.stop_reason
    assert result.usage.cost > 0
    # A link with no price is still named, by its own name.
    unpriced = Agent("b", FallbackModel(answering("primary"), answering("unpriced")))
    async with Runtime(prices=PRICES) as rt:
        ref = await rt.spawn(unpriced)
        with pytest.raises(ValueError, match=r"no price is known for model 'unpriced'"):
            await ref.ask("Go.", budget=Budget(cost=1.0))


# -- a primary whose server cannot answer, past the status line (issue 40) ------------------


def _chunk(text: str) -> dict[str, object]:
    """A chunk of an OpenAI chat completion stream carrying ``text``."""
    choices = [{"index": 0, "delta": {"content": text}, "finish_reason": None}]
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": choices}


def _primary(server: LoopbackServer, **options: object) -> OpenAIModel:
    return OpenAIModel(
        "small",
        base_url=f"{server.url}/v1",
        api_key="sk-test",
        timeout=options.pop("timeout", 5.0),  # type: ignore[arg-type]
        **options,  # type: ignore[arg-type]
    )


async def test_a_stream_that_breaks_off_falls_back_after_its_retries(
    server: LoopbackServer,
) -> None:
    cut = sse_reply([_chunk("The first "), _chunk("try")], complete=False)
    server.queue(cut, cut)
    primary = _primary(server)
    async with primary:
        (result, trace), events = await ask(FallbackModel(primary, answering("large")), retries=1)
    assert (result.status, result.text) == ("completed", "from the fallback"), result.stop_reason
    assert len(server.requests) == 2  # its first try and its one retry
    assert trace.steps[-1].model == "large"
    ends = [e.detail for e in events if isinstance(e.detail, RequestEnd)]
    assert [end.model for end in ends] == ["openai:small", "openai:small", "large"]


async def test_a_stream_that_stalls_past_its_timeout_falls_back(server: LoopbackServer) -> None:
    server.queue(sse_reply([_chunk("Thinking")], hang=30))
    primary = _primary(server, timeout=0.5)
    async with primary:
        (result, trace), _ = await ask(FallbackModel(primary, answering("large")), retries=0)
    assert (result.status, result.text) == ("completed", "from the fallback"), result.stop_reason
    assert len(server.requests) == 1
    assert trace.steps[-1].model == "large"


async def test_an_answer_that_is_not_json_falls_back_after_its_retries(
    server: LoopbackServer,
) -> None:
    page = text_reply("<html><body>Welcome to nginx!</body></html>", content_type="text/html")
    server.queue(page, page)
    primary = _primary(server, stream=False)
    async with primary:
        (result, trace), _ = await ask(FallbackModel(primary, answering("large")), retries=1)
    assert (result.status, result.text) == ("completed", "from the fallback"), result.stop_reason
    assert len(server.requests) == 2
    assert trace.steps[-1].model == "large"


# -- a primary whose declared rate limit would make it wait too long (issue 40) -------------


async def _ask_twice(
    chain: FallbackModel, limit: RateLimit, budget: Budget | None = None
) -> tuple[Result, Result]:
    """Two asks in turn: the first takes what the primary's declared limit allows."""
    agent = Agent("a", chain)
    async with Runtime(rate_limits={"primary": limit}) as rt:
        ref = await rt.spawn(agent)
        with anyio.fail_after(10):
            first = await ref.ask("Go.", budget=budget)
            second = await ref.ask("Go.", budget=budget)
    return first, second


async def test_a_declared_window_with_no_room_within_max_wait_falls_back_at_once() -> None:
    primary, calls = failing(server_error(), times=0)
    chain = FallbackModel(primary, answering(), max_wait=0.3)
    first, second = await _ask_twice(chain, RateLimit(requests_per_minute=1, period=60))
    assert (first.status, first.text) == ("completed", "late")
    assert (second.status, second.text) == ("completed", "from the fallback"), second.stop_reason
    assert len(calls) == 1  # the primary was not asked again


async def test_a_declared_window_with_no_room_before_the_deadline_falls_back() -> None:
    primary, calls = failing(server_error(), times=0)
    chain = FallbackModel(primary, answering())  # max_wait=None: as the deadline leaves
    first, second = await _ask_twice(
        chain, RateLimit(requests_per_minute=1, period=60), Budget(seconds=5)
    )
    assert (first.status, first.text) == ("completed", "late")
    assert (second.status, second.text) == ("completed", "from the fallback"), second.stop_reason
    assert len(calls) == 1


async def test_a_declared_concurrency_with_no_slot_within_max_wait_falls_back() -> None:
    release = anyio.Event()
    entered: list[int] = []

    async def holding(request: ModelRequest) -> Turn:
        entered.append(1)
        await release.wait()
        return reply("late")

    primary = FunctionModel(holding, name="primary")
    chain = FallbackModel(primary, answering(), max_wait=0.3)
    results: list[Result] = []
    async with Runtime(rate_limits={"primary": RateLimit(concurrent=1)}) as rt:
        holder = await rt.spawn(Agent("holder", chain))
        other = await rt.spawn(Agent("other", chain))
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:

                async def hold() -> None:
                    results.append(await holder.ask("Go."))

                tg.start_soon(hold)
                while not entered:  # the holder's request takes the only slot
                    await anyio.wait_all_tasks_blocked()
                results.append(await other.ask("Go."))
                release.set()
    assert [(r.status, r.text) for r in results] == [
        ("completed", "from the fallback"),
        ("completed", "late"),
    ]
    assert len(entered) == 1
