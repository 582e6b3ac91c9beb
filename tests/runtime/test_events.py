"""The event stream: kinds and order, bounded buffers, structlog output, bound context."""

from __future__ import annotations

import itertools

import anyio
import pytest
import structlog
from structlog.testing import capture_logs

from fractor.actors import Agent, RequestStart, ScriptedModel, call, calls, fail, reply, tool
from fractor.actors._agent._policy import RetryPolicy
from fractor.runtime import Budget, Event, Runtime, Subscription

CONTEXTS: list[dict[str, object]] = []


@tool
async def lookup(topic: str) -> str:
    """Look a topic up, noting the logging context a user's tool would log with."""
    CONTEXTS.append(structlog.contextvars.get_contextvars())
    return f"notes on {topic}"


def kinds(events: list[Event]) -> list[str]:
    return [event.kind for event in events]


async def drain(subscription: Subscription, into: list[Event]) -> None:
    # One by one (not a comprehension): the caller cancels this mid-stream.
    async for event in subscription:
        into.append(event)  # noqa: PERF401


async def test_an_execution_emits_its_events_in_order() -> None:
    child = Agent(
        "child", ScriptedModel([call("lookup", topic="x"), reply("child done")]), tools=[lookup]
    )
    lead = Agent(
        "lead",
        ScriptedModel([call("child", task="go"), reply("lead done")]),
        subagents=[child],
    )
    seen: list[Event] = []
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        async with rt.events() as events, anyio.create_task_group() as tg:
            tg.start_soon(drain, events, seen)
            result = await ref.ask("start")
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    assert result.status == "completed"
    lead_events = [e for e in seen if e.agent == "lead"]
    child_events = [e for e in seen if e.agent == "child" and e.kind != "stop"]
    assert kinds(lead_events) == [
        "execution_start",
        "step_start",
        "request_start",
        "request_end",
        "spawn",
        "step_end",
        "step_start",
        "request_start",
        "text",  # the streamed answer, in one piece from a scripted reply
        "request_end",
        "step_end",
        "execution_end",
    ]
    assert kinds(child_events) == [
        "execution_start",
        "step_start",
        "request_start",
        "request_end",
        "tool_start",
        "tool_end",
        "step_end",
        "step_start",
        "request_start",
        "text",
        "request_end",
        "step_end",
        "execution_end",
    ]
    assert [e.detail["text"] for e in seen if e.kind == "text"] == ["child done", "lead done"]
    # Each model request: its model, usage, finish reason and the calls it asked for.
    asked = lead_events[3].detail
    assert asked["model"] == asked["response_model"] == "scripted"
    assert asked["finish_reason"] == "tool_calls"
    assert asked["input_tokens"] > 0
    assert [name for _, name in asked["tool_calls"]] == ["child"]
    assert lead_events[2].detail == RequestStart(step=0, attempt=1, model="scripted")
    spawn = lead_events[4]
    assert spawn.detail["child"] == "child"
    assert child_events[0].parent_id == lead_events[0].execution_id
    assert child_events[0].depth == lead_events[0].depth + 1
    assert child_events[5].detail["result"] == "notes on x"
    assert lead_events[-1].detail["status"] == "completed"
    assert all(a.at <= b.at for a, b in itertools.pairwise(seen))
    (stop,) = [e for e in seen if e.kind == "stop" and e.agent_id == child_events[0].agent_id]
    # An actor's stop names its parent actor and its depth among actors.
    assert (stop.parent_id, stop.depth) == (lead_events[0].agent_id, 2)


async def test_budget_deadline_and_retry_events() -> None:
    @tool
    async def slow() -> str:
        """Sleeps."""
        await anyio.sleep(10)
        return "late"  # pragma: no cover

    seen: list[Event] = []
    async with Runtime() as rt:
        retrying = Agent(
            "retrying",
            ScriptedModel([fail(ConnectionError("reset")), reply("ok")]),
            retry=RetryPolicy(retries=1, initial_delay=0),
        )
        limited = Agent(
            "limited", ScriptedModel([call("lookup", topic="a"), reply("x")]), tools=[lookup]
        )
        sleepy = Agent("sleepy", ScriptedModel([call("slow")]), tools=[slow])
        async with rt.events() as events, anyio.create_task_group() as tg:
            tg.start_soon(drain, events, seen)
            await (await rt.spawn(retrying)).ask("go")
            await (await rt.spawn(limited)).ask("go", budget=Budget(steps=1))
            await (await rt.spawn(sleepy)).ask("go", budget=Budget(seconds=0.05))
            await anyio.wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    (retry,) = [e for e in seen if e.kind == "retry"]
    assert retry.detail["attempt"] == 1
    assert "ConnectionError" in retry.detail["error"]
    (exceeded,) = [e for e in seen if e.kind == "budget_exceeded"]
    assert exceeded.agent == "limited"
    assert "steps limit of 1" in exceeded.detail["reason"]
    (deadline,) = [e for e in seen if e.kind == "deadline"]
    assert deadline.agent == "sleepy"


async def test_a_slow_observer_misses_events_and_is_told_but_never_stalls_agents() -> None:
    model = ScriptedModel(
        [calls(*(call("lookup", topic=str(i)) for i in range(20))), reply("done")]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("busy", model, tools=[lookup]))
        async with rt.events(buffer=3) as events:
            with anyio.fail_after(5):  # nobody reads: the agent must finish anyway
                result = await ref.ask("go")
            first = [events.receive_nowait() for _ in range(3)]
            assert events.receive_nowait() is None
            assert events.missed > 30
            # The next event delivered carries the count of what was missed.
            await ref.ask("again")
            later = events.receive_nowait()
    assert result.status == "completed"
    assert [e.missed for e in first if e is not None] == [0, 0, 0]
    assert later is not None
    assert later.missed >= 30


async def test_log_events_writes_through_structlog_with_context() -> None:
    model = ScriptedModel([call("lookup", topic="tides"), reply("ok")])
    CONTEXTS.clear()
    with capture_logs() as logs:
        async with Runtime(log_events=True) as rt:
            ref = await rt.spawn(Agent("logged", model, tools=[lookup]))
            result = await ref.ask("go")
    events = [entry for entry in logs if entry["event"] in ("execution_start", "execution_end")]
    assert [e["event"] for e in events] == ["execution_start", "execution_end"]
    assert events[0]["agent_id"] == ref.id
    assert events[0]["execution_id"] == result.execution_id
    assert events[0]["depth"] == 1
    # A tool's own log lines carry the execution's context, bound by the runtime.
    (context,) = CONTEXTS
    assert context["execution_id"] == result.execution_id
    assert context["agent_id"] == ref.id
    assert context["depth"] == 1
    assert structlog.contextvars.get_contextvars() == {}  # unbound after the execution


def listened(rt: Runtime) -> bool:
    return rt.event_bus.active


async def test_events_are_off_by_default() -> None:
    async with Runtime() as rt:
        assert not listened(rt)
        async with rt.events():
            assert listened(rt)
        assert not listened(rt)
        with pytest.raises(ValueError, match="buffer"):
            async with rt.events(buffer=0):
                pass  # pragma: no cover
