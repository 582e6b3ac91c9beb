"""``AnthropicModel`` against a real HTTP server on 127.0.0.1 speaking the Messages API.

Every test asserts on the requests the server received: the top-level system text,
the turns and their content blocks, ``tool_use`` blocks answered by ``tool_result``
blocks with the same ids in the next user turn, the tools array, ``max_tokens``.
No network, no real key.
"""

from __future__ import annotations

from typing import Any

import pytest

from fractor.actors import (
    Agent,
    AnthropicModel,
    AssistantMessage,
    DigestMessage,
    ModelRequest,
    ProviderError,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    ToolSpec,
    UserMessage,
)
from fractor.actors.providers._anthropic import check_event_loop
from fractor.runtime import Budget, Runtime

from ..loopback import LoopbackServer, json_reply
from ..sample_tools import add, get_weather
from .wires import ANTHROPIC_KEY as KEY
from .wires import ANTHROPIC_TRIO_UNSUPPORTED as TRIO_UNSUPPORTED
from .wires import anthropic_model as model_for
from .wires import message, text, tool_use
from .wires import sent_anthropic_key as sent_key


@pytest.fixture(autouse=True)
def sdk_runs_on_the_backend(request: pytest.FixtureRequest) -> None:
    """On trio with an SDK older than 0.46, only the test of the clear refusal runs."""
    if (
        TRIO_UNSUPPORTED
        and "anyio_backend" in request.fixturenames
        and request.getfixturevalue("anyio_backend") == "trio"
        and "older_than" not in request.node.name
    ):
        pytest.skip(
            "the installed anthropic SDK is older than 0.46: its async client runs on "
            "asyncio only, and AnthropicModel refuses trio with a ProviderError "
            "(test_an_sdk_older_than_0_46_refuses_trio_clearly)"
        )


def assert_results_follow_calls(turns: list[dict[str, Any]]) -> None:
    """Each tool_use is answered in the very next user turn, same id, results first."""
    for index, turn in enumerate(turns):
        if turn["role"] != "assistant" or isinstance(turn["content"], str):
            continue
        ids = [b["id"] for b in turn["content"] if b["type"] == "tool_use"]
        if not ids:
            continue
        answer = turns[index + 1]
        assert answer["role"] == "user"
        blocks = answer["content"]
        results = [b["tool_use_id"] for b in blocks[: len(ids)] if b["type"] == "tool_result"]
        assert results == ids, (ids, blocks)


# -- mapping --------------------------------------------------------------------------


async def test_a_final_answer_maps_both_ways(server: LoopbackServer) -> None:
    server.queue(
        json_reply(
            message(
                text("Hello "),
                text("there."),
                input_tokens=11,
                cache_read=5,
                cache_creation=3,
            )
        )
    )
    request = ModelRequest(
        messages=(SystemMessage(content="Be brief."), UserMessage(content="Hi")),
    )
    async with model_for(server) as model:
        response = await model.request(request)
    assert response.text == "Hello there."
    assert response.tool_calls == ()
    assert response.finish_reason == "stop"
    # Input counts every prompt token: fresh, written to the cache and read from it.
    assert response.usage.input_tokens == 11 + 3 + 5
    assert response.usage.cached_tokens == 5
    assert response.usage.output_tokens == 7
    assert response.usage.requests == 1
    assert response.model == "anthropic:claude-test-2025"
    (received,) = server.requests
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert sent_key(received) == KEY
    assert "anthropic-version" in received.headers
    body = received.json()
    assert body["model"] == "claude-test"
    assert body["system"] == "Be brief."
    assert body["messages"] == [{"role": "user", "content": [text("Hi")]}]
    assert body["max_tokens"] == 8192  # required: the documented default
    assert "tools" not in body


async def test_a_tool_call_round_trip_through_an_agent(server: LoopbackServer) -> None:
    server.queue(
        json_reply(
            message(
                text("Let me look."),
                tool_use("toolu_a", "get_weather", {"city": "Paris"}),
                input_tokens=50,
                output_tokens=20,
            )
        ),
        json_reply(message(text("Sunny, 22°C in Paris."), input_tokens=80, output_tokens=9)),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[get_weather], instructions="Be brief.")
        async with Runtime() as rt:
            ref = await rt.spawn(agent)
            result = await ref.ask("Weather in Paris?")
            conversation = await ref.conversation()
    assert result.status == "completed", result.stop_reason
    assert result.text == "Sunny, 22°C in Paris."
    assert (result.usage.requests, result.usage.input_tokens, result.usage.output_tokens) == (
        2,
        130,
        29,
    )
    assert conversation.execution == ()
    first, second = (r.json() for r in server.requests)
    assert first["tools"] == [
        {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "input_schema": agent.specs[0].parameters,
        }
    ]
    assert first["system"] == second["system"] == "Be brief."
    assert second["messages"] == [
        {"role": "user", "content": [text("Weather in Paris?")]},
        {
            "role": "assistant",
            "content": [
                text("Let me look."),
                tool_use("toolu_a", "get_weather", {"city": "Paris"}),
            ],
        },
        {
            "role": "user",
            "content": [
                {
                    "type": "tool_result",
                    "tool_use_id": "toolu_a",
                    "content": "22°C and sunny in Paris",
                }
            ],
        },
    ]
    assert_results_follow_calls(second["messages"])


async def test_parallel_results_share_one_user_turn(server: LoopbackServer) -> None:
    server.queue(
        json_reply(
            message(
                tool_use("toolu_1", "add", {"a": 1, "b": 2}),
                tool_use("toolu_2", "get_weather", {"city": "Oslo"}),
                tool_use("toolu_3", "add", {"a": "not a number", "b": 2}),
            )
        ),
        json_reply(message(text("Done."))),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add, get_weather])
        async with Runtime() as rt:
            result = await (await rt.spawn(agent)).ask("Do three things")
    assert result.status == "completed", result.stop_reason
    turns = server.requests[1].json()["messages"]
    assert [t["role"] for t in turns] == ["user", "assistant", "user"]
    assert [b["id"] for b in turns[1]["content"]] == ["toolu_1", "toolu_2", "toolu_3"]
    results = turns[2]["content"]
    assert [b["type"] for b in results] == ["tool_result"] * 3
    assert [b["tool_use_id"] for b in results] == ["toolu_1", "toolu_2", "toolu_3"]
    assert results[0]["content"] == "3"
    assert results[1]["content"] == "22°C and sunny in Oslo"
    assert "is_error" not in results[0]
    assert "is_error" not in results[1]
    assert results[2]["is_error"] is True
    assert_results_follow_calls(turns)


async def test_a_second_ask_sends_no_tool_traces_of_the_first(server: LoopbackServer) -> None:
    server.queue(
        json_reply(message(tool_use("toolu_x", "add", {"a": 2, "b": 3}))),
        json_reply(message(text("It is 5."))),
        json_reply(message(text("You asked about 2 + 3."))),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add], instructions="Answer.")
        async with Runtime() as rt:
            ref = await rt.spawn(agent)
            first = await ref.ask("What is 2 + 3?")
            second = await ref.ask("What did I ask?")
    assert (first.text, second.text) == ("It is 5.", "You asked about 2 + 3.")
    third = server.requests[2].json()
    assert third["system"] == "Answer."
    assert third["messages"] == [
        {"role": "user", "content": [text("What is 2 + 3?")]},
        {"role": "assistant", "content": [text("It is 5.")]},
        {"role": "user", "content": [text("What did I ask?")]},
    ]
    assert "toolu_x" not in server.requests[2].body.decode()


async def test_max_tokens_carries_the_budget_reservation(server: LoopbackServer) -> None:
    server.queue(
        json_reply(message(tool_use("t1", "add", {"a": 1, "b": 1}), output_tokens=100)),
        json_reply(message(text("Two."), output_tokens=3)),
        json_reply(message(text("ok"))),
        json_reply(message(text("ok"))),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add], max_tokens=1000)
        async with Runtime() as rt:
            ref = await rt.spawn(agent)
            result = await ref.ask("1 + 1?", budget=Budget(output_tokens=400))
        # A cap beyond what the model may produce is clamped to max_output_tokens.
        await model.request(ModelRequest(messages=(UserMessage(content="x"),), max_tokens=10**6))
    async with model_for(server, max_output_tokens=1000) as small:
        await small.request(ModelRequest(messages=(UserMessage(content="x"),)))
    assert result.status == "completed", result.stop_reason
    caps = [r.json()["max_tokens"] for r in server.requests]
    # The budget's headroom: 400, then 400 - 100 spent; the clamp; another default.
    assert caps == [400, 300, 8192, 1000]


def test_the_request_body_edge_cases() -> None:
    model = AnthropicModel("claude-test", api_key=KEY, options={"temperature": 0})
    request = ModelRequest(
        messages=(
            SystemMessage(content="First."),
            SystemMessage(content="Second."),
            UserMessage(content="One"),
            DigestMessage(content="Two"),  # a digest is a user turn too
            AssistantMessage(content=" \n"),  # blank: the API refuses it, left out
            AssistantMessage(
                tool_calls=(
                    ToolCall(id="a", name="add", arguments="not json"),
                    ToolCall(id="b", name="add", arguments=""),
                )
            ),
            ToolResultMessage(call_id="a", name="add", content="bad", is_error=True),
            ToolResultMessage(call_id="b", name="add", content=""),
        ),
        tools=(ToolSpec(name="add", description="", parameters={"type": "object"}),),
    )
    body = model.body(request)
    assert body["system"] == "First.\n\nSecond."
    assert body["messages"] == [
        {"role": "user", "content": [text("One"), text("Two")]},
        {
            "role": "assistant",
            "content": [
                tool_use("a", "add", {"_arguments": "not json"}),
                tool_use("b", "add", {}),
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "a", "content": "bad", "is_error": True},
                {"type": "tool_result", "tool_use_id": "b"},
            ],
        },
    ]
    assert body["tools"] == [{"name": "add", "input_schema": {"type": "object"}}]
    assert body["extra_body"] == {"temperature": 0}
    assert model.name == "anthropic:claude-test"
    assert model.base_url == "https://api.anthropic.com"
    with pytest.raises(ValueError, match="max_tokens, system"):
        AnthropicModel("m", api_key=KEY, options={"system": "x", "max_tokens": 5})
    with pytest.raises(ValueError, match="requires"):
        AnthropicModel("m", api_key=KEY, max_output_tokens=None)  # type: ignore[arg-type]


async def test_stop_reasons_and_parsing(server: LoopbackServer) -> None:
    cases = [
        ("end_turn", "stop"),
        ("stop_sequence", "stop"),
        ("max_tokens", "length"),
        ("model_context_window_exceeded", "length"),
        ("refusal", "content_filter"),
        (None, "stop"),
        ("something_new", "stop"),
    ]
    server.queue(*(json_reply(message(text("t"), stop=wire)) for wire, _ in cases))
    server.queue(
        json_reply(
            message(
                {"type": "thinking", "thinking": "hmm", "signature": "s"},
                tool_use("", "add", {"a": 1}),
                tool_use("dup", "add", {}),
                tool_use("dup", "get_weather", {"city": "Rome"}),
                stop="end_turn",
            )
        )
    )
    request = ModelRequest(messages=(UserMessage(content="x"),))
    async with model_for(server) as model:
        for wire, finish in cases:
            response = await model.request(request)
            assert (response.text, response.finish_reason) == ("t", finish), wire
        calls = await model.request(request)
    assert calls.finish_reason == "tool_calls"
    assert calls.text == ""
    ids = [c.id for c in calls.tool_calls]
    assert ids[1] == "dup"
    assert len(set(ids)) == 3  # a missing or repeated id gets a fresh one
    assert [c.arguments for c in calls.tool_calls] == ['{"a":1}', "{}", '{"city":"Rome"}']


# -- errors ---------------------------------------------------------------------------

#: (status, body, retryable, what the message says)
# -- configuration ---------------------------------------------------------------------


async def test_an_sdk_older_than_0_46_refuses_trio_clearly(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch, anyio_backend: str
) -> None:
    import anthropic

    monkeypatch.setattr(anthropic, "__version__", "0.45.2")
    server.queue(json_reply(message(text("ok"))))
    request = ModelRequest(messages=(UserMessage(content="x"),))
    async with model_for(server) as model:
        if anyio_backend == "trio":
            with pytest.raises(ProviderError, match="asyncio only") as caught:
                await model.request(request)
            assert "anthropic>=0.46" in str(caught.value)
            assert not caught.value.retryable
            assert server.requests == []
        else:
            assert (await model.request(request)).text == "ok"
    check_event_loop("not a version")  # unknown: let the SDK try


def test_estimate_tokens_counts_the_tool_use_prompt() -> None:
    model = AnthropicModel("m", api_key=KEY)
    one = ModelRequest(messages=(UserMessage(content="x" * 350),))
    spec = ToolSpec(name="t", description="", parameters={"type": "object"})
    with_tool = ModelRequest(messages=one.messages, tools=(spec,))
    assert model.estimate_tokens(one) == 100 + 4
    assert model.estimate_tokens(with_tool) >= model.estimate_tokens(one) + 350
