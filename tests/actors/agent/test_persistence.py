"""Agents in a store: resume by id, complete turns only, failures, crashes, concurrency."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import anyio
import msgspec
import pytest
from structlog.testing import capture_logs

from fractor.actors import (
    Agent,
    AssistantMessage,
    FunctionModel,
    Message,
    ModelRequest,
    ModelResponse,
    ScriptedModel,
    ToolResultMessage,
    UserMessage,
    call,
    reply,
    tool,
)
from fractor.actors._agent._persistence import AgentState, decode_state
from fractor.actors._observation._traces import trace_from_record
from fractor.runtime import (
    ActorStopped,
    Budget,
    MemoryStore,
    Record,
    Runtime,
    SQLiteStore,
    Store,
    StoreError,
    encode_json,
)

CRASH_SCRIPT = Path(__file__).with_name("crash_agent.py")


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def no_tool_traces(messages: Sequence[Message]) -> bool:
    return not any(
        isinstance(m, ToolResultMessage) or (isinstance(m, AssistantMessage) and m.tool_calls)
        for m in messages
    )


async def stored_state(store: Store, actor_id: str) -> AgentState:
    data = await store.load(actor_id)
    assert data is not None, f"nothing stored for {actor_id!r}"
    return decode_state(data, store=repr(store), actor_id=actor_id)


def turn(question: str, answer: str) -> tuple[Message, ...]:
    return (UserMessage(content=question), AssistantMessage(content=answer))


async def test_an_agent_spawned_with_an_id_resumes_its_conversation(
    make_store: Callable[[], Store],
) -> None:
    first_model = ScriptedModel([call("lookup", topic="tides"), reply("Tides follow the moon.")])
    store = make_store()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("support", first_model, tools=[lookup]), id="support")
        result = await ref.ask("Why tides?")
    assert result.ok
    record = await store.record(result.execution_id)
    assert record is not None
    assert trace_from_record(record).steps[0].tool_calls[0].name == "lookup"  # in the trace
    # Another runtime ("process") on the same store: same id, same conversation.
    second_model = ScriptedModel([reply("Twice a day.")])
    first_store, store = store, make_store()
    if store is not first_store:
        await first_store.aclose()  # SQLite: a new connection to the same file
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("support", second_model), id="support")
        resumed = await ref.conversation()
        await ref.ask("How often?")
    assert resumed.messages == turn("Why tides?", "Tides follow the moon.")
    assert second_model.requests[0].messages == (
        *turn("Why tides?", "Tides follow the moon."),
        UserMessage(content="How often?"),
    )
    state = await stored_state(store, "support")
    assert state.messages == (
        *turn("Why tides?", "Tides follow the moon."),
        *turn("How often?", "Twice a day."),
    )
    assert no_tool_traces(state.messages)
    await store.aclose()


async def test_traces_of_two_processes_both_survive() -> None:
    store = MemoryStore()
    for answer in ("First.", "Second."):
        async with Runtime(store=store) as rt:
            ref = await rt.spawn(Agent("support", ScriptedModel([reply(answer)])), id="support")
            await ref.ask("Hi")
    traces = [trace_from_record(r) for r in await store.records(actor_id="support")]
    assert [t.final_text for t in traces] == ["First.", "Second."]


async def test_unnamed_agents_and_subagents_keep_no_state_but_save_their_traces() -> None:
    researcher = Agent("researcher", ScriptedModel([reply("Found it.")]))
    lead_model = ScriptedModel([call("researcher", task="find it"), reply("Done.")])
    lead = Agent("lead", lead_model, subagents=[researcher])
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(lead)  # an automatic id: lead-N
        result = await ref.ask("Go")
    assert store.states == {}
    lead_trace = await store.record(result.execution_id)
    assert lead_trace is not None
    assert lead_trace.actor_id == ref.id
    children = await store.records(parent_id=result.execution_id)
    assert [trace_from_record(c).final_text for c in children] == ["Found it."]
    assert children[0].actor_id != ref.id


async def test_an_id_given_at_spawn_keeps_its_state_whatever_its_shape() -> None:
    """Which ids are the runtime's own is known, not guessed from their shape: an id a
    user gives that looks like one the runtime makes up (``name-N``) is the user's, and
    its conversation is kept; the runtime's own ``photographer-N`` is not."""
    store = MemoryStore()
    for answer in ("First.", "Second."):
        async with Runtime(store=store) as rt:
            model = ScriptedModel([reply(answer)])
            given = await rt.spawn(Agent("photographer", model), id="photographer-1")
            await given.ask("Hi")
            made_up = await rt.spawn(Agent("photographer", ScriptedModel([reply("ok")])))
            await made_up.ask("Hi")
    assert made_up.id.startswith("photographer-")
    assert made_up.id != "photographer-1"
    assert set(store.states) == {"photographer-1"}
    state = await stored_state(store, "photographer-1")
    assert state.messages == (*turn("Hi", "First."), *turn("Hi", "Second."))
    assert model.requests[0].messages == (*turn("Hi", "First."), UserMessage(content="Hi"))


async def test_a_cancelled_execution_stores_its_turn_and_trace_as_the_live_one() -> None:
    started = anyio.Event()

    @tool
    async def slow(topic: str) -> str:
        """Blocks until cancelled."""
        started.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    model = ScriptedModel([reply("First."), call("slow", topic="x", text="in the buffer")])
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("support", model, tools=[slow]), id="support")
        first = await ref.ask("One?")
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def second() -> None:
                    with pytest.raises(ActorStopped):
                        await ref.ask("Two?")

                tg.start_soon(second)
                await started.wait()
                ref.cancel()
    state = await stored_state(store, "support")
    # Invariant 2 on every path: the turn and its synthesized answer, as live.
    assert state.messages[:2] == turn("One?", "First.")
    assert state.messages[2] == UserMessage(content="Two?")
    answer = state.messages[3]
    assert isinstance(answer, AssistantMessage)
    assert answer.content.startswith("[cancelled]")
    assert "1 step(s) (the last one interrupted), 1 tool call(s) (slow)" in answer.content
    assert len(state.messages) == 4
    assert no_tool_traces(state.messages)
    records = await store.records()
    assert next(r.id for r in records) == first.execution_id
    (cancelled,) = [trace_from_record(r) for r in records[1:]]
    assert (cancelled.task, cancelled.status) == ("Two?", "cancelled")
    (step,) = cancelled.steps  # the step in flight, with its call named
    assert step.interrupted
    assert [(o.call.name, o.interrupted) for o in step.outcomes] == [("slow", True)]


async def test_an_execution_stopped_by_its_budget_is_saved_without_tool_traces() -> None:
    model = ScriptedModel([call("lookup", topic="a"), call("lookup", topic="b")])
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("support", model, tools=[lookup]), id="support")
        result = await ref.ask("Look twice", budget=Budget(steps=1))
    assert result.status == "budget_exceeded"
    state = await stored_state(store, "support")
    assert state.messages == turn("Look twice", result.text)
    assert no_tool_traces(state.messages)


class FlakyStore(MemoryStore):
    """A MemoryStore whose first ``failures`` saves raise."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    async def save(
        self,
        actor_id: str,
        state: bytes | None,
        *,
        records: Sequence[Record] = (),
        blobs: Mapping[str, bytes] | None = None,
    ) -> None:
        if self.failures:
            self.failures -= 1
            raise StoreError(repr(self), f"save the state of actor {actor_id!r}", "disk full")
        await super().save(actor_id, state, records=records, blobs=blobs)


async def test_a_store_failure_does_not_lose_the_result_and_heals_at_the_next_save() -> None:
    store = FlakyStore(failures=1)
    model = ScriptedModel([reply("First."), reply("Second.")])
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("support", model), id="support")
        with capture_logs() as logs:
            first = await ref.ask("One?")
        assert (first.status, first.text) == ("completed", "First.")
        assert store.states == {}
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert len(warnings) == 1
        assert warnings[0]["event"] == "agent state not saved"
        assert warnings[0]["agent_id"] == "support"
        assert warnings[0]["execution_id"] == first.execution_id
        assert "disk full" in warnings[0]["error"]
        second = await ref.ask("Two?")
    # The next save wrote the whole state and the trace that was not saved before.
    state = await stored_state(store, "support")
    assert state.messages == (*turn("One?", "First."), *turn("Two?", "Second."))
    assert [r.id for r in await store.records()] == [first.execution_id, second.execution_id]


async def test_an_unreadable_stored_state_fails_the_spawn_clearly() -> None:
    store = MemoryStore()
    await store.save("support", b"{not json")
    async with Runtime(store=store) as rt:
        with pytest.raises(StoreError, match="restore the conversation of agent 'support'"):
            await rt.spawn(Agent("support", ScriptedModel([])), id="support")
    assert store.states["support"] == b"{not json"  # left as it was


async def read_until(stream: anyio.abc.ByteReceiveStream, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        try:
            seen += await stream.receive()
        except anyio.EndOfStream:
            raise AssertionError(f"the process ended before {marker!r}: {seen!r}") from None
    return seen


@pytest.mark.parametrize("mode", ["crash", "compact"])
async def test_a_process_killed_mid_execution_leaves_the_last_completed_turn(
    tmp_path: Path, anyio_backend: str, mode: str
) -> None:
    """Killed mid-execution, after a compaction too (``compact``: the summary had
    replaced the first turn in memory): the store holds the last completed turn,
    and no summary."""
    db = tmp_path / "crash.db"
    command = [sys.executable, str(CRASH_SCRIPT), str(db)]
    with anyio.fail_after(30):
        async with await anyio.open_process(
            [*command, mode, anyio_backend], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as process:
            assert process.stdout is not None
            output = await read_until(process.stdout, b"BLOCKED\n")
            process.kill()  # SIGKILL: no cleanup of any kind runs
            assert await process.wait() == -9
    match = re.search(rb"FIRST completed (support#1\.[0-9a-f]+)", output)
    assert match is not None, output
    assert (b"FOLDED True\n" in output) == (mode == "compact")
    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    raw.close()
    async with SQLiteStore(db) as store:
        state = await stored_state(store, "support")
        records = await store.records()
    assert state.messages == turn("First question?", "First answer.")
    assert (state.summary, state.summarized) == ((), 0)
    assert no_tool_traces(state.summary + state.buffer + state.messages)
    assert [r.id for r in records] == [match.group(1).decode()]
    # A new process spawning "support" again resumes from that turn.
    with anyio.fail_after(30):
        done = await anyio.run_process([*command, "resume", anyio_backend], check=False)
    assert done.returncode == 0, done.stderr.decode()
    lines = done.stdout.decode().splitlines()
    assert "RESULT completed Resumed answer." in lines
    request = next(line for line in lines if line.startswith("REQUEST "))
    first_request = msgspec.json.decode(request[8:], type=tuple[Message, ...])
    assert first_request == (
        *turn("First question?", "First answer."),
        UserMessage(content="Third question?"),
    )


async def test_200_agents_finishing_at_once_lose_nothing(tmp_path: Path) -> None:
    count = 200
    arrived = 0
    release = anyio.Event()

    async def respond(request: ModelRequest) -> ModelResponse:
        nonlocal arrived
        question = next(m for m in request.messages if isinstance(m, UserMessage)).content
        if not any(isinstance(m, ToolResultMessage) for m in request.messages):
            return call("lookup", topic=question)
        arrived += 1
        if arrived == count:
            release.set()
        await release.wait()  # everyone answers at the same moment
        return reply(f"answer to {question}")

    agent = Agent("worker", FunctionModel(respond), tools=[lookup])
    async with SQLiteStore(tmp_path / "many.db") as store:
        with anyio.fail_after(20):
            async with Runtime(store=store) as rt:
                refs = [await rt.spawn(agent, id=f"user{i}") for i in range(count)]
                async with anyio.create_task_group() as tg:
                    for index, ref in enumerate(refs):
                        tg.start_soon(ref.ask, f"q{index}")
        for index in range(count):
            state = await stored_state(store, f"user{index}")
            assert state.messages == turn(f"q{index}", f"answer to q{index}")
        records = await store.records(limit=None)
    assert len(records) == count
    traces = [trace_from_record(r) for r in records]
    assert {t.agent_id for t in traces} == {f"user{i}" for i in range(count)}
    assert all(t.status == "completed" and len(t.steps) == 2 for t in traces)
    assert encode_json(traces[0])  # every trace decodes and re-encodes


async def test_a_refused_turn_joins_neither_the_live_nor_the_stored_conversation() -> None:
    store = MemoryStore()
    model = ScriptedModel([reply("First.")])
    async with Runtime(budget=Budget(agents=1), store=store) as rt:
        ref = await rt.spawn(Agent("support", model), id="support")
        first = await ref.ask("One?")
        refused = await ref.ask("Two?")  # a second execution: over the runtime's agents
        live = await ref.conversation()
    assert first.status == "completed"
    assert refused.status == "budget_exceeded"
    assert refused.text.startswith("[budget_exceeded] The task was not started: agents limit")
    state = await stored_state(store, "support")
    assert live.messages == state.messages == turn("One?", "First.")


async def test_lone_surrogates_are_made_safe_where_text_comes_in(tmp_path: Path) -> None:
    @tool
    async def odd(topic: str) -> str:
        """Returns half of a UTF-16 pair."""
        return f"half \udc80 of {topic}"

    model = ScriptedModel([call("odd", topic="x"), reply("seen \ud800 here"), reply("still fine")])
    async with SQLiteStore(tmp_path / "agents.db") as store:
        async with Runtime(store=store) as rt:
            ref = await rt.spawn(Agent("support", model, tools=[odd]), id="support")
            result = await ref.ask("task \ud800 text")
            later = await ref.ask("still usable?")  # the agent is not poisoned
        state = await stored_state(store, "support")
        records = await store.records()
    assert (result.status, later.status) == ("completed", "completed")
    assert result.text == "seen \ufffd here"
    assert state.messages == (
        *turn("task \ufffd text", "seen \ufffd here"),
        *turn("still usable?", "still fine"),
    )
    assert len(records) == 2  # both traces stored
    assert "half \ufffd of x" in records[0].data.decode()
    assert model.requests[0].messages[0].content == "task \ufffd text"  # what the model saw
