"""Attempts that learn: every attempt traced, stored and linked; a digest of the
earlier attempts for a restart (``RestartPolicy(digest=True)``) and for an ask that
resumes (``ask(..., resume=True)``); completed tool calls never run twice.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from fractor.actors import (
    Agent,
    AssistantMessage,
    Compaction,
    DigestMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    ModelText,
    Restart,
    RestartPolicy,
    ScriptedModel,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    collect_trace_tree,
    fail,
    render_trace_tree,
    reply,
    streamed,
    tool,
)
from fractor.actors._observation._traces import trace_from_record
from fractor.actors.cli import main
from fractor.runtime import ActorStopped, Budget, MemoryStore, Runtime, SQLiteStore, StoreError


class Lookups:
    """A ``lookup`` tool that counts the calls that really ran, by query."""

    def __init__(self) -> None:
        self.ran: list[str] = []

        @tool
        async def lookup(q: str) -> str:
            """Look something up."""
            self.ran.append(q)
            return f"found {q}"

        self.tool = lookup


@tool
async def broken(q: str) -> str:
    """Always fails."""
    raise ValueError(f"no such thing as {q}")


def digests(request: ModelRequest) -> list[DigestMessage]:
    return [m for m in request.messages if isinstance(m, DigestMessage)]


# -- every attempt traced, stored, linked --------------------------------------------------


async def test_every_attempt_is_stored_and_linked_with_what_it_delegated() -> None:
    helper = Agent("helper", ScriptedModel([reply("helped once"), reply("helped twice")]))
    model = ScriptedModel(
        [call("helper", task="x"), fail(RuntimeError("boom")), reply("done")], name="lead"
    )
    agent = Agent("lead", model, subagents=[helper], restart=RestartPolicy(max_restarts=1))
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("go")
    assert result.ok
    task_id = result.execution_id
    first = f"{task_id}~1"
    traces = {t.execution_id: t for t in await collect_trace_tree(store, task_id)}
    assert set(traces) == {task_id, first, next(i for i in traces if i.startswith("helper"))}
    assert (traces[first].attempt, traces[first].attempt_of) == (1, task_id)
    assert (traces[task_id].attempt, traces[task_id].attempt_of) == (2, "")
    assert traces[first].status == "failed"
    (child,) = [t for t in traces.values() if t.agent_name == "helper"]
    assert child.parent_id == first  # delegated by the first attempt, not the last
    # In the store, an earlier attempt is a record under its task's execution.
    record = await store.record(first)
    assert record is not None
    assert record.parent_id == task_id
    assert trace_from_record(record) == traces[first]
    drawn = render_trace_tree(tuple(traces.values()))
    lines = drawn.splitlines()
    assert lines[0].startswith(f"lead [{task_id}] completed: final answer · attempt 2 · ")
    attempt_line = next(i for i, line in enumerate(lines) if f"attempt 1 [{first}] failed" in line)
    helper_line = next(
        i for i, line in enumerate(lines) if line.strip("│├└─ ").startswith("helper [")
    )
    step_line = next(i for i, line in enumerate(lines) if "step 1 · stop" in line)
    assert attempt_line < helper_line < step_line  # the helper is drawn inside attempt 1


def test_the_cli_shows_attempts_and_summarizations(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    failed: list[str] = []

    def answer(request: ModelRequest) -> Any:
        if request.messages[0].content.startswith("You keep the memory"):
            return reply("a short summary")
        last = request.messages[-1]
        if last == UserMessage(content="turn 2") and not failed:
            failed.append(last.content)
            return fail(RuntimeError("flaky model"))
        return reply("answer " + "." * 300)

    agent = Agent(
        "a",
        FunctionModel(answer),
        memory=Compaction(threshold=150, keep=1),
        restart=RestartPolicy(max_restarts=1, digest=True),
    )
    db = tmp_path / "t.db"

    async def run() -> str:
        async with SQLiteStore(db) as store, Runtime(store=store) as rt:
            ref = await rt.spawn(agent, id="a")
            for index in range(2):
                await ref.ask(f"turn {index}")
            return (await ref.ask("turn 2")).execution_id

    execution_id = anyio.run(run)
    assert main(["trace", execution_id, "--db", str(db)]) == 0
    out = capsys.readouterr().out
    assert f"a [{execution_id}] completed: final answer · attempt 2 · read a digest" in out
    assert "├── summarized 1 turn (the summary covers 1)" in out
    assert 'summary: "a short summary"' in out
    assert f"attempt 1 [{execution_id}~1] failed: model request failed: RuntimeError" in out


# -- a restart that learns -----------------------------------------------------------------


async def test_a_restart_sees_a_digest_of_the_first_attempt_and_not_its_raw_trace() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            calls(call("lookup", q="a"), call("broken", q="b")),
            fail(RuntimeError("model went away")),
            call("lookup", q="a"),  # the same call again: answered from attempt 1
            reply("done"),
        ]
    )
    agent = Agent(
        "a",
        model,
        tools=[lookups.tool, broken],
        instructions="Be useful.",
        restart=RestartPolicy(max_restarts=1, digest=True),
    )
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("find a and b")
        conversation = await ref.conversation()
        first, last = await ref.trace()
    assert result.ok
    # The second attempt's first request: instructions, the task, the digest. No
    # tool call or tool result of the first attempt.
    restarted = model.requests[2].messages
    assert [type(m).__name__ for m in restarted] == [
        "SystemMessage",
        "UserMessage",
        "DigestMessage",
    ]
    (note,) = digests(model.requests[2])
    assert note.attempts == 1
    assert "Attempt 1 ended failed: model request failed: RuntimeError: model went away." in (
        note.content
    )
    assert 'lookup({"q":"a"}) returned: found a' in note.content
    assert 'broken({"q":"b"}) failed: ' in note.content
    assert "no such thing as b" in note.content
    assert not any(isinstance(m, ToolResultMessage) for m in restarted)
    # The call that completed was not run again; its result came from attempt 1.
    assert lookups.ran == ["a"]
    (reused,) = last.steps[0].outcomes
    assert (reused.reused, reused.content, reused.attempts) == (True, "found a", 0)
    assert result.usage.tool_calls == 2  # attempt 1's two calls; none more
    # The digest never joins the conversation; the traces say who read one.
    assert conversation.messages == (
        UserMessage(content="find a and b"),
        AssistantMessage(content="done"),
    )
    assert (first.digest, last.digest) == (False, True)


async def test_a_streamed_ask_shows_the_restart_and_its_text_starting_over() -> None:
    model = ScriptedModel(
        [call("lookup", q="a"), fail(RuntimeError("gone")), streamed("second try", chunks=2)]
    )
    lookups = Lookups()
    agent = Agent(
        "a", model, tools=[lookups.tool], restart=RestartPolicy(max_restarts=1, digest=True)
    )
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with ref.stream("go") as run:
            events = [event async for event in run]
    (at,) = [i for i, event in enumerate(events) if isinstance(event.detail, Restart)]
    restarted = events[at].detail
    assert isinstance(restarted, Restart)
    assert restarted.restarts == 1
    assert restarted.digest is True
    assert "model request failed: RuntimeError: gone" in restarted.reason
    after = events[at + 1 :]
    assert "".join(e.detail.text for e in after if isinstance(e.detail, ModelText)) == "second try"
    assert run.result is not None
    assert run.result.text == "second try"


async def test_without_digest_a_restart_starts_blind_and_runs_every_call() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [call("lookup", q="a"), fail(RuntimeError("gone")), call("lookup", q="a"), reply("ok")]
    )
    agent = Agent("a", model, tools=[lookups.tool], restart=RestartPolicy(max_restarts=1))
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go")
    assert result.ok
    assert digests(model.requests[2]) == []
    assert lookups.ran == ["a", "a"]


async def test_each_earlier_run_of_a_call_answers_one_call_again() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            calls(call("lookup", q="a"), call("lookup", q="a")),
            fail(RuntimeError("gone")),
            calls(*(call("lookup", q="a") for _ in range(3)), call("lookup", q="c")),
            reply("ok"),
        ]
    )
    agent = Agent(
        "a", model, tools=[lookups.tool], restart=RestartPolicy(max_restarts=1, digest=True)
    )
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("go")
        last = (await ref.trace())[-1]
    assert result.ok
    assert sorted(lookups.ran) == ["a", "a", "a", "c"]  # two before, one more, and c
    assert [o.reused for o in last.steps[0].outcomes] == [True, True, False, False]


async def test_arguments_match_as_json_values() -> None:
    """Key order and spacing do not make another call."""
    ran: list[str] = []

    @tool
    async def pair(a: int, b: int) -> int:
        """Adds."""
        ran.append(f"{a}+{b}")
        return a + b

    respaced = ToolCall(id="again", name="pair", arguments='{ "b": 2, "a": 1 }')
    model = ScriptedModel(
        [
            call("pair", a=1, b=2),
            fail(RuntimeError("gone")),
            ModelResponse(tool_calls=(respaced,), finish_reason="tool_calls"),
            reply("3"),
        ]
    )
    agent = Agent("a", model, tools=[pair], restart=RestartPolicy(max_restarts=1, digest=True))
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("add")
    assert result.ok
    assert ran == ["1+2"]


# -- an ask that resumes ---------------------------------------------------------------------


async def test_resume_after_a_budget_stop_does_not_repeat_completed_calls() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            call("lookup", q="a"),
            call("lookup", q="b"),
            call("lookup", q="c"),  # refused: the budget allows two tool calls
            # The resumed ask: the model asks for everything again, and more.
            calls(call("lookup", q="a"), call("lookup", q="b"), call("lookup", q="c")),
            reply("a, b and c"),
        ]
    )
    agent = Agent("a", model, tools=[lookups.tool])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        stopped = await ref.ask("find a, b, c", budget=Budget(tool_calls=2))
        resumed = await ref.ask("go on", resume=True)
        conversation = await ref.conversation()
    assert stopped.status == "budget_exceeded"
    assert resumed.ok
    assert lookups.ran == ["a", "b", "c"]  # a and b ran once, before the stop
    (note,) = digests(model.requests[3])
    assert (
        "Attempt 1 at the task 'find a, b, c' ended budget_exceeded: tool_calls limit of 2"
        in note.content
    )
    assert 'lookup({"q":"b"}) returned: found b' in note.content
    assert 'lookup({"q":"c"}): not run: tool call refused: tool_calls limit of 2' in note.content
    assert resumed.usage.tool_calls == 1
    # The conversation holds both turns, never the digest.
    assert [type(m) for m in conversation.messages] == [UserMessage, AssistantMessage] * 2
    # The digest stays first in the execution buffer for the whole execution.
    assert [type(m) for m in model.requests[4].messages[-6:-3]] == [
        UserMessage,
        DigestMessage,
        AssistantMessage,
    ]


async def test_resume_after_a_timeout_runs_again_what_was_interrupted() -> None:
    ran: list[str] = []
    hung = anyio.Event()

    @tool
    async def fetch(url: str) -> str:
        """Fetch a page; the slow one hangs the first time."""
        ran.append(url)
        if url == "slow" and not hung.is_set():
            hung.set()
            await anyio.sleep(30)
        return f"page {url}"

    model = ScriptedModel(
        [
            calls(call("fetch", url="fast"), call("fetch", url="slow")),
            calls(call("fetch", url="fast"), call("fetch", url="slow")),
            reply("both pages"),
        ]
    )
    agent = Agent("a", model, tools=[fetch])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        with anyio.fail_after(5):
            stopped = await ref.ask("fetch both", budget=Budget(seconds=0.2))
        resumed = await ref.ask("again", resume=True)
        last = (await ref.trace())[-1]
    assert stopped.status == "timed_out"
    assert resumed.ok
    assert ran == ["fast", "slow", "slow"]  # the interrupted call ran again, not the other
    assert [o.reused for o in last.steps[0].outcomes] == [True, False]
    (note,) = digests(model.requests[1])
    assert 'fetch({"url":"slow"}): interrupted, no result' in note.content


async def test_resume_after_a_completed_answer_adds_nothing() -> None:
    lookups = Lookups()
    model = ScriptedModel([call("lookup", q="a"), reply("a"), call("lookup", q="a"), reply("a")])
    agent = Agent("a", model, tools=[lookups.tool])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        await ref.ask("find a")
        again = await ref.ask("find a again", resume=True)
    assert again.ok
    assert digests(model.requests[2]) == []
    assert lookups.ran == ["a", "a"]


async def test_a_persistent_agent_resumes_from_the_store_after_a_restart(tmp_path: Path) -> None:
    lookups = Lookups()
    path = tmp_path / "resume.db"
    first = ScriptedModel([call("lookup", q="a"), call("lookup", q="b")])
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("a", first, tools=[lookups.tool]), id="worker")
        stopped = await ref.ask("find a and b", budget=Budget(tool_calls=1))
    assert stopped.status == "budget_exceeded"
    # A new process: the same agent id, nothing in memory.
    later = ScriptedModel([calls(call("lookup", q="a"), call("lookup", q="b")), reply("both")])
    async with SQLiteStore(path) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("a", later, tools=[lookups.tool]), id="worker")
        resumed = await ref.ask("go on", resume=True)
    assert resumed.ok
    assert lookups.ran == ["a", "b"]
    (note,) = digests(later.requests[0])
    assert "tool_calls limit of 1 reached" in note.content


def test_resume_must_be_a_bool() -> None:
    async def run() -> None:
        async with Runtime() as rt:
            ref = await rt.spawn(Agent("a", ScriptedModel([])))
            with pytest.raises(TypeError, match="resume must be a bool, got 'yes'"):
                await ref.ask("x", resume="yes")  # type: ignore[arg-type]

    anyio.run(run)


def test_digest_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match=r"RestartPolicy\.digest must be a bool, got 1"):
        RestartPolicy(max_restarts=1, digest=1)  # type: ignore[arg-type]


async def test_a_told_task_can_resume_too() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [call("lookup", q="a"), call("lookup", q="b"), call("lookup", q="a"), reply("a")]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[lookups.tool]))
        stopped = await ref.ask("find a", budget=Budget(tool_calls=1))
        await ref.tell("go on", resume=True)
        conversation = await ref.conversation()  # queued behind the told task
    assert stopped.status == "budget_exceeded"
    assert lookups.ran == ["a"]
    assert len(digests(model.requests[2])) == 1
    assert conversation.messages[-1] == AssistantMessage(content="a")


async def test_a_store_that_cannot_be_read_resumes_nothing_and_loses_nothing() -> None:
    class Unreadable(MemoryStore):
        async def records(self, **filters: Any) -> list[Any]:
            raise StoreError("unreadable", "list records", "the disk is gone")

    model = ScriptedModel([reply("from scratch")])
    with capture_logs() as logs:
        async with Runtime(store=Unreadable()) as rt:
            ref = await rt.spawn(Agent("a", model), id="worker")
            result = await ref.ask("go on", resume=True)
            conversation = await ref.conversation()
    assert (result.status, result.text) == ("completed", "from scratch")
    assert digests(model.requests[0]) == []
    assert len(conversation.messages) == 2
    (warning,) = [e for e in logs if e["event"].startswith("the last execution could not")]
    assert "the disk is gone" in warning["error"]


# -- found in review: each a bug before its fix ----------------------------------------------


async def test_a_call_that_completed_in_an_interrupted_step_is_not_run_again() -> None:
    lookups = Lookups()

    @tool
    async def slow(q: str) -> str:
        """Hangs."""
        await anyio.sleep(30)
        return "never"  # pragma: no cover

    model = ScriptedModel(
        [
            call("lookup", q="a"),
            fail(RuntimeError("model went away")),
            # resumed: a reused, b runs and completes, the deadline cuts slow
            calls(call("lookup", q="a"), call("lookup", q="b"), call("slow", q="x")),
            call("lookup", q="b"),  # resumed again: b completed above
            reply("done"),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[lookups.tool, slow]))
        await ref.ask("find")
        cut = await ref.ask("go on", resume=True, budget=Budget(seconds=0.3))
        step = (await ref.trace())[-1].steps[-1]
        done = await ref.ask("go on", resume=True)
    assert (cut.status, done.status) == ("timed_out", "completed")
    assert [(o.reused, o.interrupted) for o in step.outcomes] == [
        (True, False),
        (False, False),
        (False, True),
    ]
    assert lookups.ran == ["a", "b"]


async def test_a_reused_result_counts_once_however_many_attempts_reused_it() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            call("lookup", q="a"),
            fail(RuntimeError("one")),
            call("lookup", q="a"),  # reused
            fail(RuntimeError("two")),
            calls(call("lookup", q="a"), call("lookup", q="a")),  # one reused, one runs
            reply("done"),
        ]
    )
    policy = RestartPolicy(max_restarts=2, digest=True)
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[lookups.tool], restart=policy))
        result = await ref.ask("go")
        last = (await ref.trace())[-1]
    assert result.ok
    assert [o.reused for o in last.steps[0].outcomes] == [True, False]
    assert lookups.ran == ["a", "a"]


async def test_a_resume_of_a_resume_remembers_the_first() -> None:
    lookups = Lookups()
    model = ScriptedModel(
        [
            call("lookup", q="a"),
            call("lookup", q="b"),  # refused: one tool call
            call("lookup", q="c"),  # the first resume: c
            call("lookup", q="d"),  # refused
            calls(call("lookup", q="a"), call("lookup", q="c")),  # both completed before
            reply("a and c"),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[lookups.tool]))
        first = await ref.ask("find", budget=Budget(tool_calls=1))
        second = await ref.ask("go on", resume=True, budget=Budget(tool_calls=1))
        third = await ref.ask("go on", resume=True)
    assert (first.status, second.status, third.status) == (
        "budget_exceeded",
        "budget_exceeded",
        "completed",
    )
    assert lookups.ran == ["a", "c"]
    (note,) = digests(model.requests[4])
    assert note.attempts == 2
    assert 'lookup({"q":"a"}) returned: found a' in note.content


async def test_a_cancellation_while_a_resume_reads_the_store_leaves_no_node_open() -> None:
    class SlowStore(MemoryStore):
        slow = False

        async def records(self, **filters: Any) -> list[Any]:
            if self.slow:
                await anyio.sleep(30)
            return await super().records(**filters)

    store = SlowStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("a", ScriptedModel([fail(RuntimeError("x"))])), id="keeper")
        assert (await ref.ask("work")).status == "failed"
    store.slow = True
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("a", ScriptedModel([reply("ok")])), id="keeper")
        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:

                async def asker() -> None:
                    with pytest.raises(ActorStopped):
                        await ref.ask("go on", resume=True)

                tg.start_soon(asker)
                await anyio.wait_all_tasks_blocked()
                ref.actor.cancel()
        running = [n.id for n in rt.tree().nodes if n.status == "running" and n.id != "root"]
    assert running == []
