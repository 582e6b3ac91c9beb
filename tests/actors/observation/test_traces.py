"""Traces: JSON export and load, trees collected from a store, rendering, the CLI."""

from __future__ import annotations

import re
from pathlib import Path

import anyio
import msgspec
import pytest

from fractor.actors import (
    Agent,
    AssistantMessage,
    ExecutionTrace,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    RestartPolicy,
    ScriptedModel,
    StepRecord,
    ToolCall,
    ToolOutcome,
    Usage,
    UserMessage,
    call,
    calls,
    collect_trace_tree,
    export_traces,
    load_traces,
    render_trace_tree,
    reply,
    tool,
)
from fractor.actors._observation._traces import trace_from_record, trace_record
from fractor.actors.cli import main
from fractor.runtime import Budget, MemoryStore, Runtime, SQLiteStore, Store

LONG = "a very long search query " * 8


@tool
async def search(query: str) -> str:
    """Search the web."""
    return f"results for {query}"


def researcher_model(request: ModelRequest) -> ModelResponse:
    """One search for the task, then an answer naming it; 'nested' delegates once more."""
    task = next(m for m in request.messages if isinstance(m, UserMessage)).content
    done = sum(isinstance(m, AssistantMessage) and bool(m.tool_calls) for m in request.messages)
    if done == 0:
        if task == "nested" and any(s.name == "checker" for s in request.tools):
            return call("checker", task="check nested")
        return call("search", query=task)
    return reply(f"report on {task}")


def team() -> Agent:
    checker = Agent("checker", FunctionModel(researcher_model), tools=[search])
    researcher = Agent(
        "researcher", FunctionModel(researcher_model), tools=[search], subagents=[checker]
    )
    broke = Agent(
        "broke",
        FunctionModel(lambda request: call("search", query="again")),
        tools=[search],
        budget=Budget(steps=2),
    )
    lead_model = ScriptedModel(
        [
            calls(
                call("researcher", task="tides"),
                call("researcher", task="nested"),
                call("broke", task="spend everything"),
                call("search", query=LONG),
            ),
            reply("All done: tides and nested."),
        ]
    )
    return Agent("lead", lead_model, subagents=[researcher, broke], tools=[search])


async def run_team(store: Store) -> str:
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(team(), id="lead")
        result = await ref.ask("Research everything")
    assert result.ok
    return result.execution_id


async def test_collect_renders_a_real_parent_and_subagent_run() -> None:
    store = MemoryStore()
    execution_id = await run_team(store)
    traces = await collect_trace_tree(store, execution_id)
    names = sorted(t.agent_name for t in traces)
    assert names == ["broke", "checker", "lead", "researcher", "researcher"]
    assert traces[0].execution_id == execution_id  # parents first
    assert await collect_trace_tree(store, "no-such-execution") == ()
    text = render_trace_tree(traces)
    lines = text.splitlines()

    def line(pattern: str) -> int:
        found = [i for i, text in enumerate(lines) if re.search(pattern, text)]
        assert len(found) == 1, (pattern, text)
        return found[0]

    def indent(index: int) -> int:
        return len(lines[index]) - len(lines[index].lstrip("│├└─ "))

    top = line(r"^lead \[lead#\d+\.[0-9a-f]+\] completed: final answer · 2 steps")
    assert top == 0
    # Each child execution sits right under the call that delegated it, one level in.
    for task in ("tides", "nested"):
        call_line = line(rf'researcher\(task="{task}"\) · .* · ok: "report on {task}"')
        child = call_line + 1
        assert re.search(r"researcher \[researcher#\d+\.[0-9a-f]+\] completed", lines[child])
        assert indent(child) == indent(call_line) + 4
        assert lines[child + 1].endswith(f'task: "{task}"')
    nested_call = line(r'checker\(task="check nested"\)')
    assert re.search(r"checker \[checker#\d+\.[0-9a-f]+\] completed", lines[nested_call + 1])
    broke_call = line(r'broke\(task="spend everything"\) · .* · error: "\[budget_exceeded\]')
    assert re.search(
        r"broke \[broke#\d+\.[0-9a-f]+\] budget_exceeded: steps limit of 2", lines[broke_call + 1]
    )
    # Arguments are cut short; durations and usage are shown.
    long_call = line(r"search\(query=\"a very long")
    assert "…" in lines[long_call]
    assert LONG.strip() not in text
    assert re.search(r"step 1 · tool_calls · model [\d.]+ ms · tools [\d.]+ m?s", text)
    assert re.search(r"[\d,]+ tokens \([\d,]+ in / [\d,]+ out\) · \d+ requests", lines[top])
    assert lines[-1] == '└── answer: "All done: tides and nested."'


def trace(
    execution_id: str,
    name: str,
    task: str,
    final: str,
    *,
    parent: str = "",
    steps: tuple[StepRecord, ...] = (),
) -> ExecutionTrace:
    return ExecutionTrace(
        execution_id=execution_id,
        agent_id=f"{name}-1",
        task=task,
        steps=steps,
        status="completed",
        stop_reason="final answer",
        final_text=final,
        usage=Usage(),
        seconds=0.5,
        parent_id=parent,
        agent_name=name,
    )


def delegation_step(*tasks: str) -> StepRecord:
    outcomes = tuple(
        ToolOutcome(
            call=ToolCall(
                id=f"c{i}", name="helper", arguments=msgspec.json.encode({"task": t}).decode()
            ),
            content=f"did {t}",
            is_error=False,
            seconds=0.1,
        )
        for i, t in enumerate(tasks)
    )
    return StepRecord(
        index=0,
        input_messages=1,
        response_text="",
        tool_calls=tuple(o.call for o in outcomes),
        outcomes=outcomes,
        usage=Usage(),
        model_seconds=0.01,
        tools_seconds=0.1,
        finish_reason="tool_calls",
    )


def test_children_are_matched_to_their_calls_by_task_not_by_finish_order() -> None:
    parent = trace("p#1", "parent", "go", "ok", steps=(delegation_step("first", "second"),))
    # The second call's child finished (and was saved) first; a third came from nowhere.
    second = trace("helper#3", "helper", "second", "did second", parent="p#1")
    first = trace("helper#2", "helper", "first", "did first", parent="p#1")
    stray = trace("helper#9", "helper", "stray", "did stray", parent="p#1")
    lines = render_trace_tree([parent, second, stray, first]).splitlines()
    first_call = next(i for i, text in enumerate(lines) if 'helper(task="first")' in text)
    second_call = next(i for i, text in enumerate(lines) if 'helper(task="second")' in text)
    assert "helper [helper#2]" in lines[first_call + 1]
    assert "helper [helper#3]" in lines[second_call + 1]
    delegated = next(i for i, text in enumerate(lines) if "the call is not in this trace" in text)
    assert "helper [helper#9]" in lines[delegated + 1]
    assert render_trace_tree([]) == "(no traces)\n"


async def test_export_and_load_round_trip() -> None:
    store = MemoryStore()
    traces = await collect_trace_tree(store, await run_team(store))
    data = export_traces(traces)
    document = msgspec.json.decode(data)
    assert document["format"] == "fractor.traces"
    assert document["version"] == 1
    assert load_traces(data) == traces
    assert load_traces(data.decode()) == traces
    assert load_traces(msgspec.json.encode(traces)) == traces  # a bare list loads too
    assert trace_record(traces[0]).id == traces[0].execution_id


def test_load_traces_refuses_what_is_not_an_export() -> None:
    with pytest.raises(ValueError, match="not a fractor trace export"):
        load_traces(b"{not json")
    with pytest.raises(ValueError, match="not a fractor trace export"):
        load_traces(b'{"traces": [{"execution_id": 3}]}')
    with pytest.raises(ValueError, match="newer fractor"):
        load_traces(b'{"format": "fractor.traces", "version": 2, "traces": []}')


def make_db(path: Path) -> str:
    async def build() -> str:
        async with SQLiteStore(path) as store:
            return await run_team(store)

    return anyio.run(build)


def test_the_cli_renders_an_id_from_a_db_and_a_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "traces.db"
    execution_id = make_db(db)
    out_file = tmp_path / "out.json"
    assert main(["trace", execution_id, "--db", str(db), "--export", str(out_file)]) == 0
    from_db = capsys.readouterr()
    assert from_db.out.startswith(f"lead [{execution_id}] completed")
    assert "exported 5 trace(s)" in from_db.err
    assert main(["trace", str(out_file)]) == 0
    from_file = capsys.readouterr().out
    assert from_file == from_db.out
    assert len(load_traces(out_file.read_bytes())) == 5


def test_the_cli_fails_clearly_with_exit_code_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = tmp_path / "traces.db"
    execution_id = make_db(db)
    assert main(["trace", "nope#1", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert "no execution 'nope#1'" in err
    assert f"recent executions: {execution_id}" in err
    garbage = tmp_path / "garbage.json"
    garbage.write_text("this is not json")
    assert main(["trace", str(garbage)]) == 2
    assert "cannot read trace file" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)  # no fractor.db here
    monkeypatch.delenv("FRACTOR_DB", raising=False)
    assert main(["trace", "lead#1"]) == 2
    assert "no database at 'fractor.db'" in capsys.readouterr().err
    monkeypatch.setenv("FRACTOR_DB", str(db))
    assert main(["trace", execution_id]) == 0
    assert capsys.readouterr().out.startswith("lead [")
    assert main(["trace", "x", "--db", str(garbage)]) == 2
    assert "not a database" in capsys.readouterr().err


# -- traces on every path ---------------------------------------------------------------


@tool
async def block(topic: str) -> str:
    """Blocks until the execution is stopped."""
    await anyio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def stored_tree(store: Store, execution_id: str) -> dict[str, ExecutionTrace]:
    traces = await collect_trace_tree(store, execution_id)
    return {trace.execution_id: trace for trace in traces}


@pytest.mark.parametrize("limit", ["deadline", "requests"])
async def test_an_interrupted_tree_stores_every_trace_with_its_step_in_flight(
    limit: str,
) -> None:
    """A lead delegates to three researchers at once. Under a deadline all three
    block in a tool; under the lead's ``requests`` limit, "t0" keeps searching until
    its request is refused, which stops the whole tree while the others block."""
    blocked = 0
    both_blocked = anyio.Event()

    @tool
    async def wait(topic: str) -> str:
        """Blocks until the execution is stopped."""
        nonlocal blocked
        blocked += 1
        if blocked == 2:
            both_blocked.set()
        await anyio.sleep_forever()
        raise AssertionError("unreachable")  # pragma: no cover

    async def researcher_answer(request: ModelRequest) -> ModelResponse:
        task = next(m for m in request.messages if isinstance(m, UserMessage)).content
        if task == "t0" and limit == "requests":
            await both_blocked.wait()
            return call("search", query="more")  # until the lead's limit refuses it
        return call("wait", topic=task)

    researcher = Agent("researcher", FunctionModel(researcher_answer), tools=[search, wait])
    lead_model = ScriptedModel([calls(*(call("researcher", task=f"t{i}") for i in range(3)))])
    lead = Agent("lead", lead_model, subagents=[researcher])
    budget = Budget(seconds=0.3) if limit == "deadline" else Budget(requests=6)
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(lead, id="lead")
        with anyio.fail_after(10):
            result = await ref.ask("Go", budget=budget)
    status = "timed_out" if limit == "deadline" else "budget_exceeded"
    assert result.status == status
    tree = await stored_tree(store, result.execution_id)
    top = tree.pop(result.execution_id)
    assert len(tree) == 3  # every child's trace, none lost
    (step,) = top.steps  # the delegating step, marked as interrupted
    assert step.interrupted
    assert step.error.startswith("interrupted while its tool calls ran")
    # Under the limit, "t0" answered (budget_exceeded): only the others were cut.
    cut = [limit == "deadline", True, True]
    assert [(o.call.name, o.interrupted) for o in step.outcomes] == [
        ("researcher", interrupted) for interrupted in cut
    ]
    assert "Done so far: 1 step(s) (the last one interrupted), 0 tool call(s), 3 subagent" in (
        top.final_text
    )
    assert f"{sum(cut)} interrupted" in top.final_text
    by_task = {child.task: child for child in tree.values()}
    for task, child in by_task.items():
        assert child.parent_id == result.execution_id
        assert child.status == status
        if task == "t0" and limit == "requests":
            *searched, refused = child.steps  # 3 of the 6 requests, then a refused one
            assert [s.usage.requests for s in searched] == [1, 1, 1]
            assert not refused.usage.requests
            assert not refused.interrupted
            assert "Done so far: 3 step(s), 3 tool call(s) (search)" in child.final_text
            continue
        (child_step,) = child.steps
        assert child_step.interrupted
        assert [(o.call.name, o.interrupted) for o in child_step.outcomes] == [("wait", True)]
    rendered = render_trace_tree([top, *tree.values()])
    assert "step 1 · interrupted" in rendered
    assert rendered.count('wait(topic="t') == (3 if limit == "deadline" else 2)


async def test_an_agent_stopped_during_a_tool_call_names_the_call_and_counts_it() -> None:
    model = ScriptedModel([call("search", query="q"), call("block", topic="t")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[search, block]))
        result = await ref.ask("Go", budget=Budget(seconds=0.2))
        (trace,) = await ref.trace()
    assert result.status == "timed_out"
    assert result.steps == 2
    first, second = trace.steps
    assert not first.interrupted
    assert second.interrupted
    assert [(o.call.name, o.interrupted) for o in second.outcomes] == [("block", True)]
    assert "Done so far: 2 step(s) (the last one interrupted), 2 tool call(s) (block, search)" in (
        result.text
    )
    assert "1 interrupted" in result.text


async def test_a_request_refused_by_the_budget_is_traced_but_not_counted_as_run() -> None:
    model = ScriptedModel([call("search", query="q"), reply("never")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model, tools=[search]))
        result = await ref.ask("Go", budget=Budget(requests=1))
        (trace,) = await ref.trace()
    assert result.status == "budget_exceeded"
    assert [step.usage.requests for step in trace.steps] == [1, 0]  # the second: refused
    assert "Done so far: 1 step(s), 1 tool call(s) (search)" in result.text


async def test_every_attempt_of_a_restarted_execution_is_kept_and_stored() -> None:
    def down(request: ModelRequest) -> ModelResponse:
        raise RuntimeError("the model is down")

    store = MemoryStore()
    agent = Agent("a", FunctionModel(down), restart=RestartPolicy(max_restarts=2, window=60))
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(agent, id="a")
        result = await ref.ask("Go")
        kept = await ref.trace()
    assert result.status == "failed"
    first, second = f"{result.execution_id}~1", f"{result.execution_id}~2"
    assert [(t.execution_id, t.attempt) for t in kept] == [
        (first, 1),
        (second, 2),
        (result.execution_id, 3),
    ]
    stored = {r.id: trace_from_record(r) for r in await store.records(actor_id="a")}
    assert sorted(stored) == sorted([first, second, result.execution_id])
    assert all(t.status == "failed" and t.task == "Go" for t in stored.values())
    assert stored[result.execution_id].attempt == 3
