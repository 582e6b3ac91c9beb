"""When things began, as traces keep it (issue 31): an execution's wall-clock
``started``, each step's and tool call's ``started`` after it; old traces without
them still decode, and the stores and hosts carry them unchanged."""

from __future__ import annotations

import time
from pathlib import Path

import anyio
import msgspec

from fractor.actors import (
    Agent,
    ExecutionTrace,
    LocalHosts,
    ScriptedModel,
    call,
    calls,
    collect_trace_tree,
    reply,
    tool,
)
from fractor.actors._observation._traces import TRACE_KIND, trace_from_record
from fractor.actors.ui.charts import build_timeline
from fractor.runtime import MemoryStore, Record, Runtime, SQLiteStore


@tool
async def nap(x: int) -> str:
    """Answer ``x`` after 20 ms."""
    await anyio.sleep(0.02)
    return f"nap {x}"


@tool(approval=True)
async def send(to: str) -> str:
    """Send something."""
    return f"sent to {to}"


def two_naps() -> ScriptedModel:
    return ScriptedModel([calls(call("nap", x=1), call("nap", x=2)), reply("done")])


def without_starts(value: object) -> object:
    """A trace's builtins as a fractor written before start times were kept wrote them."""
    if isinstance(value, dict):
        return {k: without_starts(v) for k, v in value.items() if k != "started"}
    if isinstance(value, list | tuple):
        return [without_starts(v) for v in value]
    return value


async def test_a_trace_says_when_its_execution_steps_and_calls_began(tmp_path: Path) -> None:
    before = time.time()
    async with SQLiteStore(tmp_path / "traces.db") as store:
        async with Runtime(store=store) as rt:
            ref = await rt.spawn(Agent("lead", two_naps(), tools=[nap]))
            result = await ref.ask("go")
            (kept,) = await ref.trace()
        (stored,) = await collect_trace_tree(store, result.execution_id)
    # The SQLite store hands back exactly the trace the agent kept, starts included.
    assert stored == kept
    assert kept.started is not None
    assert before <= kept.started <= time.time()
    first, second = kept.steps
    assert first.started is not None
    assert second.started is not None
    assert 0 <= first.started < second.started <= kept.seconds
    # The calls began after the model answered, at once (two workers), and the next
    # step after both ended.
    starts = [outcome.started for outcome in first.outcomes]
    assert all(s is not None and s >= first.started + first.model_seconds for s in starts)
    one, two = (s for s in starts if s is not None)
    assert abs(one - two) < 0.01
    ends = [s + o.seconds for s, o in zip((one, two), first.outcomes, strict=True)]
    assert max(ends) <= second.started


def test_a_trace_written_without_start_times_decodes_with_none() -> None:
    step = msgspec.json.decode(
        b'{"index":0,"input_messages":1,"response_text":"","tool_calls":'
        b'[{"id":"c1","name":"nap","arguments":"{}"}],"outcomes":[{"call":'
        b'{"id":"c1","name":"nap","arguments":"{}"},"content":"nap 1","is_error":false,'
        b'"seconds":0.02}],"usage":{},"model_seconds":0.001,"tools_seconds":0.02,'
        b'"finish_reason":"tool_calls"}'
    )
    old = {
        "execution_id": "lead#1",
        "agent_id": "lead",
        "task": "go",
        "steps": [step],
        "status": "completed",
        "stop_reason": "final answer",
        "final_text": "done",
        "usage": {},
        "seconds": 0.03,
    }
    data = msgspec.json.encode(old)
    assert b"started" not in data
    trace = trace_from_record(Record(id="lead#1", data=data, kind=TRACE_KIND))
    assert trace.started is None
    assert trace.steps[0].started is None
    assert trace.steps[0].outcomes[0].started is None
    assert trace.steps[0].outcomes[0].content == "nap 1"
    (row,) = build_timeline((trace,)).rows  # laid out from its durations
    assert [bar.kind for bar in row.bars] == ["step", "model", "tool"]


async def test_a_trace_less_its_starts_decodes_as_it_was_with_none() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("lead", two_naps(), tools=[nap]))
        assert (await ref.ask("go")).ok
        (trace,) = await ref.trace()
    old = without_starts(msgspec.to_builtins(trace))
    decoded = msgspec.convert(old, ExecutionTrace)
    assert decoded.started is None
    assert all(step.started is None for step in decoded.steps)
    assert decoded == msgspec.structs.replace(
        trace,
        started=None,
        steps=tuple(
            msgspec.structs.replace(
                step,
                started=None,
                outcomes=tuple(msgspec.structs.replace(o, started=None) for o in step.outcomes),
            )
            for step in trace.steps
        ),
    )


async def test_a_call_approved_or_denied_starts_after_or_at_its_wait() -> None:
    model = ScriptedModel([calls(call("send", to="a"), call("send", to="b")), reply("ok")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", model, tools=[send]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "go")
            await anyio.wait_all_tasks_blocked()
            first, second = ref.approvals()
            ref.approve(first.id)
            await anyio.wait_all_tasks_blocked()
            ref.deny(second.id, "no")
        (trace,) = await ref.trace()
    step = trace.steps[0]
    approved, denied = step.outcomes
    assert approved.approval == "approved"
    assert denied.approval == "denied: no"
    assert approved.started is not None
    assert denied.started is not None
    assert step.started is not None
    tools_began = step.started + step.model_seconds
    # The approved call ran once its wait ended; the denied one's start is its wait's.
    assert approved.started - approved.waited >= tools_began - 1e-6
    assert denied.started >= tools_began - 1e-6
    assert abs((approved.started - approved.waited) - denied.started) < 0.01
    assert denied.started + denied.seconds > approved.started
    (row,) = build_timeline((trace,)).rows
    bars = [bar for bar in row.bars if bar.kind == "tool"]
    assert len({bar.lane for bar in bars}) == 2  # both waited at once: side by side
    assert bars[0].start == row.start + approved.started - approved.waited
    assert bars[1].start == row.start + denied.started


async def test_a_trace_from_a_host_keeps_its_starts() -> None:
    worker = Agent("worker", two_naps(), tools=[nap], description="Naps.")
    lead = Agent(
        "lead", ScriptedModel([call("worker", task="nap"), reply("done")]), subagents=[worker]
    )
    store = MemoryStore()
    async with Runtime(hosts=LocalHosts(1), store=store) as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
        tree = rt.tree()
    assert result.ok, result.stop_reason
    (node,) = [n for n in tree.nodes if n.name == "worker"]
    assert node.host == "default-0"
    top, child = await collect_trace_tree(store, result.execution_id)
    assert top.started is not None
    assert child.started is not None
    assert all(s.started is not None for s in child.steps)
    assert all(o.started is not None for s in child.steps for o in s.outcomes)
    (delegation,) = top.steps[0].outcomes
    assert delegation.started is not None
    # The worker began after its call did, on the same wall clock.
    assert top.started + delegation.started <= child.started + 1e-3
    assert child.started + child.seconds <= top.started + delegation.started + delegation.seconds
    lead_row, worker_row = build_timeline((top, child)).rows
    assert worker_row.start == child.started - top.started
    assert worker_row.start >= lead_row.start
