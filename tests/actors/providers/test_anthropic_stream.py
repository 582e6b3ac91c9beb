"""``AnthropicModel.stream`` against a real HTTP server on 127.0.0.1 streaming the
Messages API's server-sent events.

Each answer is streamed from the same message a test could send in one JSON body
(``streamed``), so a streamed response is checked against what ``request`` returns
for it. No network, no real key.
"""

from __future__ import annotations

import json
import time
from typing import Any

import anyio
import anyio.to_thread
import pytest

from fractor.actors import AnthropicModel, ModelRequest, ModelResponse, ProviderError, UserMessage

from ..loopback import LoopbackServer, json_reply, sse_reply
from .wires import ANTHROPIC_KEY as KEY
from .wires import ANTHROPIC_TRIO_UNSUPPORTED as TRIO_UNSUPPORTED
from .wires import anthropic_error, message, text, tool_use
from .wires import anthropic_model as model_for
from .wires import sent_anthropic_key as sent_key

HELLO = ModelRequest(messages=(UserMessage(content="Hi"),))

Event = tuple[str, dict[str, Any]]


@pytest.fixture(autouse=True)
def sdk_runs_on_the_backend(anyio_backend: str) -> None:
    if TRIO_UNSUPPORTED and anyio_backend == "trio":
        pytest.skip("the installed anthropic SDK is older than 0.46: asyncio only")


# -- the events of a message, as Anthropic streams it -------------------------------------


def start(index: int, block: dict[str, Any]) -> Event:
    return "content_block_start", {
        "type": "content_block_start",
        "index": index,
        "content_block": block,
    }


def delta(index: int, kind: str, **fields: str) -> Event:
    return "content_block_delta", {
        "type": "content_block_delta",
        "index": index,
        "delta": {"type": kind, **fields},
    }


def stop(index: int) -> Event:
    return "content_block_stop", {"type": "content_block_stop", "index": index}


PING: Event = ("ping", {"type": "ping"})
MESSAGE_STOP: Event = ("message_stop", {"type": "message_stop"})


def message_start(**usage: int) -> Event:
    usage = {"input_tokens": 11, "output_tokens": 1, **usage}
    return "message_start", {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "model": "claude-test-2025",
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": usage,
        },
    }


def message_delta(stop_reason: str | None, **usage: int) -> Event:
    return "message_delta", {
        "type": "message_delta",
        "delta": {"stop_reason": stop_reason, "stop_sequence": None},
        "usage": usage,
    }


def cut(value: str, pieces: int) -> list[str]:
    size = max(1, -(-len(value) // pieces))
    return [value[i : i + size] for i in range(0, len(value), size)]


def streamed(whole: dict[str, Any], *, pieces: int = 3) -> list[Event]:
    """The events Anthropic sends for the message ``whole`` (as ``wires.message``
    builds it): its text and its tools' input JSON cut in ``pieces``, a ping after
    the start, the output tokens in ``message_delta``."""
    usage = dict(whole["usage"])
    output = usage.pop("output_tokens")
    events = [message_start(**usage), PING]
    for index, block in enumerate(whole["content"]):
        if block["type"] == "text":
            events.append(start(index, {"type": "text", "text": ""}))
            events += [delta(index, "text_delta", text=p) for p in cut(block["text"], pieces)]
        else:
            opened = {**block, "input": {}}
            events.append(start(index, opened))
            arguments = json.dumps(block["input"])
            events += [
                delta(index, "input_json_delta", partial_json=p) for p in cut(arguments, pieces)
            ]
        events.append(stop(index))
    events += [message_delta(whole["stop_reason"], output_tokens=output), MESSAGE_STOP]
    return events


async def stream(
    model: AnthropicModel, request: ModelRequest = HELLO
) -> tuple[ModelResponse, list[str]]:
    sink: list[str] = []
    response = await model.stream(request, sink.append)
    return response, sink


async def failure(
    model: AnthropicModel, request: ModelRequest = HELLO
) -> tuple[ProviderError, list[str]]:
    sink: list[str] = []
    with pytest.raises(ProviderError) as caught:
        await model.stream(request, sink.append)
    return caught.value, sink


def with_usage(whole: dict[str, Any], **usage: int) -> dict[str, Any]:
    return {**whole, "usage": {**whole["usage"], **usage}}


async def same_as_a_request(server: LoopbackServer, whole: dict[str, Any]) -> ModelResponse:
    """What ``request`` returns for ``whole`` sent in one JSON body (a fresh model:
    call ids it makes up start at the same number)."""
    server.queue(json_reply(whole))
    async with model_for(server) as model:
        return await model.request(HELLO)


# -- answers ------------------------------------------------------------------------------


async def test_text_comes_to_the_sink_piece_by_piece(server: LoopbackServer) -> None:
    whole = message(text("Hello there, "), text("how are you?"), input_tokens=11, output_tokens=9)
    server.queue(sse_reply(streamed(whole, pieces=3)))
    async with model_for(server) as model:
        assert model.streaming is True
        response, sink = await stream(model)
    assert sink == [*cut("Hello there, ", 3), *cut("how are you?", 3)]
    assert "".join(sink) == response.text == "Hello there, how are you?"
    assert response.finish_reason == "stop"
    assert response.model == "anthropic:claude-test-2025"
    assert (response.usage.input_tokens, response.usage.output_tokens) == (11, 9)
    assert response.usage.requests == 1
    assert response == await same_as_a_request(server, whole)
    received = server.requests[0]
    assert (received.method, received.path) == ("POST", "/v1/messages")
    assert sent_key(received) == KEY
    body = received.json()
    assert body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": [text("Hi")]}]
    assert body["max_tokens"] == 8192


async def test_usage_counts_the_cache_and_takes_the_last_figures(server: LoopbackServer) -> None:
    whole = message(text("Hi."), input_tokens=10, output_tokens=4, cache_read=5, cache_creation=3)
    server.queue(sse_reply(streamed(whole)))
    async with model_for(server) as model:
        response, _ = await stream(model)
    # Input counts every prompt token: fresh, written to the cache and read from it.
    usage = response.usage
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (18, 5, 4)
    assert response == await same_as_a_request(server, whole)

    # Newer servers repeat the input figures in message_delta: those are final.
    server.queue(
        sse_reply(
            [
                message_start(input_tokens=10, cache_read_input_tokens=0),
                start(0, text("")),
                delta(0, "text_delta", text="Hi."),
                stop(0),
                message_delta(
                    "end_turn", input_tokens=12, cache_read_input_tokens=6, output_tokens=4
                ),
                MESSAGE_STOP,
            ]
        )
    )
    async with model_for(server) as model:
        response, _ = await stream(model)
    usage = response.usage
    assert (usage.input_tokens, usage.cached_tokens, usage.output_tokens) == (18, 6, 4)


async def test_tool_calls_come_from_json_pieces(server: LoopbackServer) -> None:
    whole = message(
        text("Let me look."),
        tool_use("toolu_a", "get_weather", {"city": "Paris", "units": "metric"}),
        tool_use("", "get_weather", {"city": "Lyon"}),  # no id
        tool_use("toolu_a", "add", {"a": 1, "b": 2.5, "c": [True, None, "é"]}),  # repeated
        output_tokens=40,
    )
    server.queue(sse_reply(streamed(whole, pieces=4)))
    async with model_for(server) as model:
        response, sink = await stream(model)
    assert "".join(sink) == response.text == "Let me look."  # no argument in the text
    assert response.finish_reason == "tool_calls"
    assert [(c.id, c.name) for c in response.tool_calls] == [
        ("toolu_a", "get_weather"),
        ("fractor_call_1", "get_weather"),
        ("fractor_call_2", "add"),
    ]
    assert [json.loads(c.arguments) for c in response.tool_calls] == [
        {"city": "Paris", "units": "metric"},
        {"city": "Lyon"},
        {"a": 1, "b": 2.5, "c": [True, None, "é"]},
    ]
    assert response == await same_as_a_request(server, whole)


async def test_a_call_without_input_has_empty_arguments(server: LoopbackServer) -> None:
    server.queue(
        sse_reply(
            [
                message_start(),
                start(0, tool_use("toolu_1", "now", {})),
                stop(0),
                start(1, tool_use("toolu_2", "today", {})),
                delta(1, "input_json_delta", partial_json=""),
                stop(1),
                message_delta("tool_use", output_tokens=12),
                MESSAGE_STOP,
            ]
        )
    )
    async with model_for(server) as model:
        response, sink = await stream(model)
    assert sink == []
    assert [(c.name, c.arguments) for c in response.tool_calls] == [("now", "{}"), ("today", "{}")]
    whole = message(tool_use("toolu_1", "now", {}), tool_use("toolu_2", "today", {}))
    assert response == await same_as_a_request(server, with_usage(whole, output_tokens=12))


async def test_a_call_cut_by_max_tokens_keeps_its_json(server: LoopbackServer) -> None:
    server.queue(
        sse_reply(
            [
                message_start(),
                start(0, tool_use("toolu_1", "write", {})),
                delta(0, "input_json_delta", partial_json='{"text": "Once upon'),
                stop(0),
                message_delta("max_tokens", output_tokens=8),
                MESSAGE_STOP,
            ]
        )
    )
    async with model_for(server) as model:
        response, _ = await stream(model)
    assert response.finish_reason == "length"
    (call,) = response.tool_calls
    assert call.arguments == '{"text": "Once upon'  # for the tool loop to report


async def test_thinking_never_reaches_the_text(server: LoopbackServer) -> None:
    server.queue(
        sse_reply(
            [
                message_start(),
                start(0, {"type": "thinking", "thinking": ""}),
                delta(0, "thinking_delta", thinking="The user greets me. "),
                delta(0, "thinking_delta", thinking="Greet back."),
                delta(0, "signature_delta", signature="EqQBCgIYAhIM1gbcDa9GJwZA"),
                stop(0),
                start(1, {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix"}),
                stop(1),
                start(2, text("")),
                delta(2, "text_delta", text="Hello!"),
                stop(2),
                message_delta("end_turn", output_tokens=30),
                MESSAGE_STOP,
            ]
        )
    )
    async with model_for(server) as model:
        response, sink = await stream(model)
    assert sink == ["Hello!"]
    assert response.text == "Hello!"
    assert response.usage.output_tokens == 30


async def test_pings_and_new_kinds_of_event_are_read_past(server: LoopbackServer) -> None:
    server.queue(
        sse_reply(
            [
                PING,
                message_start(),
                PING,
                start(0, text("")),
                b": a keep-alive comment\n\n",
                delta(0, "text_delta", text="Hel"),
                PING,
                ("thinking_summary", {"type": "thinking_summary", "summary": "?"}),
                delta(0, "citations_delta", citation="{}"),
                delta(0, "text_delta", text="lo"),
                stop(0),
                PING,
                message_delta("end_turn", output_tokens=2),
                MESSAGE_STOP,
            ]
        )
    )
    async with model_for(server) as model:
        response, sink = await stream(model)
    assert sink == ["Hel", "lo"]
    assert response.text == "Hello"


async def test_a_server_that_answers_in_one_body_is_read_as_such(
    server: LoopbackServer,
) -> None:
    server.queue(json_reply(message(text("All at once."))))
    async with model_for(server) as model:
        response, sink = await stream(model)
    assert sink == ["All at once."]
    assert response.text == "All at once."


async def test_stream_false_turns_streaming_off(server: LoopbackServer) -> None:
    async with model_for(server, stream=False) as model:
        assert model.streaming is False
    with pytest.raises(TypeError, match="stream must be True or False"):
        model_for(server, stream="yes")


# -- failures -----------------------------------------------------------------------------


def started_text(*pieces: str) -> list[Event]:
    """A stream that got as far as some text (20 reported input tokens)."""
    return [
        message_start(input_tokens=20),
        start(0, text("")),
        *(delta(0, "text_delta", text=piece) for piece in pieces),
    ]


@pytest.mark.parametrize(
    ("kind", "retryable"),
    [
        ("overloaded_error", True),
        ("api_error", True),
        ("rate_limit_error", True),
        ("invalid_request_error", False),
    ],
)
async def test_an_error_event_mid_stream(
    server: LoopbackServer, kind: str, retryable: bool
) -> None:
    server.queue(
        sse_reply(
            [*started_text("Once ", "upon a "), ("error", anthropic_error(kind, "Overloaded now"))]
        )
    )
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == ["Once ", "upon a "]  # what came stays with the caller
    assert error.retryable is retryable
    assert kind in str(error)
    assert "Overloaded now" in str(error)
    assert "part-way" in str(error)
    assert error.usage is not None
    assert error.usage.input_tokens == 20  # reported
    assert error.usage.output_tokens == 4  # 12 characters received, 3.5 a token
    assert error.usage.requests == 1


async def test_a_cut_stream_is_retryable_and_says_what_it_spent(server: LoopbackServer) -> None:
    server.queue(sse_reply(started_text("Once ", "upon a ", "time"), complete=False))
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == ["Once ", "upon a ", "time"]
    assert error.retryable is True
    assert "broke off" in str(error)
    assert error.usage is not None
    assert (error.usage.input_tokens, error.usage.output_tokens) == (20, 5)


async def test_a_stream_cut_before_its_start_estimates_the_input(server: LoopbackServer) -> None:
    server.queue(sse_reply([], complete=False))
    async with model_for(server) as model:
        error, sink = await failure(model)
        estimate = model.estimate_tokens(HELLO)
    assert sink == []
    assert error.retryable is True
    assert error.usage is not None
    assert (error.usage.input_tokens, error.usage.output_tokens) == (estimate, 0)
    assert estimate > 0


async def test_a_stream_that_ends_without_message_stop_broke_off(
    server: LoopbackServer,
) -> None:
    server.queue(sse_reply([*started_text("Hi"), stop(0), message_delta("end_turn")]))
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == ["Hi"]
    assert error.retryable is True
    assert "message_stop" in str(error)
    assert error.usage is not None
    assert (error.usage.input_tokens, error.usage.output_tokens) == (20, 1)


@pytest.mark.parametrize(
    "ending",
    [
        [stop(0), MESSAGE_STOP],  # no message_delta at all
        [stop(0), message_delta(None, output_tokens=3), MESSAGE_STOP],  # a null stop_reason
    ],
    ids=["no-message-delta", "null-stop-reason"],
)
async def test_a_stream_that_stops_without_a_stop_reason_broke_off(
    server: LoopbackServer, ending: list[Event]
) -> None:
    # message_stop says the stream ended, not that the answer did: only a stop_reason
    # says the message is complete.
    server.queue(sse_reply([*started_text("Half an", " ans"), *ending]))
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == ["Half an", " ans"]
    assert error.retryable is True
    assert "broke off" in str(error)
    assert "without a stop_reason" in str(error)
    assert error.usage is not None
    assert error.usage.input_tokens == 20


#: What a llama.cpp-family server streams for a list of numbers: a token a delta,
#: one character each (digits and line breaks), 311 tokens in all.
DIGITS = [*"\n".join(str(i % 10) for i in range(156))]


@pytest.mark.parametrize("complete", [True, False], ids=["ended", "dropped"])
async def test_a_cut_stream_is_charged_at_least_a_token_a_piece(
    server: LoopbackServer, complete: bool
) -> None:
    assert len(DIGITS) == 311
    server.queue(sse_reply(started_text(*DIGITS), complete=complete))
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == DIGITS
    assert -(-311 * 2 // 7) == 89  # what characters alone say (3.5 a token)
    assert error.usage is not None
    assert (error.usage.input_tokens, error.usage.output_tokens) == (20, 311)


@pytest.mark.parametrize(
    ("garbage", "names"),
    [
        (b"event: content_block_delta\ndata: {not json\n\n", "content_block_delta"),
        (b'data: {"type": "content_block_delta", "index": "x"}\n\n', "index"),
        (b'data: {"index": 0}\n\n', "not a Messages API stream event"),
        (b"data: [1, 2]\n\n", "not a Messages API stream event"),
    ],
)
async def test_garbage_is_a_clear_malformed_error(
    server: LoopbackServer, garbage: bytes, names: str
) -> None:
    server.queue(sse_reply([*started_text("Hello ", "wor"), garbage, MESSAGE_STOP]))
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == ["Hello ", "wor"]  # nothing lost
    assert "malformed" in str(error)
    assert names in str(error)
    assert error.retryable is True
    assert error.usage is not None
    assert (error.usage.input_tokens, error.usage.output_tokens) == (20, 3)


@pytest.mark.parametrize(
    ("events", "names"),
    [
        ([message_start(), delta(0, "text_delta", text="Hi")], "never started"),
        ([message_start(), start(0, {"type": "tool_use", "id": "x", "input": {}})], "no name"),
        ([message_start(), start(0, text("")), start(0, text(""))], "started twice"),
        ([start(0, text("")), stop(0), message_delta("end_turn"), MESSAGE_STOP], "message_start"),
    ],
)
async def test_events_out_of_order_are_malformed(
    server: LoopbackServer, events: list[Event], names: str
) -> None:
    server.queue(sse_reply([*events, MESSAGE_STOP]))
    async with model_for(server) as model:
        error, _ = await failure(model)
    assert "malformed" in str(error)
    assert names in str(error)


async def test_an_http_error_before_the_stream_is_classified(server: LoopbackServer) -> None:
    server.queue(json_reply(anthropic_error("overloaded_error", "Overloaded"), status=529))
    async with model_for(server) as model:
        error, sink = await failure(model)
    assert sink == []
    assert (error.status, error.retryable) == (529, True)
    assert error.usage is None  # nothing was generated


async def test_the_key_never_appears_in_an_error(server: LoopbackServer) -> None:
    server.queue(
        sse_reply([*started_text("Hi"), ("error", anthropic_error("api_error", f"bad {KEY}"))]),
        sse_reply([*started_text("Hi"), f"data: {{{KEY}\n\n".encode()]),
    )
    async with model_for(server) as model:
        echoed, _ = await failure(model)
        garbled, _ = await failure(model)
    for error in (echoed, garbled):
        assert KEY not in f"{error} {error.what} {error.advice} {error!r}"
    assert "[redacted]" in str(echoed)  # the server's words, less the key


async def test_a_deadline_closes_the_connection_at_once(server: LoopbackServer) -> None:
    server.queue(sse_reply(started_text("Once ", "upon"), hang=30))
    sink: list[str] = []
    async with model_for(server) as model:
        began = time.monotonic()
        with anyio.move_on_after(0.3) as scope:
            await model.stream(HELLO, sink.append)
        returned = time.monotonic()
        gone = await anyio.to_thread.run_sync(server.wait_disconnect, 5.0)
    assert scope.cancelled_caught
    assert returned - began < 2.0
    assert gone - began < 2.0  # the server saw the client go, long before its 30 s
    assert sink == ["Once ", "upon"]
