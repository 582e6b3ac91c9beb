"""The timeline of stored traces (``fractor.actors.ui._timeline``): lanes, rows, SVG."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import anyio
import msgspec
import pytest

from fractor.actors import (
    Agent,
    ExecutionTrace,
    OpenAIModel,
    RestartPolicy,
    ScriptedModel,
    call,
    calls,
    collect_trace_tree,
    fail,
    reply,
    tool,
)
from fractor.actors.ui._timeline import (
    Bar,
    Row,
    Timeline,
    build_timeline,
    render_timeline_html,
    render_timeline_svg,
)
from fractor.runtime import MemoryStore, Runtime

SVG = "{http://www.w3.org/2000/svg}"


@tool
async def slow(x: int) -> str:
    """Answer ``x`` after 50 ms."""
    await anyio.sleep(0.05)
    return f"slow {x}"


async def stored(agent: Agent, task: str = "go") -> tuple[ExecutionTrace, ...]:
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask(task)
    return await collect_trace_tree(store, result.execution_id)


def overlap(a: Bar, b: Bar) -> bool:
    return a.start < b.end and b.start < a.end


def untimed(trace: ExecutionTrace) -> ExecutionTrace:
    """``trace`` as one written before start times were kept (every ``started`` None)."""
    steps = tuple(
        msgspec.structs.replace(
            step,
            started=None,
            outcomes=tuple(msgspec.structs.replace(o, started=None) for o in step.outcomes),
        )
        for step in trace.steps
    )
    return msgspec.structs.replace(trace, started=None, steps=steps)


def bars(row: Row, kind: str) -> list[Bar]:
    return sorted((bar for bar in row.bars if bar.kind == kind), key=lambda bar: bar.start)


def parses(svg: str) -> ET.Element:
    root = ET.fromstring(svg.encode())
    assert root.tag == f"{SVG}svg"
    return root


async def test_three_calls_of_one_step_run_side_by_side_on_their_own_lanes() -> None:
    model = ScriptedModel(
        [calls(call("slow", x=1), call("slow", x=2), call("slow", x=3)), reply("done")]
    )
    traces = await stored(Agent("lead", model, tools=[slow]))
    timeline = build_timeline(traces)
    (row,) = timeline.rows
    tools = [bar for bar in row.bars if bar.kind == "tool"]
    assert len(tools) == 3
    assert len({bar.lane for bar in tools}) == 3
    assert all(bar.lane >= 1 for bar in tools)
    assert all(overlap(a, b) for a in tools for b in tools)
    assert row.lanes == 4
    assert all(bar.end - bar.start >= 0.045 for bar in tools)
    steps = [bar for bar in row.bars if bar.kind == "step"]
    assert len(steps) == 2
    assert steps[0].end <= steps[1].start + 1e-9
    assert '"x":1' in tools[0].title.replace(" ", "")
    root = parses(render_timeline_svg(timeline))
    drawn = root.findall(f".//{SVG}g[@class='bar tool']")
    assert len(drawn) == 3
    assert {g.get("data-lane") for g in drawn} == {"1", "2", "3"}
    titles = [g.find(f"{SVG}title") for g in drawn]
    assert all(t is not None and "ok: slow" in (t.text or "") for t in titles)


async def test_calls_that_waited_for_a_slot_are_laid_one_after_another() -> None:
    model = ScriptedModel(
        [calls(call("slow", x=1), call("slow", x=2), call("slow", x=3)), reply("done")]
    )
    traces = await stored(Agent("lead", model, tools=[slow], tool_concurrency=1))
    (row,) = build_timeline(traces).rows
    tools = sorted((bar for bar in row.bars if bar.kind == "tool"), key=lambda b: b.start)
    assert {bar.lane for bar in tools} == {1}
    assert not any(overlap(a, b) for a, b in itertools.pairwise(tools))


@pytest.mark.parametrize("concurrency", [1, 2])
async def test_two_calls_are_laid_out_from_when_they_ran(concurrency: int) -> None:
    model = ScriptedModel([calls(call("slow", x=1), call("slow", x=2)), reply("done")])
    (trace,) = await stored(Agent("lead", model, tools=[slow], tool_concurrency=concurrency))
    assert trace.started is not None
    first, _ = trace.steps
    assert first.started is not None
    starts = [outcome.started for outcome in first.outcomes]
    assert all(started is not None and started >= first.started for started in starts)
    (row,) = build_timeline((trace,)).rows
    assert row.start == 0.0
    one, two = bars(row, "tool")
    # Each bar is where the trace says its call ran, on the row's axis.
    assert sorted([one.start, two.start]) == sorted(row.start + s for s in starts if s is not None)
    assert all(bar.end - bar.start >= 0.045 for bar in (one, two))
    step_one, step_two = bars(row, "step")
    assert step_one.start == row.start + first.started
    assert step_one.start <= one.start
    assert two.end <= step_two.start + 1e-9
    if concurrency == 2:  # they ran at once: side by side, on lanes of their own
        assert overlap(one, two)
        assert one.lane != two.lane
        assert abs(one.start - two.start) < 0.02
        assert row.lanes == 3
    else:  # the second waited for the first's slot: one after the other, on one lane
        assert not overlap(one, two)
        assert two.start >= one.end
        assert one.lane == two.lane == 1
        assert row.lanes == 2
    drawn = parses(render_timeline_svg((trace,))).findall(f".//{SVG}g[@class='bar tool']")
    assert len({g.get("data-lane") for g in drawn}) == concurrency


async def test_a_subagent_execution_is_the_row_under_its_parent() -> None:
    helper = Agent("helper", ScriptedModel([call("slow", x=7), reply("helped")]), tools=[slow])
    lead = Agent(
        "lead",
        ScriptedModel([calls(call("helper", task="help"), call("slow", x=1)), reply("done")]),
        subagents=[helper],
        tools=[slow],
    )
    traces = await stored(lead)
    timeline = build_timeline(traces)
    top, child = timeline.rows
    assert (top.label, top.depth, top.parent) == ("lead", 0, "")
    assert (child.label, child.depth, child.parent) == ("helper", 1, top.execution_id)
    (delegation,) = [bar for bar in top.bars if bar.kind == "subagent"]
    assert delegation.child == child.execution_id
    # The child's row starts at its own start: after its parent's step began and the
    # call that delegated it did, before that call ended.
    step = bars(top, "step")[0]
    assert step.start < delegation.start <= child.start < delegation.end
    lead_trace, helper_trace = sorted(traces, key=lambda t: t.parent_id != "")
    assert lead_trace.started is not None
    assert helper_trace.started is not None
    assert abs(child.start - (helper_trace.started - lead_trace.started)) < 1e-9
    helper_step = bars(child, "step")[0]
    assert child.start <= helper_step.start
    (plain,) = [bar for bar in top.bars if bar.kind == "tool"]
    assert overlap(plain, delegation)
    assert plain.lane != delegation.lane
    assert child.end <= timeline.end
    root = parses(render_timeline_svg(timeline))
    rows = root.findall(f".//{SVG}g[@data-execution]")
    assert [g.get("data-execution") for g in rows] == [top.execution_id, child.execution_id]


async def test_traces_without_start_times_are_laid_out_from_their_durations() -> None:
    helper = Agent("helper", ScriptedModel([call("slow", x=7), reply("helped")]), tools=[slow])
    lead = Agent(
        "lead",
        ScriptedModel(
            [calls(call("helper", task="help"), call("slow", x=1), call("slow", x=2)), reply("ok")]
        ),
        subagents=[helper],
        tools=[slow],
        tool_concurrency=1,
    )
    traces = tuple(map(untimed, await stored(lead)))
    timeline = build_timeline(traces)
    top, child = timeline.rows
    (delegation,) = bars(top, "subagent")
    assert child.start == delegation.start  # inferred: it starts with its call
    one, two = bars(top, "tool")
    step = bars(top, "step")[0]
    model = bars(top, "model")[0]
    assert delegation.start == one.start == model.end  # the calls start together
    assert step.start == 0.0
    # The tools' ~100 ms phase holds the two calls of ~50 ms and the subagent's on two
    # lanes: the second call waited for a slot (its start inferred, not read).
    assert not overlap(one, two)
    assert two.start > model.end
    assert row_lanes(top) == 2
    parses(render_timeline_svg(timeline))


def row_lanes(row: Row) -> int:
    return len({bar.lane for bar in row.bars if bar.lane})


async def test_a_failed_attempt_and_its_retry_are_both_shown() -> None:
    model = ScriptedModel([fail(RuntimeError("boom")), reply("done")], name="lead")
    agent = Agent("lead", model, restart=RestartPolicy(max_restarts=1))
    traces = await stored(agent)
    timeline = build_timeline(traces)
    task, first = timeline.rows
    assert not task.failed
    assert not task.attempt
    assert "attempt 2" in task.status
    assert first.attempt
    assert first.failed
    assert first.parent == task.execution_id
    assert first.label == "attempt 1"
    assert first.depth == 1
    assert first.end <= min(bar.start for bar in task.bars) + 1e-9
    assert any(bar.error and "boom" in bar.title for bar in first.bars)
    svg = render_timeline_svg(timeline)
    root = parses(svg)
    attempt = root.find(f".//{SVG}g[@class='row attempt failed']")
    assert attempt is not None
    assert attempt.get("data-execution") == first.execution_id


async def test_secrets_never_appear_the_traces_hold_them_redacted() -> None:
    key = "sk-live-very-secret-key-0123456789"
    model = OpenAIModel(
        "gpt-test",
        base_url="http://someone:hunter2pass@127.0.0.1:9/v1",
        api_key=key,
        timeout=2,
    )
    agent = Agent("lead", model)
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(agent)
        with anyio.fail_after(30):
            result = await ref.ask("answer this")
    assert not result.ok
    traces = await collect_trace_tree(store, result.execution_id)
    timeline = build_timeline(traces)
    svg = render_timeline_svg(timeline)
    html = render_timeline_html(traces, title="run")
    assert "127.0.0.1" in svg  # the error is there, its credentials are not
    for text in (svg, html):
        assert "hunter2pass" not in text
        assert key not in text
        assert key[:12] not in text
        assert "[redacted]" in text
    parses(svg)


def test_no_traces_give_an_empty_timeline_that_still_parses() -> None:
    assert build_timeline(()) == Timeline(rows=(), end=0.0)
    parses(render_timeline_svg(()))
