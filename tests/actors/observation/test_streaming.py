"""Streaming an ask (``AgentRef.stream``) and watching a running agent
(``AgentRef.progress``), with scripted models that stream in chunks."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel
import msgspec
import pytest

import fractor
import fractor.actors
from fractor.actors import (
    Agent,
    AgentStream,
    ApprovalAsked,
    ApprovalDecision,
    BudgetResume,
    BudgetWait,
    CompactionEnd,
    CycleModel,
    DeadlineReached,
    ExecutionEnd,
    ExecutionStart,
    FunctionModel,
    LimitReached,
    ModelRequest,
    ModelText,
    Progress,
    Restart,
    Retry,
    RetryPolicy,
    ScriptedModel,
    ToolEnd,
    ToolProgress,
    ToolStart,
    call,
    calls,
    reply,
    streamed,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import ActorStop, Budget, Event, EventDetail, MemoryStore, Record, Runtime

from ..sample_tools import hanging


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


@tool
async def pause(seconds: float) -> str:
    """Sleep a while."""
    await anyio.sleep(seconds)
    return "rested"


async def collect(run: AgentStream) -> list[Event]:
    events: list[Event] = []
    async for event in run:
        events.append(event)  # noqa: PERF401 (the stream is consumed as it comes)
    return events


def text_of(events: list[Event], depth: int = 1) -> str:
    return "".join(
        e.detail.text for e in events if isinstance(e.detail, ModelText) and e.depth == depth
    )


async def test_a_stream_yields_text_and_tool_calls_as_they_happen_then_the_result() -> None:
    model = ScriptedModel(
        [
            call("lookup", topic="tides", text="Looking it up."),
            streamed("Tides follow the moon.", chunks=4, delay=0.001),
        ]
    )
    agent = Agent("guide", model, tools=[lookup])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with ref.stream("Why tides?") as run:
            events = await collect(run)
        result = run.result
        conversation = await ref.conversation()

    # The very events of the runtime (one class per kind), not classes of a stream's.
    assert all(isinstance(e, Event) for e in events)
    kinds = [type(e.detail) for e in events]
    # The answer's four pieces, merged while the consumer is behind (a loaded machine).
    pieces = len(kinds) - 3
    assert 1 <= pieces <= 4, kinds
    assert kinds == [
        ModelText,  # the step that calls the tool says so first (trace, not answer)
        ToolStart,
        ToolEnd,
        *[ModelText] * pieces,
    ]
    started, finished = events[1].detail, events[2].detail
    assert isinstance(started, ToolStart)
    assert isinstance(finished, ToolEnd)
    assert (started.tool, started.call_id) == ("lookup", finished.call_id)
    assert finished.result == "notes on tides"
    assert not finished.is_error
    answer = [e.detail for e in events[3:] if isinstance(e.detail, ModelText)]
    assert [d.step for d in answer] == [1] * pieces
    assert "".join(d.text for d in answer) == "Tides follow the moon."
    assert all(e.depth == 1 and e.agent == "guide" for e in events[3:])  # the agent asked
    assert result.status == "completed"
    assert result.text == "Tides follow the moon."
    assert result.execution_id == events[0].execution_id
    # The same one answer as ask: the turn and the answer join the conversation.
    assert [m.content for m in conversation.messages] == ["Why tides?", "Tides follow the moon."]
    assert conversation.execution == ()


async def test_subagents_show_their_start_and_finish_and_their_text_only_when_asked() -> None:
    def child_model() -> ScriptedModel:
        return ScriptedModel([streamed("child notes", chunks=2)])

    def lead(child: Agent) -> Agent:
        return Agent(
            "lead",
            ScriptedModel([call("child", task="dig"), reply("lead done")]),
            subagents=[child],
        )

    async with Runtime() as rt:
        quiet = await rt.spawn(lead(Agent("child", child_model())))
        async with quiet.stream("go") as run:
            default = await collect(run)
        loud = await rt.spawn(lead(Agent("child", child_model())))
        async with loud.stream("go", subagents=True) as run:
            everything = await collect(run)

    # A subagent's start and end (the execution asked's own are the stream's).
    assert [type(e.detail) for e in default] == [ExecutionStart, ExecutionEnd, ModelText]
    started, finished = default[0], default[1]
    assert isinstance(started.detail, ExecutionStart)
    assert isinstance(finished.detail, ExecutionEnd)
    assert (started.agent, started.depth, started.detail.task) == ("child", 2, "dig")
    assert started.parent_id == default[2].execution_id
    assert finished.detail.status == "completed"
    assert text_of(everything, depth=2) == "child notes"
    assert text_of(everything, depth=1) == "lead done"
    assert text_of(default, depth=2) == ""


async def test_a_slow_consumer_never_stalls_the_agents_and_loses_no_text() -> None:
    pieces = [f"w{i} " for i in range(3_000)]
    text = "".join(pieces)
    model = ScriptedModel(
        [
            calls(*[call("lookup", topic=str(i)) for i in range(40)]),
            streamed(text, chunks=pieces),
        ]
    )
    agent = Agent("chatty", model, tools=[lookup])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with ref.stream("talk", buffer=8) as run:
            # Nobody reads until the agent has answered (a trace queues behind the
            # streamed task): it never waited for us.
            with anyio.fail_after(10):
                await ref.trace()
            assert not ref.progress().running
            events = await collect(run)
    assert run.result.status == "completed"
    assert text_of(events) == text  # merged into few events, none lost
    assert len([e for e in events if isinstance(e.detail, ModelText)]) <= 8
    tool_events = [e for e in events if isinstance(e.detail, ToolStart | ToolEnd)]
    assert len(tool_events) + run.missed == 80  # the ones past the buffer: counted
    assert run.missed > 0
    # The gap is said in the events after it, as to the runtime's subscribers.
    assert events[-1].missed == run.missed
    assert events[0].missed == 0


async def test_leaving_the_stream_early_stops_the_execution_and_keeps_what_streamed() -> None:
    model = ScriptedModel([streamed("x" * 200, chunks=100, delay=0.02)])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("talker", model))
        async with ref.stream("talk") as run:
            async for event in run:
                assert isinstance(event.detail, ModelText)
                break
        result = run.result
        traces = await ref.trace()
        conversation = await ref.conversation()
    assert result.status == "cancelled"
    assert "consumer left" in result.stop_reason
    (trace,) = traces
    (step,) = trace.steps
    assert step.interrupted
    assert step.response_text.startswith("xx")  # what had streamed: in the trace
    assert len(step.response_text) < 200
    # Invariant 2: the turn and one (synthesized) answer.
    assert [m.content for m in conversation.messages] == ["talk", result.text]


async def test_a_deadline_mid_stream_cuts_the_request_and_charges_what_was_received() -> None:
    model = ScriptedModel([streamed("y" * 400, chunks=100, delay=0.01)])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("slow", model))
        async with ref.stream("talk", budget=Budget(seconds=0.25)) as run:
            events = await collect(run)
        traces = await ref.trace()
    result = run.result
    assert result.status == "timed_out"
    stops = [e.detail for e in events if isinstance(e.detail, DeadlineReached)]
    assert [s.status for s in stops] == ["timed_out"]
    received = text_of(events)
    assert 0 < len(received) < 400
    (trace,) = traces
    assert trace.steps[0].response_text == received
    # Charged: the input estimate and an estimate of the text received (4 chars a token).
    assert result.usage.requests == 1
    assert result.usage.output_tokens == -(-len(received) // 4)
    assert result.usage.input_tokens == model.estimate_tokens(model.requests[0])


async def test_a_budget_stop_of_an_ancestor_cuts_a_childs_stream() -> None:
    """A sibling spends the shared tool-call budget: the tree stops, and the child
    that was streaming is cut mid-stream, its text so far in its trace."""
    talker = Agent("talker", ScriptedModel([streamed("z" * 300, chunks=100, delay=0.01)]))

    def busy_turns(request: ModelRequest) -> Turn:
        if request.messages[-1].content.startswith("notes"):
            return call("lookup", topic="again")
        return call("lookup", topic="first")

    busy = Agent("busy", FunctionModel(busy_turns), tools=[lookup])

    async def lead_turns(request: ModelRequest) -> Turn:
        return calls(call("talker", task="talk"), call("busy", task="work"))

    lead = Agent("lead", FunctionModel(lead_turns), subagents=[talker, busy])
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        # Let the talker stream a while before the sibling spends the budget.
        with anyio.fail_after(10):
            async with ref.stream("go", subagents=True, budget=Budget(tool_calls=1)) as run:
                events = await collect(run)
    result = run.result
    assert result.status == "budget_exceeded"
    assert "tool_calls" in result.stop_reason
    talker_end = [
        e.detail for e in events if isinstance(e.detail, ExecutionEnd) and e.agent == "talker"
    ]
    assert [d.status for d in talker_end] == ["budget_exceeded"]
    streamed_text = text_of(events, depth=2)
    assert len(streamed_text) < 300


async def test_progress_answers_at_once_while_the_agent_runs() -> None:
    hang, entered = hanging()
    model = ScriptedModel([call("hang"), streamed("done", chunks=2)])
    agent = Agent("worker", model, tools=[hang])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        idle = ref.progress()
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "work")
            with anyio.fail_after(5):
                await entered.wait()
            tg.start_soon(ref.ask, "more work")  # queued behind the first
            await anyio.wait_all_tasks_blocked()
            busy = ref.progress()
            # The mailbox is busy: a conversation snapshot waits, the progress did not.
            with anyio.move_on_after(0.05) as waited:
                await ref.conversation()
            tg.cancel_scope.cancel()
            ref.cancel()  # the hanging tool too, or the runtime would wait for it
    assert idle == Progress(agent_id=ref.id, running=False)
    assert waited.cancelled_caught
    assert busy.running
    assert busy.task == "work"
    assert busy.phase == "tools"
    assert [c.name for c in busy.in_flight] == ["hang"]
    assert busy.steps == ()  # the step in flight is not recorded yet
    assert busy.usage.requests == 1
    assert busy.queued == 1
    assert busy.nodes[0].id == busy.execution_id
    assert busy.nodes[0].status == "running"
    assert msgspec.json.decode(msgspec.json.encode(busy), type=Progress) == busy


async def test_progress_shows_the_text_streamed_so_far() -> None:
    model = ScriptedModel([streamed("abcdefghij", chunks=10, delay=0.05)])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("writer", model))
        async with ref.stream("write") as run:
            async for event in run:
                assert isinstance(event.detail, ModelText)
                if event.detail.text == "c":
                    seen = ref.progress()
        assert run.result.text == "abcdefghij"
        assert ref.progress().running is False
    assert seen.phase == "model"
    assert seen.streamed.startswith("abc")


async def test_a_refused_task_ends_the_stream_with_its_answer_and_no_events() -> None:
    agent = Agent("deep", ScriptedModel([reply("never")]))
    async with Runtime(budget=Budget(agents=0)) as rt:
        ref = await rt.spawn(agent)
        async with ref.stream("go") as run:
            events = await collect(run)
    assert events == []
    assert run.result.status == "budget_exceeded"


async def test_a_retry_is_announced_and_the_text_starts_over() -> None:
    attempts = 0

    async def flaky(request: ModelRequest) -> Turn:
        nonlocal attempts
        attempts += 1
        if attempts == 1:
            raise ConnectionError("the line dropped")
        return streamed("second try", chunks=2)

    agent = Agent("flaky", FunctionModel(flaky), retry=RetryPolicy(retries=1, initial_delay=0))
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with ref.stream("go") as run:
            events = await collect(run)
    assert type(events[0].detail) is Retry
    assert {type(e.detail) for e in events[1:]} == {ModelText}
    assert text_of(events) == "second try"  # only the attempt that answered streamed
    retry = events[0].detail
    assert isinstance(retry, Retry)
    assert "line dropped" in retry.error
    assert run.result.text == "second try"


async def test_the_result_is_only_there_once_the_stream_has_ended() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", ScriptedModel([reply("hi")])))
        run = ref.stream("go")
        with pytest.raises(RuntimeError, match="async with"):
            await run.__anext__()
        async with run:
            with pytest.raises(RuntimeError, match="not ended yet"):
                run.result  # noqa: B018
            await collect(run)
        assert run.result.text == "hi"
        with pytest.raises(ValueError, match="buffer"):
            ref.stream("go", buffer=0)


async def test_a_streams_events_are_the_runtimes_events_and_cross_a_wire_as_they_do() -> None:
    """What a stream yields is what ``rt.events()`` yields: the same ``Event`` (one
    class per kind), the text merged, each encoded and decoded as the bus's are."""
    model = ScriptedModel([call("lookup", topic="tides"), reply("Tides.")])
    async with Runtime() as rt, rt.events() as bus:
        ref = await rt.spawn(Agent("guide", model, tools=[lookup]))
        async with ref.stream("Why tides?") as run:
            events = await collect(run)
        seen = []
        while (one := bus.receive_nowait()) is not None:
            seen.append(one)
    assert [type(e.detail) for e in events] == [ToolStart, ToolEnd, ModelText]
    # Each streamed event is one the bus carried, field for field.
    fields = [msgspec.structs.asdict(e) for e in events]
    assert all(f in [msgspec.structs.asdict(e) for e in seen] for f in fields)
    from fractor.actors._observation._events import WireEvent

    decoded = msgspec.json.decode(msgspec.json.encode(events), type=list[WireEvent])
    assert [msgspec.structs.asdict(e) for e in decoded] == fields
    assert b'"kind":"text"' in msgspec.json.encode(events[-1])


async def test_a_hanging_tool_shows_in_progress_and_a_stream_left_early_cancels_it() -> None:
    hang, _ = hanging()
    agent = Agent("stuck", ScriptedModel([call("hang"), reply("unreachable")]), tools=[hang])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        with anyio.fail_after(5):
            async with ref.stream("go") as run:
                async for event in run:
                    if isinstance(event.detail, ToolStart):
                        assert [c.name for c in ref.progress().in_flight] == ["hang"]
                        break
        assert run.result.status == "cancelled"
        await anyio.lowlevel.checkpoint()
        assert ref.progress().running is False


async def test_a_model_that_does_not_stream_shows_its_text_in_one_piece() -> None:
    model = CycleModel(
        [call("lookup", id="call_0_0", topic="x", text="Let me see."), reply("Done.")]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("plain", model, tools=[lookup]))
        async with ref.stream("go") as run:
            events = await collect(run)
    texts = [(e.detail.text, e.detail.step) for e in events if isinstance(e.detail, ModelText)]
    assert texts == [("Let me see.", 0), ("Done.", 1)]
    assert run.result.text == "Done."


async def test_leaving_a_stream_whose_task_waits_in_the_mailbox_returns_at_once() -> None:
    entered, release = anyio.Event(), anyio.Event()

    @tool
    async def gate() -> str:
        """Wait to be let through."""
        entered.set()
        await release.wait()
        return "through"

    model = ScriptedModel([call("gate"), reply("first done"), reply("never")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("busy", model, tools=[gate]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "first")
            await entered.wait()
            with anyio.fail_after(1):  # not the 5 s a stop may wait for its answer
                async with ref.stream("second") as run:
                    pass
            assert ref.progress().queued == 1
            release.set()
        conversation = await ref.conversation()
    # Its consumer left before the agent took it: it never started, and says so.
    assert run.result.status == "cancelled"
    assert run.result.stop_reason == (
        "cancelled: the stream's consumer left before the task started"
    )
    assert [m.content for m in conversation.messages] == ["first", "first done"]
    assert model.remaining == 1  # the withdrawn task sent no request


async def test_a_stream_left_at_once_on_an_idle_agent_never_starts_its_task() -> None:
    """Either the task runs and the result says how it ended, or it never starts:
    here the consumer leaves before the agent takes it, so nothing of it stays."""
    model = ScriptedModel([reply("next done")])
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("idle", model), id="idle")
        async with ref.stream("go") as run:
            pass
        result = run.result  # at once, without iterating
        conversation = await ref.conversation()
        traces = await ref.trace()
        after = await ref.ask("next")  # the agent goes on as if it had never been asked
        records = await store.records()
    assert (result.status, result.steps, result.usage.requests) == ("cancelled", 0, 0)
    assert result.text.startswith("[cancelled] The task was not started")
    assert result.agent_id == ref.id
    assert conversation.messages == ()  # the result and the conversation agree
    assert traces == ()
    assert after.text == "next done"  # the first request is the next task's
    assert [b'"task":"next"' in r.data for r in records] == [True]  # "go" never ran
    assert rt.event_bus.watchers == {}


class GatedStore(MemoryStore):
    """A store whose ``records`` waits until ``gate`` is set (``entered`` then)."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = anyio.Event()
        self.gate = anyio.Event()

    async def records(self, **options: Any) -> list[Record]:
        self.entered.set()
        await self.gate.wait()
        return await super().records(**options)


async def test_a_stream_left_once_its_agent_took_the_task_answers_cancelled() -> None:
    """The agent took the task (it reads the store to resume) when the consumer left:
    the task is stopped as it starts, and the result waited for says so, as the
    conversation does."""
    store = GatedStore()
    model = ScriptedModel([reply("never")])
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(Agent("reader", model), id="reader")

        async def open_the_gate() -> None:
            await store.entered.wait()
            await anyio.wait_all_tasks_blocked()  # the stream waits for its answer
            store.gate.set()

        with anyio.fail_after(5):
            async with anyio.create_task_group() as tg:
                tg.start_soon(open_the_gate)
                async with ref.stream("go", resume=True) as run:
                    await store.entered.wait()  # the agent took the task: leave
        conversation = await ref.conversation()
    assert run.result.status == "cancelled"
    assert "consumer left" in run.result.stop_reason
    assert [m.content for m in conversation.messages] == ["go", run.result.text]
    assert model.remaining == 1  # stopped before its first request


#: The stream's classes of the release before, and an event's detail of each.
OLD_NAMES: dict[str, EventDetail] = {
    "TextDelta": ModelText(text="hi"),
    "ToolCallStarted": ToolStart(tool="t", call_id="c"),
    "ToolCallProgress": ToolProgress(tool="t", call_id="c", progress=1),
    "ToolCallFinished": ToolEnd(tool="t", call_id="c"),
    "SubagentStarted": ExecutionStart(task="x"),
    "SubagentFinished": ExecutionEnd(status="completed", reason="", steps=1, tokens=2),
    "BudgetWaiting": BudgetWait(reason="r"),
    "BudgetResumed": BudgetResume(seconds=1.0),
    "Retrying": Retry(attempt=1, error="e"),
    "ApprovalRequested": ApprovalAsked(id="i", tool="t", call_id="c"),
    "ApprovalDecided": ApprovalDecision(id="i", tool="t", call_id="c", approved=True),
    "Restarted": Restart(reason="r", restarts=1),
    "Compacted": CompactionEnd(ok=True, turns=1, covered=1),
    "Stopped": LimitReached(reason="r"),
}


@pytest.mark.parametrize("name", sorted(OLD_NAMES))
def test_an_old_name_of_a_stream_event_warns_naming_its_new_class(name: str) -> None:
    detail = OLD_NAMES[name]
    new = type(detail).__name__
    for module in (fractor, fractor.actors):
        with pytest.warns(DeprecationWarning, match=rf"{module.__name__}\.{name} .*{new}"):
            old = getattr(module, name)
        assert name not in module.__all__
    assert isinstance(Event(at=1.0, agent="a", depth=2, detail=detail), old)
    assert not isinstance(Event(at=1.0, detail=ActorStop(reason="x")), old)
    assert not isinstance(detail, old)  # an event is, not its detail


async def test_old_code_reading_a_stream_still_runs_with_warnings() -> None:
    """Code written for the stream's classes of before: ``isinstance`` and ``match``
    on the old names, their fields read on the event, each said to be deprecated."""
    with pytest.warns(DeprecationWarning, match="is deprecated and goes in the next release"):
        from fractor import Stopped, StreamEvent, TextDelta, ToolCallStarted  # type: ignore[attr-defined]

    def read(event: Any) -> str:  # as it was written
        match event:
            case ToolCallStarted(tool=name):
                return f"[{name}]"
            case TextDelta(text=text, depth=1):
                return str(text)
        return ""

    model = ScriptedModel([call("lookup", topic="tides"), streamed("Tides.", chunks=2)])
    seen: list[str] = []
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("guide", model, tools=[lookup]))
        async with ref.stream("go") as run:
            async for event in run:
                if not isinstance(event, ToolCallStarted | TextDelta):
                    continue
                with pytest.warns(DeprecationWarning, match=r"event\.\w+ is deprecated.*detail"):
                    seen.append(read(event))
    assert seen[0] == "[lookup]"
    assert "".join(seen[1:]) == "Tides."
    # Made as before, each is the event it stands for.
    stop = Stopped(agent="a", execution_id="e", depth=2, at=1.0, status="timed_out", reason="r")
    assert type(stop.detail) is DeadlineReached
    with pytest.warns(DeprecationWarning, match=r"read event\.detail\.(status|reason)"):
        assert (stop.status, stop.reason, stop.depth) == ("timed_out", "r", 2)
    text = TextDelta(agent="a", execution_id="e", depth=1, at=0.5, text="hi", step=2)
    assert text.detail == ModelText(text="hi", step=2)
    # What decoded the stream's events before decodes the runtime's.
    decoded = msgspec.json.decode(msgspec.json.encode([text]), type=list[StreamEvent])
    assert [d.detail for d in decoded] == [text.detail]
    with pytest.raises(AttributeError, match="has no attribute 'Nothing'"):
        fractor.Nothing  # type: ignore[attr-defined]  # noqa: B018
