"""Agents streaming real providers' answers, over each wire format's server-sent
events from a real HTTP server on 127.0.0.1: what a stream cut by a deadline, a
budget stop, a server error, garbage or a dropped connection leaves behind (the
trace, the usage charged, the conversation), and a consumer that reads late."""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.to_thread
import msgspec
import pytest

from fractor.actors import (
    Agent,
    ExecutionEnd,
    ExecutionStart,
    ModelText,
    Retry,
    RetryPolicy,
    ScriptedModel,
    Usage,
    call,
    calls,
    reply,
    tool,
)
from fractor.runtime import Budget, Runtime

from ..loopback import LoopbackServer, Reply, sse_reply
from .wires import OPENAI, Wire

# -- each wire format's stream, as its servers send it -------------------------------------


def _openai_chunk(delta: dict[str, Any] | None, finish: str | None = None, **more: Any) -> Any:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "c", "object": "chat.completion.chunk", "model": "m", "choices": choices, **more}


def opening(wire: Wire) -> list[Any]:
    if wire is OPENAI:
        return [_openai_chunk({"role": "assistant", "content": ""})]
    return [
        (
            "message_start",
            {
                "type": "message_start",
                "message": {
                    "id": "msg_1",
                    "type": "message",
                    "role": "assistant",
                    "model": "claude-test",
                    "content": [],
                    "stop_reason": None,
                    "usage": {"input_tokens": 40, "output_tokens": 1},
                },
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
    ]


def piece(wire: Wire, text: str) -> Any:
    if wire is OPENAI:
        return _openai_chunk({"content": text})
    return (
        "content_block_delta",
        {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": text}},
    )


def ending(wire: Wire, output: int) -> list[Any]:
    if wire is OPENAI:
        usage = {"prompt_tokens": 40, "completion_tokens": output}
        return [_openai_chunk({}, "stop"), _openai_chunk(None, usage=usage)]
    return [
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn"},
                "usage": {"output_tokens": output},
            },
        ),
        ("message_stop", {"type": "message_stop"}),
    ]


def server_error(wire: Wire) -> Any:
    if wire is OPENAI:
        return {"error": {"message": "the GPU fell over", "type": "server_error", "code": 500}}
    error = {"type": "overloaded_error", "message": "the GPU fell over"}
    return ("error", {"type": "error", "error": error})


def answer(wire: Wire, pieces: list[str], *, output: int = 9, **options: Any) -> Reply:
    events = [*opening(wire), *(piece(wire, p) for p in pieces), *ending(wire, output)]
    return sse_reply(events, done=wire is OPENAI, **options)


def partial(wire: Wire, pieces: list[str], *then: Any, **options: Any) -> Reply:
    """The head of an answer, then ``then`` (an error event, garbage), and no end."""
    return sse_reply([*opening(wire), *(piece(wire, p) for p in pieces), *then], **options)


def unfinished(wire: Wire, pieces: list[str]) -> Reply:
    """The head of an answer, then an end that never says the answer is complete:
    llama-cpp-python's ``[DONE]`` without a finish_reason (another request arrived),
    or a ``message_stop`` without a stop_reason."""
    if wire is OPENAI:
        return partial(wire, pieces, done=True)
    return partial(
        wire,
        pieces,
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ("message_stop", {"type": "message_stop"}),
    )


def agent(wire: Wire, server: LoopbackServer, name: str = "talker", **options: Any) -> Agent:
    return Agent(name, wire.model(server), **options)


# -- the tests ------------------------------------------------------------------------------


async def test_an_agent_streams_the_providers_answer(wire: Wire, server: LoopbackServer) -> None:
    server.queue(answer(wire, ["Tides ", "follow ", "the moon."], output=6))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        async with ref.stream("Why tides?") as run:
            texts = [
                event.detail.text async for event in run if isinstance(event.detail, ModelText)
            ]
        conversation = await ref.conversation()
    result = run.result
    assert result.status == "completed", result.stop_reason
    assert "".join(texts) == result.text == "Tides follow the moon."
    assert (result.usage.input_tokens, result.usage.output_tokens) == (40, 6)  # the server's
    assert server.requests[0].json()["stream"] is True
    assert [m.content for m in conversation.messages] == ["Why tides?", "Tides follow the moon."]


async def test_a_deadline_mid_stream_closes_the_connection_at_once(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(partial(wire, ["one ", "two ", "three "], gap=0.05, hang=30))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        began = time.monotonic()
        with anyio.fail_after(5):
            async with ref.stream("count", budget=Budget(seconds=0.5)) as run:
                texts = [
                    event.detail.text async for event in run if isinstance(event.detail, ModelText)
                ]
        answered = time.monotonic()
        (trace,) = await ref.trace()
    result = run.result
    assert result.status == "timed_out"
    assert answered - began < 5.0  # the deadline's 0.5 s, not the server's 30 s
    # The server saw the client go: the connection was closed, not left to finish.
    gone = await anyio.to_thread.run_sync(server.wait_disconnect, 5.0)
    assert gone - answered < 3.0  # at once (the server looks every 50 ms), load allowing
    received = "".join(texts)
    assert received == "one two three "
    (step,) = trace.steps
    assert step.interrupted
    assert step.response_text == received  # the text received is in the trace
    # Charged: the input estimate and the text received (4 characters a token).
    assert result.usage.output_tokens == -(-len(received) // 4)
    assert result.usage.input_tokens > 0
    assert result.usage.requests == 1


async def test_a_budget_stop_mid_stream_closes_the_childs_connection(
    wire: Wire, server: LoopbackServer
) -> None:
    """A sibling spends the tree's last tool call while the talker streams: the tree
    stops, and the talker's HTTP stream is closed mid-answer."""
    server.queue(partial(wire, ["a long ", "story "], gap=0.05, hang=30))
    talking = anyio.Event()

    @tool
    async def wait_for_the_talker() -> str:
        """Wait until the talker speaks."""
        await talking.wait()
        return "it speaks"

    @tool
    async def lookup() -> str:
        """Look something up."""
        return "found"

    sibling = Agent(
        "sibling",
        ScriptedModel([call("wait_for_the_talker"), call("lookup"), call("lookup")]),
        tools=[wait_for_the_talker, lookup],
    )
    lead = Agent(
        "lead",
        ScriptedModel([calls(call("talker", task="tell"), call("sibling", task="work"))]),
        subagents=[agent(wire, server), sibling],
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(5):
            async with ref.stream("go", subagents=True, budget=Budget(tool_calls=1)) as run:
                async for event in run:
                    if isinstance(event.detail, ModelText) and event.agent == "talker":
                        talking.set()
        (trace,) = await ref.trace()
    result = run.result
    assert result.status == "budget_exceeded"
    assert "tool_calls limit of 1" in result.stop_reason
    # The talker's stream was cut mid-answer: the server saw it go, before its end.
    await anyio.to_thread.run_sync(server.wait_disconnect, 5.0)
    talker = trace.steps[0].outcomes[0]  # the lead's call of the talker, cut short
    assert talker.call.name == "talker"
    assert talker.interrupted


async def test_a_server_error_mid_stream_fails_with_its_words_and_keeps_the_text(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(partial(wire, ["Half an ", "answer"], server_error(wire)))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        result = await ref.ask("go")
        (trace,) = await ref.trace()
        conversation = await ref.conversation()
    assert result.status == "failed"
    assert "the GPU fell over" in result.stop_reason
    (step,) = trace.steps
    assert step.response_text == "Half an answer"  # what came before the error
    assert "the GPU fell over" in step.error
    # Charged what was received: the input and the text so far.
    assert result.usage.requests == 1
    assert result.usage.output_tokens > 0
    # Invariant 2 holds: the turn and one (synthesized) answer.
    assert [m.content for m in conversation.messages] == ["go", result.text]
    assert conversation.execution == ()


async def test_garbage_in_the_stream_is_a_clear_error_and_nothing_is_lost(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(partial(wire, ["Before the ", "noise"], b"data: {this is not json\n\n"))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        async with ref.stream("go") as run:
            texts = [
                event.detail.text async for event in run if isinstance(event.detail, ModelText)
            ]
        (trace,) = await ref.trace()
    result = run.result
    assert result.status == "failed"
    assert "malformed" in result.stop_reason
    assert "".join(texts) == "Before the noise" == trace.steps[0].response_text
    assert result.usage.output_tokens > 0


async def test_a_cut_stream_is_retried_and_the_retry_streams_from_the_start(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(
        partial(wire, ["The first ", "try"], complete=False),
        answer(wire, ["The second ", "try."], output=4),
    )
    retrying = agent(wire, server, retry=RetryPolicy(retries=1, initial_delay=0))
    async with Runtime() as rt:
        ref = await rt.spawn(retrying)
        async with ref.stream("go") as run:
            events = [event async for event in run]
    result = run.result
    assert result.status == "completed", result.stop_reason
    assert result.text == "The second try."
    retries = [i for i, event in enumerate(events) if isinstance(event.detail, Retry)]
    assert len(retries) == 1
    after = "".join(e.detail.text for e in events[retries[0] :] if isinstance(e.detail, ModelText))
    assert after == "The second try."
    assert result.usage.requests == 2  # the cut one was charged too
    assert len(server.requests) == 2


async def test_a_subagent_whose_stream_ends_unfinished_does_not_complete(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(unfinished(wire, ["The answer ", "is"]))
    lead = Agent(
        "lead",
        ScriptedModel([call("talker", task="answer"), reply("done")]),
        subagents=[agent(wire, server)],
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(5):
            async with ref.stream("go") as run:
                events = [event async for event in run]
        (trace,) = await ref.trace()
    (finished,) = [e.detail for e in events if isinstance(e.detail, ExecutionEnd)]
    assert finished.status == "failed"
    assert "broke off" in finished.reason
    (outcome,) = trace.steps[0].outcomes
    assert outcome.call.name == "talker"
    assert outcome.is_error  # the lead's model sees a failure, never "The answer is"
    assert run.result.status == "completed"  # the lead carried on
    assert len(server.requests) == 1


async def test_an_unfinished_stream_is_retried_and_each_attempt_charged(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(
        unfinished(wire, ["The first ", "try"]),
        answer(wire, ["The second ", "try."], output=4),
    )
    free = Usage(requests=1)  # the lead's own requests spend no tokens
    lead = Agent(
        "lead",
        ScriptedModel(
            [
                msgspec.structs.replace(call("talker", task="answer"), usage=free),
                reply("done", usage=free),
            ]
        ),
        subagents=[agent(wire, server, retry=RetryPolicy(retries=1, initial_delay=0))],
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(5):
            async with ref.stream("go", subagents=True) as run:
                events = [event async for event in run]
        (trace,) = await ref.trace()
    (finished,) = [e.detail for e in events if isinstance(e.detail, ExecutionEnd)]
    assert finished.status == "completed", finished.reason
    assert [e.agent for e in events if isinstance(e.detail, Retry)] == ["talker"]
    (outcome,) = trace.steps[0].outcomes
    assert not outcome.is_error
    assert "The second try." in outcome.content
    assert len(server.requests) == 2
    # Both attempts charged: the cut one its text received (13 characters: 4 tokens
    # at 4 or at 3.5 a token), the second what its server reported.
    usage = run.result.usage
    assert (usage.requests, usage.output_tokens) == (2 + 2, 4 + 4)


async def test_a_stream_cut_by_a_stop_is_charged_at_least_a_token_a_piece(
    wire: Wire, server: LoopbackServer
) -> None:
    # A server that streams a token a chunk, one character each (digits, line
    # breaks): 311 pieces are at least 311 tokens, however few characters they hold.
    digits = [*"\n".join(str(i % 10) for i in range(156))]
    server.queue(partial(wire, digits, hang=30))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        received = ""
        with anyio.fail_after(5):
            async with ref.stream("count") as run:
                async for event in run:
                    if isinstance(event.detail, ModelText):
                        received += event.detail.text
                        if len(received) == len(digits):
                            break  # leaving the stream stops the execution
    assert received == "".join(digits)
    assert len(digits) == 311
    assert -(-311 // 4) == 78  # what characters alone say
    result = run.result
    assert result.status == "cancelled"
    assert (result.usage.requests, result.usage.output_tokens) == (1, 311)


async def test_a_slow_consumer_gets_every_piece_of_a_long_answer(
    wire: Wire, server: LoopbackServer
) -> None:
    pieces = [f"word{i} " for i in range(400)]
    server.queue(answer(wire, pieces, output=800))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        async with ref.stream("talk", buffer=4) as run:
            with anyio.fail_after(10):
                await ref.trace()  # queued behind the task: it answered unread
            texts = [
                event.detail.text async for event in run if isinstance(event.detail, ModelText)
            ]
    assert run.result.status == "completed"
    assert "".join(texts) == "".join(pieces)
    assert len(texts) <= 4


async def test_progress_shows_what_a_provider_has_streamed_so_far(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(partial(wire, ["Still ", "thinking"], gap=0.02, hang=30))
    async with Runtime() as rt:
        ref = await rt.spawn(agent(wire, server))
        with anyio.fail_after(5):
            async with ref.stream("go") as run:
                async for event in run:
                    if isinstance(event.detail, ModelText) and event.detail.text.endswith(
                        "thinking"
                    ):
                        progress = ref.progress()
                        break
    assert progress.phase == "model"
    assert progress.streamed == "Still thinking"
    assert run.result.status == "cancelled"  # leaving the stream stopped it


@pytest.mark.parametrize("subagents", [False, True])
async def test_a_subagent_on_a_provider_streams_only_when_asked(
    wire: Wire, server: LoopbackServer, subagents: bool
) -> None:
    server.queue(answer(wire, ["child ", "says hi"], output=3))
    lead = Agent(
        "lead",
        ScriptedModel([call("talker", task="say hi"), reply("done")]),
        subagents=[agent(wire, server)],
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        async with ref.stream("go", subagents=subagents) as run:
            events = [event async for event in run]
    assert run.result.text == "done"
    child = "".join(
        e.detail.text for e in events if isinstance(e.detail, ModelText) and e.depth == 2
    )
    assert child == ("child says hi" if subagents else "")
    assert [e.agent for e in events if isinstance(e.detail, ExecutionStart)] == ["talker"]
