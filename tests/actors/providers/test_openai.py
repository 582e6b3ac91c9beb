"""``OpenAIModel`` against a real HTTP server on 127.0.0.1 speaking chat completions.

Every test asserts on the requests the server received: the messages and their
roles, tool calls followed by their results with the same ids, the tools array, the
output cap. No network, no real key.
"""

from __future__ import annotations

from typing import Any

import pytest

from fractor.actors import (
    Agent,
    AnthropicModel,
    DigestMessage,
    ModelRequest,
    OpenAIModel,
    ProviderError,
    SystemMessage,
    ToolSpec,
    UserMessage,
    model_from_string,
)
from fractor.runtime import Budget, Runtime

from ..loopback import LoopbackServer, Received, Reply, json_reply
from ..sample_tools import add, get_weather
from .wires import OPENAI_KEY as KEY
from .wires import completion, wire_call
from .wires import openai_error as error_body
from .wires import openai_model as model_for


def assert_results_follow_calls(messages: list[dict[str, Any]]) -> None:
    """Each tool result follows its call's assistant turn, same id; no call unanswered."""
    open_ids: list[str] = []
    for message in messages:
        if message["role"] == "tool":
            assert message["tool_call_id"] in open_ids, message
            open_ids.remove(message["tool_call_id"])
            continue
        assert not open_ids, f"calls {open_ids} have no result before {message}"
        if message["role"] == "assistant":
            open_ids = [c["id"] for c in message.get("tool_calls", ())]
    assert not open_ids, f"calls {open_ids} have no result"


def roles(messages: list[dict[str, Any]]) -> list[str]:
    return [m["role"] for m in messages]


# -- mapping --------------------------------------------------------------------------


async def test_a_final_answer_maps_both_ways(server: LoopbackServer) -> None:
    server.queue(json_reply(completion("Hello there.", cached=4)))
    request = ModelRequest(
        messages=(
            SystemMessage(content="Be brief."),
            UserMessage(content="Hi"),
            DigestMessage(content="Earlier attempts..."),
        ),
    )
    async with model_for(server) as model:
        response = await model.request(request)
    assert response.text == "Hello there."
    assert response.tool_calls == ()
    assert response.finish_reason == "stop"
    assert response.usage.input_tokens == 11
    assert response.usage.output_tokens == 7
    assert response.usage.cached_tokens == 4
    assert response.usage.requests == 1
    assert response.model == "openai:test-model-2025"
    (received,) = server.requests
    assert received.method == "POST"
    assert received.path == "/v1/chat/completions"
    assert received.headers["authorization"] == f"Bearer {KEY}"
    body = received.json()
    assert body["model"] == "test-model"
    assert body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "user", "content": "Earlier attempts..."},  # a digest is a user turn
    ]
    assert "tools" not in body
    assert "max_tokens" not in body
    assert "max_completion_tokens" not in body
    assert "stream" not in body or body["stream"] is False


async def test_a_tool_call_round_trip_through_an_agent(server: LoopbackServer) -> None:
    server.queue(
        json_reply(
            completion(
                "Let me look.",
                (wire_call("call_a", "get_weather", '{"city": "Paris"}'),),
                prompt=50,
                output=20,
            )
        ),
        json_reply(completion("Sunny, 22°C in Paris.", prompt=80, output=9)),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[get_weather], instructions="Be brief.")
        async with Runtime() as rt:
            ref = await rt.spawn(agent)
            result = await ref.ask("Weather in Paris?")
    assert result.status == "completed", result.stop_reason
    assert result.text == "Sunny, 22°C in Paris."
    assert result.usage.requests == 2
    assert result.usage.input_tokens == 130
    assert result.usage.output_tokens == 29
    first, second = (r.json() for r in server.requests)
    assert first["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Current weather for a city.",
                "parameters": agent.specs[0].parameters,
            },
        }
    ]
    assert first["tools"][0]["function"]["parameters"]["properties"]["city"]["type"] == "string"
    assert roles(first["messages"]) == ["system", "user"]
    assert second["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "tool_calls": [wire_call("call_a", "get_weather", '{"city": "Paris"}')],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "22°C and sunny in Paris"},
    ]
    assert_results_follow_calls(second["messages"])


async def test_a_tool_loop_works_with_a_server_that_refuses_null_content(
    server: LoopbackServer,
) -> None:
    # llama-cpp-python's server, seen for real: an assistant message with tool calls
    # and "content": null is answered with HTTP 500, so every native tool loop failed
    # at its second request. The server here makes the same check.
    def llama_cpp_python(request: Received) -> Reply | None:
        messages = request.json()["messages"]
        if any(m["role"] == "assistant" and m.get("content") is None for m in messages):
            return json_reply({"error": {"message": "content must be a string"}}, status=500)
        return None

    server.refuse(llama_cpp_python)
    server.queue(
        json_reply(completion(None, (wire_call("call_1", "add", '{"a": 1, "b": 2}'),))),
        json_reply(completion("3.")),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add])
        async with Runtime() as rt:
            result = await (await rt.spawn(agent)).ask("Add 1 and 2")
    assert (result.status, result.text) == ("completed", "3."), result.stop_reason
    assert len(server.requests) == 2
    assert server.requests[1].json()["messages"][1]["content"] == ""


async def test_parallel_tool_calls_keep_their_ids_and_order(server: LoopbackServer) -> None:
    calls = (
        wire_call("call_1", "add", '{"a": 1, "b": 2}'),
        wire_call("call_2", "get_weather", '{"city": "Oslo"}'),
        wire_call("call_3", "add", '{"a": "not a number", "b": 2}'),
    )
    server.queue(json_reply(completion(None, calls)), json_reply(completion("Done.")))
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add, get_weather])
        async with Runtime() as rt:
            result = await (await rt.spawn(agent)).ask("Do three things")
    assert result.status == "completed", result.stop_reason
    messages = server.requests[1].json()["messages"]
    assert roles(messages) == ["user", "assistant", "tool", "tool", "tool"]
    assert messages[1]["content"] == ""  # a string, never null (see the next test)
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["call_1", "call_2", "call_3"]
    assert [m["tool_call_id"] for m in messages[2:]] == ["call_1", "call_2", "call_3"]
    assert messages[2]["content"] == "3"
    assert messages[3]["content"] == "22°C and sunny in Oslo"
    assert "a" in messages[4]["content"]  # the validation error, as text: no error flag
    assert_results_follow_calls(messages)
    assert {t["function"]["name"] for t in server.requests[0].json()["tools"]} == {
        "add",
        "get_weather",
    }


async def test_a_second_ask_sends_no_tool_traces_of_the_first(server: LoopbackServer) -> None:
    server.queue(
        json_reply(completion(None, (wire_call("call_x", "add", '{"a": 2, "b": 3}'),))),
        json_reply(completion("It is 5.")),
        json_reply(completion("You asked about 2 + 3.")),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add], instructions="Answer.")
        async with Runtime() as rt:
            ref = await rt.spawn(agent)
            first = await ref.ask("What is 2 + 3?")
            second = await ref.ask("What did I ask?")
    assert (first.text, second.text) == ("It is 5.", "You asked about 2 + 3.")
    third = server.requests[2].json()["messages"]
    assert third == [
        {"role": "system", "content": "Answer."},
        {"role": "user", "content": "What is 2 + 3?"},
        {"role": "assistant", "content": "It is 5."},
        {"role": "user", "content": "What did I ask?"},
    ]
    assert "call_x" not in server.requests[2].body.decode()


async def test_max_tokens_carries_the_budget_reservation(server: LoopbackServer) -> None:
    server.queue(
        json_reply(completion(None, (wire_call("c1", "add", '{"a": 1, "b": 1}'),), output=100)),
        json_reply(completion("Two.", output=3)),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add], max_tokens=1000)
        async with Runtime() as rt:
            ref = await rt.spawn(agent)
            result = await ref.ask("1 + 1?", budget=Budget(output_tokens=400))
    assert result.status == "completed", result.stop_reason
    first, second = (r.json() for r in server.requests)
    # The cap is the budget's headroom: 300, then 300 - 100 spent.
    assert first["max_tokens"] == 400
    assert second["max_tokens"] == 300
    assert "max_completion_tokens" not in first


async def test_max_tokens_param_and_clamp(server: LoopbackServer) -> None:
    server.queue(json_reply(completion("ok")), json_reply(completion("ok")))
    request = ModelRequest(messages=(UserMessage(content="x"),), max_tokens=1_000_000)
    async with model_for(server, max_tokens_param="max_completion_tokens") as model:
        await model.request(request)
    async with model_for(server, max_output_tokens=None) as model:
        await model.request(request)
    first, second = (r.json() for r in server.requests)
    assert first["max_completion_tokens"] == 16_384
    assert "max_tokens" not in first
    assert second["max_tokens"] == 1_000_000
    # OpenAI itself (no base URL) reads max_completion_tokens.
    hosted = OpenAIModel("gpt-4.1-mini", api_key=KEY)
    assert hosted.body(request)["extra_body"] == {"max_completion_tokens": 16_384}
    assert hosted.name == "openai:gpt-4.1-mini"
    assert hosted.base_url == "https://api.openai.com/v1"
    await hosted.aclose()


async def test_options_are_sent_and_cannot_override_the_request(
    server: LoopbackServer,
) -> None:
    server.queue(json_reply(completion("ok")))
    options = {"temperature": 0.25, "seed": 7}
    async with model_for(server, options=options) as model:
        await model.request(ModelRequest(messages=(UserMessage(content="x"),)))
    body = server.requests[0].json()
    assert (body["temperature"], body["seed"]) == (0.25, 7)
    with pytest.raises(ValueError, match="messages, model"):
        OpenAIModel("m", api_key=KEY, options={"model": "other", "messages": []})


async def test_finish_reasons(server: LoopbackServer) -> None:
    cases = [
        ("stop", "tool_calls"),  # "stop" while calling tools: the calls decide
        ("length", "length"),
        ("content_filter", "content_filter"),
        (None, "tool_calls"),
        ("function_call", "tool_calls"),
        ("something_new", "tool_calls"),
    ]
    for wire, _ in cases:
        server.queue(json_reply(completion(None, (wire_call("c", "add", "{}"),), finish=wire)))
    server.queue(json_reply(completion("Cut sho", finish="length")))
    request = ModelRequest(messages=(UserMessage(content="x"),))
    async with model_for(server) as model:
        for wire, finish in cases:
            response = await model.request(request)
            assert response.finish_reason == finish, wire
            assert (response.text, response.tool_calls[0].arguments) == ("", "{}")
        truncated = await model.request(request)
    assert (truncated.text, truncated.finish_reason) == ("Cut sho", "length")


async def test_lenient_parsing_of_compatible_servers(server: LoopbackServer) -> None:
    odd = completion(
        None,
        (
            {"type": "function", "function": {"name": "add", "arguments": {"a": 1, "b": 2}}},
            {"id": "dup", "type": "function", "function": {"name": "add", "arguments": ""}},
            {"id": "dup", "type": "function", "function": {"name": "add", "arguments": "{}"}},
        ),
    )
    del odd["usage"]
    parts = completion(None, finish="length")
    parts["choices"][0]["message"]["content"] = [
        {"type": "text", "text": "Hel"},
        {"type": "reasoning", "reasoning": "..."},
        {"type": "text", "text": "lo"},
    ]
    refusal = completion(None, finish="stop")
    refusal["choices"][0]["message"]["refusal"] = "I can't help with that."
    server.queue(json_reply(odd), json_reply(parts), json_reply(refusal))
    request = ModelRequest(messages=(UserMessage(content="hello " * 40),))
    async with model_for(server) as model:
        calls = await model.request(request)
        text = await model.request(request)
        refused = await model.request(request)
        estimate = model.estimate_tokens(request)
    ids = [c.id for c in calls.tool_calls]
    assert ids[1] == "dup"
    assert len(set(ids)) == 3  # a missing or repeated id gets a fresh one
    assert calls.tool_calls[0].arguments == '{"a":1,"b":2}'
    assert calls.tool_calls[1].arguments == "{}"
    # No usage reported: estimated, so a budget still counts it.
    assert calls.usage.input_tokens == estimate
    assert calls.usage.output_tokens > 0
    assert calls.usage.requests == 1
    assert (text.text, text.finish_reason) == ("Hello", "length")
    assert refused.text == "I can't help with that."


# -- errors ---------------------------------------------------------------------------


#: (status, body, retryable, what the message says)
async def test_retry_headers_are_honoured(server: LoopbackServer) -> None:
    server.queue(
        json_reply(error_body("slow down"), status=429, headers=[("retry-after", "3")]),
        json_reply(error_body("no"), status=500, headers=[("x-should-retry", "false")]),
        json_reply(error_body("yes"), status=400, headers=[("x-should-retry", "true")]),
    )
    request = ModelRequest(messages=(UserMessage(content="x"),))
    errors: list[ProviderError] = []
    async with model_for(server) as model:
        for _ in range(3):
            with pytest.raises(ProviderError) as caught:
                await model.request(request)
            errors.append(caught.value)
    assert errors[0].retry_after == 3.0
    assert [e.retryable for e in errors] == [True, False, True]


# -- errors through the agent's retry policy ---------------------------------------------


# -- configuration ---------------------------------------------------------------------


async def test_the_base_url_from_the_environment(
    server: LoopbackServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.url}/v1")
    server.queue(json_reply(completion("local")))
    request = ModelRequest(messages=(UserMessage(content="x"),), max_tokens=50)
    async with OpenAIModel("llama3.2") as model:  # no key: a local server
        assert (await model.request(request)).text == "local"
    (received,) = server.requests
    assert received.headers["authorization"] == "Bearer not-needed"
    assert received.json()["max_tokens"] == 50


def test_constructor_checks() -> None:
    with pytest.raises(ValueError, match="model name"):
        OpenAIModel("  ", api_key=KEY)
    with pytest.raises(ValueError, match="timeout"):
        OpenAIModel("m", api_key=KEY, timeout=0)
    with pytest.raises(ValueError, match="max_output_tokens"):
        OpenAIModel("m", api_key=KEY, max_output_tokens=0)
    with pytest.raises(ValueError, match="max_tokens_param"):
        OpenAIModel("m", api_key=KEY, max_tokens_param="tokens")  # type: ignore[arg-type]
    assert "sk-" not in repr(OpenAIModel("m", api_key=KEY))


def test_estimate_tokens_counts_text_messages_and_tools() -> None:
    model = OpenAIModel("m", api_key=KEY)
    empty = ModelRequest(messages=())
    one = ModelRequest(messages=(UserMessage(content="x" * 400),))
    spec = ToolSpec(name="t", description="d" * 40, parameters={"type": "object"})
    with_tool = ModelRequest(messages=one.messages, tools=(spec,))
    assert model.estimate_tokens(empty) == 3
    assert model.estimate_tokens(one) == 3 + 3 + 100
    assert model.estimate_tokens(with_tool) > model.estimate_tokens(one) + 10


def test_model_strings() -> None:
    openai = model_from_string("openai:gpt-4.1-mini", api_key=KEY, temperature=0)
    assert isinstance(openai, OpenAIModel)
    assert openai.name == "openai:gpt-4.1-mini"
    ollama = model_from_string(" OpenAI:llama3.2:3b ", base_url="http://127.0.0.1:1/v1")
    assert isinstance(ollama, OpenAIModel)
    assert ollama.model == "llama3.2:3b"
    claude = model_from_string("anthropic:claude-sonnet-4-5", api_key=KEY)
    assert isinstance(claude, AnthropicModel)
    assert claude.name == "anthropic:claude-sonnet-4-5"
    for bad, says in [
        ("gpt-4.1-mini", "names no provider"),
        (":gpt-4.1-mini", "names no provider"),
        ("openai:", "names no model"),
        ("openai:  ", "names no model"),
        ("mistral:large", "unknown provider 'mistral'"),
    ]:
        with pytest.raises(ValueError, match=says):
            model_from_string(bad, api_key=KEY)
    with pytest.raises(TypeError, match="model string"):
        model_from_string(None, api_key=KEY)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="options may not set"):
        model_from_string("openai:m", api_key=KEY, max_tokens=5)
