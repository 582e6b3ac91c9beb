"""Typed answers over the wire, against loopback servers: OpenAI's native structured
output (``response_format`` ``json_schema``) and Anthropic's final-answer tool; a
valid answer, and a bad one corrected. No network, no real key."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from fractor.actors import Agent, ModelRequest, OutputSchema, ProviderError, Result, UserMessage
from fractor.actors._execution._output import inlined
from fractor.runtime import Runtime

from ..loopback import LoopbackServer, json_reply
from .test_openai_stream import answer as streamed_answer
from .wires import (
    ANTHROPIC_TRIO_UNSUPPORTED,
    anthropic_model,
    completion,
    message,
    openai_model,
    tool_use,
)
from .wires import text as text_block


class Weather(msgspec.Struct, frozen=True):
    city: str
    temp: int


SCHEMA = inlined(msgspec.json.schema(Weather))
PARIS = Weather(city="Paris", temp=22)


@pytest.fixture
def anthropic_backend(anyio_backend: str) -> None:
    if ANTHROPIC_TRIO_UNSUPPORTED and anyio_backend == "trio":
        pytest.skip("the installed anthropic SDK is older than 0.46: asyncio only")


async def ask(agent: Agent) -> Result:
    async with Runtime() as rt:
        return await (await rt.spawn(agent)).ask("Weather in Paris?")


# -- OpenAI: native structured output ---------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_openai_asks_for_the_schema_as_response_format(
    server: LoopbackServer, stream: bool
) -> None:
    body = '{"city": "Paris", "temp": 22}'
    server.queue(streamed_answer(body) if stream else json_reply(completion(body)))
    model = openai_model(server, stream=stream)
    result = await ask(Agent("weather", model, output_type=Weather))
    await model.aclose()
    assert result.status == "completed", result.stop_reason
    assert result.output == PARIS
    assert result.text == '{"city":"Paris","temp":22}'
    (sent,) = server.requests
    assert sent.json()["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "Weather", "schema": SCHEMA, "strict": False},
    }
    assert "tools" not in sent.json()


async def test_openai_a_bad_answer_is_corrected(server: LoopbackServer) -> None:
    server.queue(
        json_reply(completion('{"city": "Paris", "temp": "warm"}')),
        json_reply(completion('{"city": "Paris", "temp": 22}')),
    )
    model = openai_model(server, stream=False)
    result = await ask(Agent("weather", model, output_type=Weather))
    await model.aclose()
    assert result.output == PARIS
    first, second = (received.json() for received in server.requests)
    assert second["response_format"] == first["response_format"]
    said, told = second["messages"][-2:]
    assert said == {"role": "assistant", "content": '{"city": "Paris", "temp": "warm"}'}
    assert told["role"] == "user"
    assert "Expected `int`, got `str` - at `$.temp`" in told["content"]
    assert result.usage.requests == 2


async def test_openai_the_requests_schema_takes_the_place_of_one_in_options(
    server: LoopbackServer,
) -> None:
    server.queue(json_reply(completion('{"city": "Paris", "temp": 22}')))
    model = openai_model(server, stream=False, options={"response_format": {"type": "json_object"}})
    result = await ask(Agent("weather", model, output_type=Weather))
    await model.aclose()
    assert result.output == PARIS
    assert server.requests[0].json()["response_format"]["type"] == "json_schema"


async def test_openai_without_structured_output_takes_the_final_answer_tool(
    server: LoopbackServer,
) -> None:
    call = {
        "id": "call_9",
        "type": "function",
        "function": {"name": "final_answer", "arguments": '{"city": "Paris", "temp": 22}'},
    }
    server.queue(json_reply(completion(None, (call,))))
    model = openai_model(server, stream=False, structured_output=False)
    result = await ask(Agent("weather", model, output_type=Weather))
    await model.aclose()
    assert result.output == PARIS
    sent = server.requests[0].json()
    assert "response_format" not in sent
    assert sent["tools"][0]["function"]["name"] == "final_answer"
    assert sent["tools"][0]["function"]["parameters"] == SCHEMA


def test_openai_estimates_count_the_schema(server: LoopbackServer) -> None:
    model = openai_model(server)
    plain = ModelRequest(messages=(UserMessage(content="Weather?"),))
    typed = msgspec.structs.replace(
        plain, output_schema=OutputSchema(name="Weather", schema=SCHEMA)
    )
    assert model.estimate_tokens(typed) > model.estimate_tokens(plain)


# -- Anthropic: the final-answer tool ---------------------------------------------------


async def test_anthropic_offers_the_final_answer_tool_and_reads_its_input(
    server: LoopbackServer, anthropic_backend: None
) -> None:
    server.queue(
        json_reply(message(tool_use("toolu_1", "final_answer", {"city": "Paris", "temp": 22})))
    )
    model = anthropic_model(server, stream=False)
    result = await ask(Agent("weather", model, output_type=Weather))
    await model.aclose()
    assert result.status == "completed", result.stop_reason
    assert result.output == PARIS
    assert result.text == '{"city":"Paris","temp":22}'
    sent = server.requests[0].json()
    (offered,) = sent["tools"]
    assert offered["name"] == "final_answer"
    assert offered["input_schema"] == SCHEMA
    assert "tool_choice" not in sent


async def test_anthropic_bad_input_is_a_tool_error_the_model_corrects(
    server: LoopbackServer, anthropic_backend: None
) -> None:
    server.queue(
        json_reply(
            message(text_block("Here."), tool_use("toolu_1", "final_answer", {"city": "Paris"}))
        ),
        json_reply(message(tool_use("toolu_2", "final_answer", {"city": "Paris", "temp": 22}))),
    )
    model = anthropic_model(server, stream=False)
    result = await ask(Agent("weather", model, output_type=Weather))
    await model.aclose()
    assert result.output == PARIS
    turns: list[dict[str, Any]] = server.requests[1].json()["messages"]
    asked, answered = turns[-2:]
    assert asked["content"][-1]["id"] == "toolu_1"
    (result_block,) = answered["content"]
    assert result_block["type"] == "tool_result"
    assert result_block["tool_use_id"] == "toolu_1"
    assert result_block["is_error"] is True
    assert "Object missing required field `temp`" in result_block["content"]


async def test_anthropic_refuses_a_native_schema(server: LoopbackServer) -> None:
    model = anthropic_model(server)
    request = ModelRequest(
        messages=(UserMessage(content="Weather?"),),
        output_schema=OutputSchema(name="Weather", schema=SCHEMA),
    )
    with pytest.raises(ProviderError, match="no native structured output"):
        model.body(request)
    assert server.requests == []
