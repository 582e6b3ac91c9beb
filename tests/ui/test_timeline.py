"""The timeline of stored traces (``fractor.actors.ui._timeline``): lanes, rows, SVG."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET

import anyio

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


async def test_a_subagent_execution_is_the_row_under_its_parent() -> None:
    helper = Agent("helper", ScriptedModel([call("slow", x=7), reply("helped")]), tools=[slow])
    lead = Agent(
        "lead",
        ScriptedModel([calls(call("helper", task="help"), call("slow", x=1)), reply("done")]),
        subagents=[helper],
        tools=[slow],
    )
    timeline = build_timeline(await stored(lead))
    top, child = timeline.rows
    assert (top.label, top.depth, top.parent) == ("lead", 0, "")
    assert (child.label, child.depth, child.parent) == ("helper", 1, top.execution_id)
    (delegation,) = [bar for bar in top.bars if bar.kind == "subagent"]
    assert delegation.child == child.execution_id
    assert abs(child.start - delegation.start) < 1e-9
    (plain,) = [bar for bar in top.bars if bar.kind == "tool"]
    assert overlap(plain, delegation)
    assert plain.lane != delegation.lane
    assert child.end <= timeline.end
    root = parses(render_timeline_svg(timeline))
    rows = root.findall(f".//{SVG}g[@data-execution]")
    assert [g.get("data-execution") for g in rows] == [top.execution_id, child.execution_id]


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
