"""Property tests for DESIGN.md section 5, invariants 2, 3 and 6, over random scripts.

Each example scripts several executions: steps with random tool calls (good, failing,
timing out, bad arguments, unknown tools), final replies and model errors. After
every execution, and in every inference context the model received, the invariants
must hold.
"""

from __future__ import annotations

from typing import Any

import anyio
import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fractor.actors import (
    Agent,
    AssistantMessage,
    Compaction,
    Conversation,
    DigestMessage,
    ExecutionTrace,
    Message,
    ModelRequest,
    ModelResponse,
    Result,
    ScriptedModel,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    fail,
    reply,
    tool,
)
from fractor.runtime import (
    Budget,
    Runtime,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)


@tool
async def ok(x: int) -> int:
    """Echoes x."""
    return x


@tool
async def broken(x: int) -> int:
    """Always raises."""
    raise ValueError(f"broken {x}")


@tool(timeout=0.005)
async def slow(x: int) -> int:
    """Times out."""
    await anyio.sleep(10)
    return x  # pragma: no cover


TOOLS = [ok, broken, slow]

one_call = st.one_of(
    st.builds(lambda x: call("ok", x=x), st.integers(0, 9)),
    st.builds(lambda x: call("broken", x=x), st.integers(0, 9)),
    st.just(call("slow", x=1)),
    st.just(call("ok", x="not a number")),
    st.just(call("missing_tool")),
    st.just(
        ModelResponse(
            tool_calls=(ToolCall(id="", name="ok", arguments="{not json"),),
            finish_reason="tool_calls",
        )
    ),
)
tool_step = st.lists(one_call, min_size=1, max_size=4).map(
    lambda turns: turns[0] if len(turns) == 1 else calls(*turns)
)
execution_script = st.tuples(
    st.lists(tool_step, max_size=3),
    st.sampled_from(["reply", "error", "none"]),
)


def build(scripts: list[tuple[list[Any], str]]) -> tuple[list[Any], list[str]]:
    """Flatten per-execution scripts into one model script; 'none' runs into the step limit."""
    turns: list[Any] = []
    endings: list[str] = []
    for steps, ending in scripts:
        turns.extend(steps)
        if ending == "reply":
            turns.append(reply(f"answer {len(endings)}"))
        elif ending == "error":
            turns.append(fail(RuntimeError("model blew up")))
        else:
            turns.append(call("ok", x=0))  # one step too many: the step limit stops it
        endings.append(ending)
    return turns, endings


def check_context(messages: tuple[Message, ...]) -> None:
    """Invariant 3: every tool result follows its call, and no call lacks a result."""
    i = 0
    while i < len(messages):
        message = messages[i]
        assert not isinstance(message, ToolResultMessage), f"result without its call at {i}"
        if isinstance(message, AssistantMessage) and message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            assert len(set(ids)) == len(ids), "duplicate call ids in one step"
            results = messages[i + 1 : i + 1 + len(ids)]
            assert [r.call_id for r in results if isinstance(r, ToolResultMessage)] == ids
            assert len(results) == len(ids)
            i += 1 + len(ids)
            continue
        i += 1


def check_clean_history(messages: tuple[Message, ...], executions_before: int) -> None:
    """What an execution starts from: system prompt, then user/final pairs, then the task."""
    body = [m for m in messages if not isinstance(m, SystemMessage)]
    assert len(body) == 2 * executions_before + 1
    for index, message in enumerate(body):
        if index % 2 == 0:
            assert isinstance(message, UserMessage)
        else:
            assert isinstance(message, AssistantMessage)
            assert message.tool_calls == ()


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    scripts=st.lists(execution_script, min_size=1, max_size=3),
    clearing=st.sampled_from([None, 1, 2]),
)
async def test_invariants_hold_over_random_scripts(
    scripts: list[tuple[list[Any], str]], clearing: int | None
) -> None:
    """Invariants 2, 3 and 6; with old tool results cleared too (``clear_results``:
    each call keeps a result, only its text changes)."""
    turns, endings = build(scripts)
    model = ScriptedModel(turns)
    memory = None if clearing is None else Compaction(clear_results=clearing, threshold=10**9)
    agent = Agent("prop", model, tools=TOOLS, instructions="You are tested.", memory=memory)
    results: list[Result] = []
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        for index, (steps, _ending) in enumerate(scripts):
            before = await ref.conversation()
            requests_before = len(model.requests)
            result = await ref.ask(f"task {index}", budget=Budget(steps=len(steps) + 1))
            after = await ref.conversation()
            results.append(result)
            # Invariant 2: empty buffer, conversation grew by the task and one answer.
            assert after.execution == ()
            assert after.messages[: len(before.messages)] == before.messages
            assert after.messages[len(before.messages) :] == (
                UserMessage(content=f"task {index}"),
                AssistantMessage(content=result.text),
            )
            # The execution started clean, whatever the previous one did.
            first_request = model.requests[requests_before]
            check_clean_history(first_request.messages, index)
        traces = await ref.trace()
    # Invariant 3 in every inference context the model received.
    for request in model.requests:
        check_context(request.messages)
    expected = {"reply": "completed", "error": "failed", "none": "budget_exceeded"}
    assert [r.status for r in results] == [expected[e] for e in endings]
    assert [t.final_text for t in traces] == [r.text for r in results]
    for result, trace in zip(results, traces, strict=True):
        round_trip(result, Result)
        round_trip(trace, ExecutionTrace)
    round_trip(after, Conversation)
    for request in model.requests:
        round_trip(request, ModelRequest)


def round_trip(value: msgspec.Struct, kind: type[Any]) -> None:
    """Invariant 6: JSON and MessagePack both give back an equal value."""
    assert decode_json(encode_json(value), kind) == value
    assert decode_msgpack(encode_msgpack(value), kind) == value


messages_strategy = st.one_of(
    st.builds(SystemMessage, content=st.text()),
    st.builds(DigestMessage, content=st.text(), attempts=st.integers(1, 9)),
    st.builds(UserMessage, content=st.text()),
    st.builds(
        AssistantMessage,
        content=st.text(),
        tool_calls=st.lists(
            st.builds(ToolCall, id=st.text(min_size=1), name=st.text(), arguments=st.text()),
            max_size=3,
        ).map(tuple),
    ),
    st.builds(
        ToolResultMessage,
        call_id=st.text(),
        name=st.text(),
        content=st.text(),
        is_error=st.booleans(),
    ),
)


@given(message=messages_strategy)
def test_every_message_type_round_trips(message: Message) -> None:
    union: Any = Message  # a Union is not a type[T]; msgspec decodes it all the same
    assert decode_json(encode_json(message), union) == message
    assert decode_msgpack(encode_msgpack(message), union) == message
