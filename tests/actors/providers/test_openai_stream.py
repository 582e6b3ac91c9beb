"""``OpenAIModel.stream`` against a real HTTP server on 127.0.0.1 streaming chat
completion chunks, as OpenAI and the OpenAI-compatible servers people run send them
(llama.cpp's llama-server, llama-cpp-python, vLLM, Ollama, LM Studio, Azure).

Each quirk test reproduces what one of those servers sends and checks the streamed
response against what ``request`` returns for the same completion in one JSON body.
No network, no real key.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread
import pytest

from fractor.actors import (
    Agent,
    ModelRequest,
    ModelResponse,
    OpenAIModel,
    ProviderError,
    RetryPolicy,
    ToolCall,
    ToolSpec,
    Usage,
    UserMessage,
)
from fractor.actors.providers._estimates import estimate_output_tokens
from fractor.runtime import Runtime

from ..loopback import LoopbackServer, Received, Reply, json_reply, sse_reply, text_reply
from ..sample_tools import add
from .wires import OPENAI_KEY as KEY
from .wires import completion, wire_call
from .wires import openai_model as model_for

HELLO = ModelRequest(messages=(UserMessage(content="Hi"),))


# -- chunks, as OpenAI streams them --------------------------------------------------------


def chunk(
    delta: dict[str, Any] | None = None,
    *,
    finish: str | None = None,
    usage: dict[str, Any] | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` with one choice (``delta`` None: no choices)."""
    body: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1,
        "model": "test-model-2025",
        "choices": []
        if delta is None
        else [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}],
        **fields,
    }
    if usage is not None:
        body["usage"] = usage
    return body


def usage(prompt: int = 11, output: int = 7, cached: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": output,
        "total_tokens": prompt + output,
    }
    if cached is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached}
    return body


def texts(*pieces: str, finish: str = "stop") -> list[dict[str, Any]]:
    """The chunks of an answer: the role, one chunk per piece, the finish reason."""
    return [
        chunk({"role": "assistant", "content": ""}),
        *(chunk({"content": piece}) for piece in pieces),
        chunk({}, finish=finish),
    ]


def answer(*pieces: str, prompt: int = 11, output: int = 7, **options: Any) -> Reply:
    """A streamed answer as OpenAI sends it: text, finish, usage chunk, [DONE]."""
    return sse_reply([*texts(*pieces), chunk(usage=usage(prompt, output))], done=True, **options)


def llama_cpp_python(*pieces: str, finish: str | None = None) -> list[dict[str, Any]]:
    """The chunks of an answer as llama-cpp-python's server streams it: a role-only
    first delta, one chunk per piece (a token), never any usage; ``finish`` on a
    last empty delta (None: the stream was interrupted before it)."""
    events = [chunk({"role": "assistant"}), *(chunk({"content": piece}) for piece in pieces)]
    if finish is not None:
        events.append(chunk({}, finish=finish))
    return events


def fragment(
    index: int | None, call_id: str | None, name: str | None, arguments: Any
) -> dict[str, Any]:
    """One piece of a streamed tool call (None leaves a field out, as servers do)."""
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    piece: dict[str, Any] = {"type": "function", "function": function}
    if index is not None:
        piece["index"] = index
    if call_id is not None:
        piece["id"] = call_id
    return piece


async def stream(
    model: OpenAIModel, request: ModelRequest = HELLO
) -> tuple[ModelResponse, list[str]]:
    """The response and what reached the sink, within a second."""
    pieces: list[str] = []
    with anyio.fail_after(1):
        response = await model.stream(request, pieces.append)
    return response, pieces


async def stream_error(
    model: OpenAIModel, request: ModelRequest = HELLO
) -> tuple[ProviderError, list[str]]:
    """The error the stream raised and what reached the sink before it."""
    pieces: list[str] = []
    with anyio.fail_after(1), pytest.raises(ProviderError) as caught:
        await model.stream(request, pieces.append)
    return caught.value, pieces


def estimated(model: OpenAIModel, received: int, request: ModelRequest = HELLO) -> Usage:
    """The usage of a request whose server reported none: estimates."""
    return Usage(
        input_tokens=model.estimate_tokens(request),
        output_tokens=estimate_output_tokens("", received),
        requests=1,
    )


# -- what a stream must do -----------------------------------------------------------------


async def test_deltas_reach_the_sink_in_order_and_join_to_the_text(
    server: LoopbackServer,
) -> None:
    pieces = ("Hel", "lo, ", "wor", "ld", "!")
    server.queue(answer(*pieces, prompt=9, output=5), json_reply(completion("Hello, world!")))
    async with model_for(server) as model:
        response, sunk = await stream(model)
        whole = await model.request(HELLO)
    assert sunk == list(pieces)
    assert response.text == "".join(pieces)
    assert response.finish_reason == "stop"
    assert response.usage == Usage(input_tokens=9, output_tokens=5, requests=1)
    assert response.model == "openai:test-model-2025"
    assert (response.text, response.tool_calls, response.model) == (
        whole.text,
        whole.tool_calls,
        whole.model,
    )


async def test_the_request_asks_for_a_stream_with_usage(server: LoopbackServer) -> None:
    server.queue(answer("Hi"), json_reply(completion("Hi")))
    request = ModelRequest(messages=(UserMessage(content="Hi"),), max_tokens=64)
    async with model_for(server, options={"temperature": 0.5}) as model:
        await stream(model, request)
        await model.request(request)
    streamed, whole = (r.json() for r in server.requests)
    assert server.requests[0].path == "/v1/chat/completions"
    assert streamed.pop("stream") is True
    assert streamed.pop("stream_options") == {"include_usage": True}
    assert streamed == whole  # otherwise the very same request
    assert (whole["max_tokens"], whole["temperature"]) == (64, 0.5)


async def test_tool_calls_stream_in_fragments(server: LoopbackServer) -> None:
    server.queue(
        sse_reply(
            [
                chunk({"role": "assistant", "content": None}),
                chunk({"content": "Let me look."}),
                chunk({"tool_calls": [fragment(0, "call_a", "get_weather", "")]}),
                chunk({"tool_calls": [fragment(0, None, None, '{"ci')]}),
                chunk({"tool_calls": [fragment(1, "call_b", "add", '{"a": 1, ')]}),
                chunk({"tool_calls": [fragment(0, None, None, 'ty": "Paris"}')]}),
                chunk({"tool_calls": [fragment(1, None, None, '"b": 2}')]}),
                chunk({}, finish="tool_calls"),
                chunk(usage=usage(30, 25)),
            ],
            done=True,
        )
    )
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert sunk == ["Let me look."]  # tool arguments are no text
    assert response.text == "Let me look."
    assert response.tool_calls == (
        ToolCall(id="call_a", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_b", name="add", arguments='{"a": 1, "b": 2}'),
    )
    assert response.finish_reason == "tool_calls"
    assert response.usage == Usage(input_tokens=30, output_tokens=25, requests=1)


async def test_a_cut_stream_is_a_retryable_error_with_usage(server: LoopbackServer) -> None:
    server.queue(sse_reply(texts("Once upon", " a time")[:-1], complete=False))
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
        expected = estimated(model, len("Once upon a time"))
    assert sunk == ["Once upon", " a time"]  # what came before the cut, in order
    assert error.retryable
    assert "stream broke off" in str(error)
    assert error.usage == expected
    assert error.usage.output_tokens == 4


async def test_a_stream_that_ends_early_is_a_retryable_error(server: LoopbackServer) -> None:
    # The body ends cleanly, but before any finish_reason or [DONE].
    server.queue(sse_reply(texts("Half an ans")[:-1]))
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
    assert (sunk, error.retryable) == (["Half an ans"], True)
    assert "without a finish_reason or [DONE]" in str(error)
    assert error.usage is not None
    assert error.usage.output_tokens == 3


@pytest.mark.parametrize(
    ("event", "said", "retryable"),
    [
        # OpenAI and vLLM: an error object as a chunk's data.
        (
            {"error": {"message": "model crashed", "type": "server_error", "code": None}},
            "server_error: model crashed",
            True,
        ),
        (
            {
                "error": {
                    "object": "error",
                    "message": "CUDA OOM",
                    "type": "InternalServerError",
                    "param": None,
                    "code": 500,
                }
            },
            "500 InternalServerError: CUDA OOM",
            True,
        ),
        # llama.cpp: its error object, retryable or the request's fault.
        (
            {"error": {"code": 500, "message": "decode failed", "type": "server_error"}},
            "500 server_error: decode failed",
            True,
        ),
        (
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size",
                    "type": "exceed_context_size_error",
                }
            },
            "400 exceed_context_size_error: the request exceeds",
            False,
        ),
        # Older llama.cpp: an ``error:`` line instead of ``data:``.
        (
            b'error: {"code": 500, "message": "slot unavailable", "type": "server_error"}\n\n',
            "500 server_error: slot unavailable",
            True,
        ),
        (
            b'error: {"code":400,"message":"bad grammar","type":"invalid_request_error"}\n\n',
            "400 invalid_request_error: bad grammar",
            False,
        ),
        ({"error": "upstream went away"}, "upstream went away", True),
    ],
)
async def test_an_error_in_the_middle_of_the_stream(
    server: LoopbackServer, event: Any, said: str, retryable: bool
) -> None:
    server.queue(sse_reply([*texts("Partial")[:-1], event]))
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
        expected = estimated(model, len("Partial"))
    assert sunk == ["Partial"]
    assert "error in the middle of the stream" in str(error)
    assert said in str(error)
    assert error.retryable is retryable
    assert error.usage == expected


async def test_garbage_in_the_stream_is_malformed_and_loses_nothing(
    server: LoopbackServer,
) -> None:
    server.queue(
        sse_reply([*texts("Good ", "so far")[:-1], b"data: {not json at all\n\n", chunk({})])
    )
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
        expected = estimated(model, len("Good so far"))
    assert sunk == ["Good ", "so far"]
    assert error.retryable
    assert "malformed" in str(error)
    assert "chunk 4 of the stream" in str(error)
    assert "{not json at all" in str(error)
    assert error.usage == expected


async def test_a_chunk_of_the_wrong_shape_is_malformed(server: LoopbackServer) -> None:
    server.queue(sse_reply([chunk({"content": "ok"}), {"choices": [{"delta": {"content": 5}}]}]))
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
    assert sunk == ["ok"]
    assert "malformed" in str(error)
    assert "content" in str(error)


async def test_a_deadline_mid_stream_closes_the_connection(server: LoopbackServer) -> None:
    events = texts(*(f"word{i} " for i in range(100)))
    server.queue(sse_reply(events, gap=0.05, hang=30))
    pieces: list[str] = []
    async with model_for(server) as model:
        started = time.monotonic()
        with anyio.fail_after(2):
            with anyio.move_on_after(0.3) as scope:
                await model.stream(HELLO, pieces.append)
            cancelled = time.monotonic()
            assert scope.cancelled_caught
            gone = await anyio.to_thread.run_sync(server.wait_disconnect, 2.0)
    assert cancelled - started < 0.6  # it returned promptly
    assert gone - cancelled < 1.0  # and the server saw the client go
    assert 1 <= len(pieces) < 100
    assert pieces == [f"word{i} " for i in range(len(pieces))]
    assert server.disconnects == [gone]


async def test_a_failing_sink_raises_its_own_error(server: LoopbackServer) -> None:
    # The caller's bug is no provider error: not retried, raised as it is.
    server.queue(answer("a", "b"))

    def sink(text: str) -> None:
        raise KeyError(text)

    async with model_for(server) as model:
        with anyio.fail_after(1), pytest.raises(KeyError, match="'a'"):
            await model.stream(HELLO, sink)


async def test_an_http_error_before_the_stream_is_classified_as_for_a_request(
    server: LoopbackServer,
) -> None:
    server.queue(
        json_reply({"error": {"message": "slow down", "code": "rate_limit"}}, status=429),
        json_reply({"error": {"message": "no such model"}}, status=404),
    )
    async with model_for(server) as model:
        busy, _ = await stream_error(model)
        missing, _ = await stream_error(model)
    assert (busy.status, busy.retryable, busy.usage) == (429, True, None)
    assert (missing.status, missing.retryable) == (404, False)
    assert "check the model name" in str(missing)


async def test_the_key_never_appears_in_an_error(server: LoopbackServer) -> None:
    canary = "sk-canary-stream-7c41d09e5b"
    said = f"Incorrect API key provided: {canary}"
    server.queue(
        json_reply({"error": {"message": said, "code": "invalid_api_key"}}, status=401),
        sse_reply([*texts("x")[:-1], {"error": {"message": said, "type": "server_error"}}]),
        sse_reply([*texts("x")[:-1], f"data: {{garbage {canary}\n\n".encode()]),
        sse_reply([chunk({"content": f"key {canary}"})], complete=False),
        sse_reply([f'error: {{"message": "{said}", "code": 500}}\n\n'.encode()]),
    )
    seen: list[str] = []
    async with model_for(server, api_key=canary) as model:
        for _ in range(5):
            error, _ = await stream_error(model)
            seen += [str(error), repr(error), error.what, error.advice]
    assert server.pending == 0
    assert all(canary not in text for text in seen), seen
    assert sum("[redacted]" in text for text in seen) >= 4


async def test_stream_can_be_turned_off() -> None:
    assert OpenAIModel("m", api_key=KEY).streaming is True
    assert OpenAIModel("m", api_key=KEY, stream=False).streaming is False
    with pytest.raises(TypeError, match="stream must be True or False"):
        OpenAIModel("m", api_key=KEY, stream="no")  # type: ignore[arg-type]


async def test_an_agent_streams_a_tool_loop_past_a_server_that_refuses_null_content(
    server: LoopbackServer,
) -> None:
    # llama-cpp-python's server answers an assistant message with "content": null with
    # HTTP 500; a streamed tool call (its content null) must go back as "".
    def llama_cpp_python(request: Received) -> Reply | None:
        messages = request.json()["messages"]
        if any(m["role"] == "assistant" and m.get("content") is None for m in messages):
            return json_reply({"error": {"message": "content must be a string"}}, status=500)
        return None

    server.refuse(llama_cpp_python)
    server.queue(
        sse_reply(
            [
                chunk({"role": "assistant", "content": None}),
                chunk({"tool_calls": [fragment(0, "call_1", "add", '{"a": 1, "b": 2}')]}),
                chunk({}, finish="tool_calls"),
            ],
            done=True,
        ),
        answer("3", "."),
    )
    async with model_for(server) as model:
        agent = Agent("assistant", model, tools=[add])
        async with Runtime() as rt:
            with anyio.fail_after(2):
                result = await (await rt.spawn(agent)).ask("Add 1 and 2")
    assert (result.status, result.text) == ("completed", "3."), result.stop_reason
    assert [r.json().get("stream") for r in server.requests] == [True, True]
    second = server.requests[1].json()["messages"]
    assert second[1]["content"] == ""
    assert second[1]["tool_calls"][0]["id"] == "call_1"
    assert second[2] == {"role": "tool", "tool_call_id": "call_1", "content": "3"}


# -- the quirks of the servers people run --------------------------------------------------


WITH_TOOLS = ModelRequest(
    messages=(UserMessage(content="Add 1 and 2"),),
    tools=(ToolSpec(name="add", description="Add two numbers.", parameters={"type": "object"}),),
)


def chatml_function_calling(*, complete: bool = True) -> Callable[[Received], Reply | None]:
    """llama-cpp-python's ``chatml-function-calling`` chat format: a streamed request
    with tools fails inside the server once the stream's HTTP 200 went out (``assert
    stream is False``), so the body is empty; it ends (``complete``), or the
    connection drops."""

    def check(request: Received) -> Reply | None:
        body = request.json()
        if body.get("stream") and body.get("tools"):
            return sse_reply([], complete=complete)
        return None

    return check


ENDS = pytest.mark.parametrize("complete", [True, False], ids=["ended", "dropped"])


@ENDS
async def test_an_empty_stream_for_a_request_with_tools_says_to_turn_streaming_off(
    server: LoopbackServer, complete: bool
) -> None:
    server.queue(sse_reply([], complete=complete), sse_reply([], complete=complete))
    async with model_for(server) as model:
        error, sunk = await stream_error(model, WITH_TOOLS)
        without_tools, _ = await stream_error(model)
        expected = estimated(model, 0, WITH_TOOLS)
    assert sunk == []
    assert error.retryable is False
    assert (error.status, error.usage) == (200, expected)
    assert "empty body" in str(error)
    assert "chatml-function-calling" in str(error)
    assert "stream=False" in str(error)
    # Without tools an empty body is no such quirk: a stream that broke off.
    assert without_tools.retryable is True
    assert "stream=False" not in str(without_tools)


async def test_a_silent_stream_for_a_request_with_tools_is_a_stall_not_that_quirk(
    server: LoopbackServer,
) -> None:
    # Nothing yet, the connection still open (a long prompt being read): the timeout
    # ends it, retryable; the server has said nothing of what it cannot do.
    server.queue(sse_reply([], hang=30))
    async with model_for(server, timeout=0.2) as model:
        error, _ = await stream_error(model, WITH_TOOLS)
    assert error.retryable is True
    assert "stream=False" not in str(error)


@ENDS
async def test_an_agent_does_not_resend_a_streamed_request_with_tools_to_chatml_function_calling(
    server: LoopbackServer, complete: bool
) -> None:
    server.refuse(chatml_function_calling(complete=complete))
    async with model_for(server) as model:
        agent = Agent(
            "assistant", model, tools=[add], retry=RetryPolicy(retries=3, initial_delay=0)
        )
        async with Runtime() as rt:
            with anyio.fail_after(2):
                result = await (await rt.spawn(agent)).ask("Add 1 and 2")
    assert len(server.requests) == 1  # not resent
    assert result.status == "failed"
    assert "stream=False" in result.stop_reason
    assert "chatml-function-calling" in result.stop_reason
    assert result.usage.requests == 1


async def test_the_same_server_with_stream_false_runs_the_tool_loop(server: LoopbackServer) -> None:
    server.refuse(chatml_function_calling())
    server.queue(
        json_reply(completion(None, (wire_call("call_1", "add", '{"a": 1, "b": 2}'),))),
        json_reply(completion("3.")),
    )
    async with model_for(server, stream=False) as model:
        agent = Agent("assistant", model, tools=[add])
        async with Runtime() as rt:
            with anyio.fail_after(2):
                result = await (await rt.spawn(agent)).ask("Add 1 and 2")
    assert (result.status, result.text) == ("completed", "3."), result.stop_reason
    assert [r.json().get("stream") for r in server.requests] == [None, None]


#: What a llama.cpp-family server streams for a list of numbers: a token a chunk,
#: one character each (digits and line breaks), 311 tokens in all.
DIGITS = [*"\n".join(str(i % 10) for i in range(156))]


@pytest.mark.parametrize(
    "end",
    [
        {"done": True},  # llama-cpp-python interrupted: [DONE], no finish_reason
        {"complete": False},  # the connection dropped
    ],
    ids=["done-without-finish", "dropped"],
)
async def test_a_cut_stream_is_charged_at_least_a_token_a_piece(
    server: LoopbackServer, end: dict[str, Any]
) -> None:
    assert len(DIGITS) == 311
    server.queue(sse_reply(llama_cpp_python(*DIGITS), **end))
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
        input_estimate = model.estimate_tokens(HELLO)
    assert sunk == DIGITS
    assert estimate_output_tokens("", len(DIGITS)) == 78  # what characters alone say
    assert error.usage == Usage(input_tokens=input_estimate, output_tokens=311, requests=1)


async def test_a_complete_stream_without_usage_is_charged_at_least_a_token_a_piece(
    server: LoopbackServer,
) -> None:
    server.queue(sse_reply(llama_cpp_python(*DIGITS, finish="stop"), done=True))
    async with model_for(server) as model:
        response, _ = await stream(model)
    assert response.text == "".join(DIGITS)
    assert response.usage.output_tokens == 311


async def test_no_usage_in_the_stream_is_estimated(server: LoopbackServer) -> None:
    # A server that ignores stream_options (older vLLM, Ollama, LM Studio): no usage.
    # The estimate is the one ``request`` makes for a completion without usage.
    no_usage = completion("The answer is 42.")
    del no_usage["usage"]
    server.queue(sse_reply(texts("The answer", " is 42."), done=True), json_reply(no_usage))
    async with model_for(server) as model:
        response, _ = await stream(model)
        whole = await model.request(HELLO)
        input_estimate = model.estimate_tokens(HELLO)
    assert response.usage == whole.usage
    assert response.usage == Usage(
        input_tokens=input_estimate,
        output_tokens=estimate_output_tokens("The answer is 42."),
        requests=1,
    )


async def test_usage_in_a_final_chunk_without_choices(server: LoopbackServer) -> None:
    # OpenAI with include_usage: the last chunk has "choices": [] and the usage.
    server.queue(sse_reply([*texts("Hi"), chunk(usage=usage(20, 3, cached=16))], done=True))
    async with model_for(server) as model:
        response, _ = await stream(model)
    assert response.usage == Usage(input_tokens=20, output_tokens=3, cached_tokens=16, requests=1)


async def test_usage_on_every_chunk_counts_once_the_last(server: LoopbackServer) -> None:
    # vLLM's continuous_usage_stats (and llama.cpp's last chunk): cumulative usage on
    # every chunk, and "usage": null on some; the last figures win, never summed.
    events = [
        chunk({"role": "assistant", "content": ""}, usage=usage(50, 0)),
        chunk({"content": "One"}, usage=usage(50, 1)),
        chunk({"content": " two"}, usage=None),
        chunk({"content": " three"}, usage=usage(50, 3)),
        {**chunk({}, finish="stop"), "usage": None},
        chunk(usage=usage(50, 4)),
    ]
    server.queue(sse_reply(events, done=True))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert sunk == ["One", " two", " three"]
    assert response.usage == Usage(input_tokens=50, output_tokens=4, requests=1)


async def test_the_server_usage_is_attached_to_an_error(server: LoopbackServer) -> None:
    # vLLM's continuous usage, then the connection drops: its figures, not estimates.
    server.queue(
        sse_reply(
            [chunk({"content": "a"}, usage=usage(50, 1)), chunk({"content": "b"})], complete=False
        )
    )
    async with model_for(server) as model:
        error, _ = await stream_error(model)
    assert error.usage == Usage(input_tokens=50, output_tokens=1, requests=1)


async def test_no_done_after_the_finish_reason_is_complete(server: LoopbackServer) -> None:
    # ik_llama.cpp, some proxies: no "data: [DONE]", the body just ends.
    server.queue(sse_reply([*texts("Done", "."), chunk(usage=usage(5, 2))], done=False))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert (response.text, sunk, response.finish_reason) == ("Done.", ["Done", "."], "stop")
    assert response.usage == Usage(input_tokens=5, output_tokens=2, requests=1)


async def test_done_without_a_finish_reason_is_a_cut_stream(server: LoopbackServer) -> None:
    # llama-cpp-python (interrupt_requests, its default) ends a stream with [DONE] and
    # no finish_reason when another request arrives: the answer was cut, not given.
    server.queue(
        sse_reply(llama_cpp_python("Half ", "an", " ans"), done=True),
        sse_reply([chunk(usage=usage(9, 3))], done=True),  # usage, but no choice ever
        sse_reply([], done=True),  # [DONE] alone
    )
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
        with_usage, _ = await stream_error(model)
        alone, _ = await stream_error(model)
        expected = estimated(model, len("Half an ans"))
    assert sunk == ["Half ", "an", " ans"]
    for cut in (error, with_usage, alone):
        assert cut.retryable
        assert "stream broke off" in str(cut)
        assert "[DONE] came without a finish_reason" in str(cut)
    assert error.usage == expected
    assert with_usage.usage == Usage(input_tokens=9, output_tokens=3, requests=1)


async def test_a_first_chunk_without_choices(server: LoopbackServer) -> None:
    # Azure OpenAI: the prompt's content filter results first, with "choices": [], and
    # chunks whose choice has no delta.
    filters = {"prompt_index": 0, "content_filter_results": {"hate": {"filtered": False}}}
    events = [
        {
            "id": "",
            "object": "",
            "created": 0,
            "model": "",
            "choices": [],
            "prompt_filter_results": [filters],
        },
        *texts("Fine"),
        {"id": "x", "choices": [{"index": 0, "finish_reason": None, "content_filter_results": {}}]},
        chunk(usage=usage(4, 1)),
    ]
    server.queue(sse_reply(events, done=True))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert (response.text, sunk) == ("Fine", ["Fine"])
    assert response.model == "openai:test-model-2025"  # the empty model name is skipped


async def test_null_content_and_a_role_only_first_chunk(server: LoopbackServer) -> None:
    events = [
        chunk({"role": "assistant"}),
        chunk({"role": "assistant", "content": None}),
        chunk({"content": "Yes"}),
        chunk({"content": None}, finish="stop"),
    ]
    server.queue(sse_reply(events, done=True))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert (response.text, sunk) == ("Yes", ["Yes"])


async def test_whole_tool_calls_in_one_chunk(server: LoopbackServer) -> None:
    # llama.cpp, LM Studio and others send each call whole; several in one chunk with
    # no index at all, or (Ollama) all with index 0 and their own ids.
    cases = [
        [fragment(0, "c1", "add", '{"a": 1, "b": 2}')],
        [fragment(None, "c1", "add", '{"a": 1}'), fragment(None, "c2", "add", '{"a": 2}')],
        [fragment(0, "c1", "add", '{"a": 1}'), fragment(0, "c2", "add", '{"a": 2}')],
        [fragment(None, None, "add", '{"a": 1}'), fragment(None, None, "add", '{"a": 2}')],
    ]
    for calls in cases:
        server.queue(
            sse_reply(
                [chunk({"role": "assistant", "tool_calls": calls}, finish="tool_calls")], done=True
            )
        )
    async with model_for(server) as model:
        responses = [(await stream(model))[0] for _ in cases]
    assert [c.arguments for c in responses[0].tool_calls] == ['{"a": 1, "b": 2}']
    for response in responses[1:]:
        assert [(c.name, c.arguments) for c in response.tool_calls] == [
            ("add", '{"a": 1}'),
            ("add", '{"a": 2}'),
        ]
        ids = [c.id for c in response.tool_calls]
        assert len(set(ids)) == 2
        assert all(ids)
    assert [c.id for c in responses[2].tool_calls] == ["c1", "c2"]


async def test_ollama_calls_split_across_chunks_with_index_zero(server: LoopbackServer) -> None:
    # One call per chunk, every one with index 0: the new id opens a new call.
    server.queue(
        sse_reply(
            [
                chunk({"tool_calls": [fragment(0, "call_x", "add", '{"a": 1}')]}),
                chunk({"tool_calls": [fragment(0, "call_y", "get_weather", '{"city": "Oslo"}')]}),
                chunk({"tool_calls": [fragment(0, "call_y", None, "")]}),  # its own id again
                chunk({}, finish="tool_calls"),
            ],
            done=True,
        )
    )
    async with model_for(server) as model:
        response, _ = await stream(model)
    assert response.tool_calls == (
        ToolCall(id="call_x", name="add", arguments='{"a": 1}'),
        ToolCall(id="call_y", name="get_weather", arguments='{"city": "Oslo"}'),
    )


async def test_tool_arguments_as_an_object_and_missing(server: LoopbackServer) -> None:
    calls = [
        fragment(0, "c1", "add", {"a": 1, "b": 2}),  # the object, not its JSON text
        fragment(1, "c2", "add", None),  # no arguments at all
        fragment(2, "c2", "add", ""),  # an id repeated by another call
    ]
    server.queue(sse_reply([chunk({"tool_calls": calls}, finish="stop")], done=True))
    async with model_for(server) as model:
        response, _ = await stream(model)
    assert [c.arguments for c in response.tool_calls] == ['{"a":1,"b":2}', "{}", "{}"]
    ids = [c.id for c in response.tool_calls]
    assert ids[:2] == ["c1", "c2"]
    assert len(set(ids)) == 3  # the repeat got an id of its own
    assert response.finish_reason == "tool_calls"  # "stop" with calls: the calls decide


async def test_a_tool_call_without_a_name_is_malformed(server: LoopbackServer) -> None:
    server.queue(
        sse_reply([chunk({"tool_calls": [fragment(0, "c1", None, "{}")]}, finish="tool_calls")])
    )
    async with model_for(server) as model:
        error, _ = await stream_error(model)
    assert "malformed" in str(error)
    assert "no function name" in str(error)


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
async def test_reasoning_is_never_text_but_is_counted(server: LoopbackServer, field: str) -> None:
    # llama.cpp, vLLM and DeepSeek send reasoning_content; newer vLLM, Ollama and LM
    # Studio reasoning. Never text, never in the sink; counted as output.
    thought = "The user greets me; I should greet back. " * 3
    events = [
        chunk({"role": "assistant", "content": None, field: thought[:60]}),
        chunk({field: thought[60:]}),
        chunk({"content": "Hello!"}),
        chunk({}, finish="stop"),
    ]
    server.queue(sse_reply(events, done=True), sse_reply(events[:2], complete=False))
    async with model_for(server) as model:
        response, sunk = await stream(model)
        error, cut = await stream_error(model)
        expected = estimated(model, len(thought))
    assert (response.text, sunk) == ("Hello!", ["Hello!"])
    assert response.usage.output_tokens == estimate_output_tokens("Hello!", len(thought))
    assert cut == []
    assert error.usage == expected


async def test_reasoning_sent_twice_is_counted_once(server: LoopbackServer) -> None:
    # Some vLLM releases send the same text in reasoning_content and reasoning.
    events = [
        chunk({"reasoning_content": "abcd" * 10, "reasoning": "abcd" * 10}),
        chunk({"content": "ok"}, finish="stop"),
    ]
    server.queue(sse_reply(events))
    async with model_for(server) as model:
        response, _ = await stream(model)
    assert response.usage.output_tokens == estimate_output_tokens("ok", 40)


async def test_comments_event_lines_and_line_endings(server: LoopbackServer) -> None:
    # Keep-alive comments (": ping", OpenRouter's ": OPENROUTER PROCESSING"), named
    # events, CRLF and CR line endings, a data: without its space.
    data = json.dumps(chunk({"content": "b"}))
    events = [
        b": ping\n\n",
        b": OPENROUTER PROCESSING\n\n",
        ("message", chunk({"content": "a"})),
        f"data:{data}\r\n\r\n".encode(),
        f"id: 7\rretry: 100\rdata: {json.dumps(chunk({'content': 'c'}))}\r\r".encode(),
        b": ping\n\n",
        chunk({}, finish="stop"),
    ]
    server.queue(sse_reply(events, done=True))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert (response.text, sunk) == ("abc", ["a", "b", "c"])


async def test_text_with_line_separators_inside_the_json(server: LoopbackServer) -> None:
    # llama.cpp writes raw UTF-8, not \\u escapes: U+2028, U+2029 and NEL inside a JSON
    # string are text, not the end of an SSE line.
    odd = "one\u2028two\u2029three\x85four\x0bfive é 日本"
    raw = json.dumps(chunk({"content": odd}), ensure_ascii=False)
    assert "\u2028" in raw
    server.queue(sse_reply([f"data: {raw}\n\n".encode(), chunk({}, finish="stop")], done=True))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert (response.text, sunk) == (odd, [odd])


async def test_a_json_answer_instead_of_a_stream(server: LoopbackServer) -> None:
    # A server that ignores "stream": true answers with one chat completion.
    server.queue(json_reply(completion("All at once.", (wire_call("c9", "add", "{}"),), prompt=8)))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert sunk == ["All at once."]
    assert response.tool_calls == (ToolCall(id="c9", name="add", arguments="{}"),)
    assert (response.usage.input_tokens, response.finish_reason) == (8, "tool_calls")


async def test_a_json_error_body_with_status_200(server: LoopbackServer) -> None:
    server.queue(text_reply('{"error": {"message": "model is loading"}}'))
    async with model_for(server) as model:
        error, sunk = await stream_error(model)
    assert (sunk, error.retryable) == ([], True)
    assert "malformed" in str(error)


async def test_a_body_that_is_no_stream(server: LoopbackServer) -> None:
    server.queue(text_reply("<html>gateway</html>", content_type="text/html"))
    async with model_for(server) as model:
        error, _ = await stream_error(model)
    assert error.retryable
    assert "held no chat completion chunk" in str(error)


async def test_unknown_finish_reasons(server: LoopbackServer) -> None:
    cases = [
        ("eos", "stop"),
        ("end_turn", "stop"),
        ("length", "length"),
        ("content_filter", "content_filter"),
    ]
    for wire, _ in cases:
        server.queue(sse_reply([chunk({"content": "x"}, finish=wire)], done=True))
    server.queue(sse_reply([chunk({"tool_calls": [fragment(0, "c", "add", "{}")]}, finish="eos")]))
    async with model_for(server) as model:
        for wire, finish in cases:
            response, _ = await stream(model)
            assert response.finish_reason == finish, wire
        with_call, _ = await stream(model)
    assert with_call.finish_reason == "tool_calls"


async def test_a_refusal_is_the_text(server: LoopbackServer) -> None:
    events = [
        chunk({"role": "assistant", "content": None, "refusal": ""}),
        chunk({"refusal": "I can't "}),
        chunk({"refusal": "help with that."}),
        chunk({}, finish="stop"),
    ]
    server.queue(sse_reply(events, done=True))
    async with model_for(server) as model:
        response, sunk = await stream(model)
    assert response.text == "I can't help with that."
    assert sunk == ["I can't ", "help with that."]


async def test_a_server_that_ignores_max_tokens_is_cut_off(server: LoopbackServer) -> None:
    server.queue(sse_reply(texts(*["x" * 100] * 30), done=True))
    request = ModelRequest(messages=(UserMessage(content="Hi"),), max_tokens=10)
    async with model_for(server) as model:
        error, sunk = await stream_error(model, request)
    assert "ignores max_tokens" in str(error)
    assert 11 <= len(sunk) < 30
    assert error.usage is not None
    # Estimated at most at the cap the request was granted: never impossible usage.
    assert estimate_output_tokens("", 100 * len(sunk)) > 10
    assert error.usage.output_tokens == 10


async def test_a_stream_that_stalls_times_out(server: LoopbackServer) -> None:
    # A server that stops sending (a hung GPU worker): the timeout bounds the whole
    # request, so the stream breaks off ``timeout`` seconds after it was sent.
    server.queue(sse_reply(texts("Start")[:-1], hang=30))
    async with model_for(server, timeout=0.2) as model:
        error, sunk = await stream_error(model)
        expected = estimated(model, len("Start"))
        gone = await anyio.to_thread.run_sync(server.wait_disconnect, 2.0)
    assert sunk == ["Start"]
    assert error.retryable
    assert "no complete response within the 0.2 s timeout" in str(error)
    assert error.usage == expected
    assert gone > 0
