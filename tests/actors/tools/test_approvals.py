"""A human in the loop: tool calls held for a person's approval, answered through the
agent's ref at once (past the mailbox), with the deadline and cancellation still in
force while a call waits."""

from __future__ import annotations

from pathlib import Path

import anyio
import msgspec
import pytest

from fractor.actors import (
    Agent,
    AgentRef,
    ApprovalAsked,
    ApprovalDecision,
    ApprovalError,
    ApprovalRequest,
    FunctionModel,
    ModelRequest,
    ScriptedModel,
    ToolResultMessage,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._models._turns import Turn
from fractor.runtime import Budget, Event, Runtime, SQLiteStore

from ..sample_tools import RAN, send_email


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


async def pending(ref: AgentRef, count: int = 1) -> tuple[ApprovalRequest, ...]:
    """The approvals waiting in ``ref``'s tree, once everything else has run."""
    await anyio.wait_all_tasks_blocked()
    requests = ref.approvals()
    assert len(requests) == count, requests
    return requests


def results(model: ScriptedModel | FunctionModel) -> list[ToolResultMessage]:
    return [m for m in model.requests[-1].messages if isinstance(m, ToolResultMessage)]


async def test_an_approved_call_runs_and_the_trace_keeps_the_decision() -> None:
    model = ScriptedModel([call("send_email", to="ana@example.org"), reply("Sent.")])
    agent = Agent("mailer", model, tools=[send_email])
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "mail Ana")
            (request,) = await pending(ref)
            assert RAN == []  # held
            assert (request.agent, request.depth, request.path) == ("mailer", 1, ("mailer",))
            assert request.call.name == "send_email"
            assert ref.progress().in_flight == (request.call,)
            ref.approve(request.id)
        (trace,) = await ref.trace()
        assert ref.approvals() == ()
    assert RAN == ["ana@example.org"]
    (outcome,) = trace.steps[0].outcomes
    assert outcome.content == "sent to ana@example.org"
    assert outcome.approval == "approved"
    assert outcome.waited > 0
    assert trace.final_text == "Sent."


async def test_a_denied_call_is_a_result_the_model_reads() -> None:
    model = ScriptedModel([call("send_email", to="boss@example.org"), reply("I won't.")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "mail the boss")
            (request,) = await pending(ref)
            ref.deny(request, "not on a Sunday")  # the request itself names its id
        (trace,) = await ref.trace()
    assert RAN == []
    (result,) = results(model)
    assert result.is_error
    assert result.content == "[denied] a person denied this call: not on a Sunday"
    assert trace.steps[0].outcomes[0].approval == "denied: not on a Sunday"


async def test_several_calls_wait_in_one_step_and_the_others_go_on() -> None:
    model = ScriptedModel(
        [
            calls(
                call("send_email", to="a"),
                call("lookup", topic="x"),
                call("send_email", to="b"),
            ),
            reply("done"),
        ]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email, lookup]))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "go")
            first, second = await pending(ref, 2)
            assert [r.call.arguments for r in (first, second)] == ['{"to":"a"}', '{"to":"b"}']
            # The lookup did not wait for them.
            in_flight = ref.progress().in_flight
            assert [c.name for c in in_flight] == ["send_email", "send_email"]
            ref.deny(second.id)
            ref.approve(first.id)
    contents = [r.content for r in results(model)]
    assert contents == ["sent to a", "notes on x", "[denied] a person denied this call"]
    assert RAN == ["a"]


async def test_a_policy_on_the_agent_names_the_calls_that_need_approval() -> None:
    def risky(call_: object) -> bool:
        return '"danger"' in getattr(call_, "arguments", "")

    model = ScriptedModel(
        [calls(call("lookup", topic="safe"), call("lookup", topic="danger")), reply("ok")]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("careful", model, tools=[lookup], approval=risky))
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "go")
            (request,) = await pending(ref)
            assert request.call.arguments == '{"topic":"danger"}'
            ref.approve(request.id)
    by_name = Agent("named", ScriptedModel([reply("x")]), tools=[lookup], approval=["lookup"])
    assert by_name.approve is not None
    assert by_name.approve(call("lookup", topic="a").tool_calls[0])
    assert Agent("free", ScriptedModel([reply("x")]), tools=[lookup]).approve is None
    with pytest.raises(TypeError, match="tool names"):
        Agent("bad", ScriptedModel([reply("x")]), tools=[lookup], approval="lookup")


async def test_a_deadline_ends_the_wait() -> None:
    model = ScriptedModel([call("send_email", to="late"), reply("never")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email]))
        with anyio.fail_after(5):
            result = await ref.ask("go", budget=Budget(seconds=0.2))
        (trace,) = await ref.trace()
        assert ref.approvals() == ()  # withdrawn with the call
    assert result.status == "timed_out"
    assert RAN == []
    (outcome,) = trace.steps[0].outcomes
    assert outcome.interrupted


async def test_a_cancellation_ends_the_wait_and_withdraws_the_request() -> None:
    model = ScriptedModel([call("send_email", to="x"), reply("never")])
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", model, tools=[send_email]))
        async with ref.stream("go") as run:
            async for event in run:
                if isinstance(event.detail, ApprovalAsked):
                    requested = event.detail
                    break  # leaving the stream stops the execution
        assert run.result.status == "cancelled"
        assert ref.approvals() == ()
        with pytest.raises(ApprovalError, match="no approval"):
            ref.approve(requested.id)
    assert RAN == []


async def test_a_subagents_call_is_answered_through_the_top_agent() -> None:
    def mailer_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply(f"mailer: {request.messages[-1].content}")
        return call("send_email", to="team")

    mailer = Agent("mailer", FunctionModel(mailer_turns), tools=[send_email])
    lead = Agent("lead", ScriptedModel([call("mailer", task="mail the team"), reply("ok")]),
                 subagents=[mailer])  # fmt: skip
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        other = await rt.spawn(Agent("other", ScriptedModel([reply("x")])))
        async with ref.stream("go") as run:
            async for event in run:
                if isinstance(event.detail, ApprovalAsked):
                    requested = event
                    (request,) = ref.approvals()
                    assert other.approvals() == ()  # another tree's agent sees nothing
                    with pytest.raises(ApprovalError):
                        other.approve(request.id)
                    ref.approve(event.detail.id)
                if isinstance(event.detail, ApprovalDecision):
                    decided = event.detail
    assert (requested.agent, requested.depth) == ("mailer", 2)
    assert isinstance(requested.detail, ApprovalAsked)
    assert requested.detail.path == ("lead", "mailer")
    assert (request.agent, request.depth, request.path) == ("mailer", 2, ("lead", "mailer"))
    assert decided.approved
    assert decided.waited >= 0
    assert run.result.text == "ok"
    assert RAN == ["team"]


async def test_approval_events_and_requests_round_trip() -> None:
    request = ApprovalRequest(
        id="approval-1",
        agent="a",
        agent_id="a-1",
        execution_id="e",
        depth=1,
        path=("a",),
        call=call("send_email", to="x").tool_calls[0],
        at=0.5,
    )
    assert msgspec.json.decode(msgspec.json.encode(request), type=ApprovalRequest) == request
    assert msgspec.msgpack.decode(msgspec.msgpack.encode(request), type=ApprovalRequest) == request


async def test_bad_approval_answers_are_refused_clearly() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", ScriptedModel([reply("x")])))
        with pytest.raises(ApprovalError, match="approval-99"):
            ref.approve("approval-99")
        with pytest.raises(TypeError, match="named by its id"):
            ref.approve(7)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="reason must be a str"):
            ref.deny("approval-1", reason=3)  # type: ignore[arg-type]


async def test_a_subtree_on_another_host_asks_through_the_driver() -> None:
    """The request of a call on a host comes up with the streamed events; the
    top-level agent's ref answers it, and the call runs on the host."""
    from fractor.actors import LocalHosts

    def mailer_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply(request.messages[-1].content)
        return call("send_email", to="x")

    mailer = Agent("mailer", FunctionModel(mailer_turns), tools=[send_email])
    lead = Agent(
        "lead",
        ScriptedModel([call("mailer", task="mail"), reply("ok")]),
        subagents=[mailer],
    )
    asked: list[Event[ApprovalAsked]] = []
    async with Runtime(hosts=LocalHosts(1)) as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(10):
            async with ref.stream("go") as run:
                async for event in run:
                    if isinstance(event.detail, ApprovalAsked):
                        asked.append(event)  # type: ignore[arg-type]
                        ref.approve(event.detail.id)
        (trace,) = await ref.trace()
    assert run.result is not None
    assert run.result.status == "completed"
    (event,) = asked
    assert (event.detail.tool, event.depth, event.agent) == ("send_email", 2, "mailer")
    assert event.detail.path == ("lead", "mailer")
    assert event.detail.id.startswith("default-0/")
    assert event.detail.host == "default-0"  # it came from there
    (outcome,) = trace.steps[0].outcomes
    assert outcome.content == "sent to x"  # the mailer's answer: its call ran
    assert RAN == ["x"]


def on_the_wire(turns: list[Turn]) -> FunctionModel:
    """A model that encodes every request to JSON first, as a provider's client does
    (a lone surrogate raises there), then answers the next of ``turns``."""
    queue = list(turns)

    def answer(request: ModelRequest) -> Turn:
        msgspec.json.encode(request)
        return queue.pop(0)

    return FunctionModel(answer)


async def test_a_deny_reason_with_half_a_character_is_made_safe_at_the_door(
    tmp_path: Path,
) -> None:
    """The reason is text from outside: made safe where it comes in, so the model's
    next request is sent and the trace and the conversation are stored."""
    model = on_the_wire([call("send_email", to="boss"), reply("I won't.")])
    async with SQLiteStore(tmp_path / "agents.db") as store:
        async with Runtime(store=store) as rt:
            ref = await rt.spawn(Agent("mailer", model, tools=[send_email]), id="mailer")
            async with anyio.create_task_group() as tg:
                tg.start_soon(ref.ask, "mail the boss")
                (request,) = await pending(ref)
                ref.deny(request.id, "half \ud800 a reason")
            (trace,) = await ref.trace()
        records = await store.records()
        stored = await store.load("mailer")
    assert trace.final_text == "I won't."
    assert trace.steps[0].outcomes[0].approval == "denied: half \ufffd a reason"
    (result,) = results(model)
    assert result.content == "[denied] a person denied this call: half \ufffd a reason"
    assert [r.id for r in records] == [trace.execution_id]
    assert stored is not None
    assert b"I won't." in stored


def busy() -> ScriptedModel:
    """A step of three lookups and a call held for approval: more events than a
    buffer of one holds before the request."""
    lookups = [call("lookup", topic=t) for t in "abc"]
    return ScriptedModel([calls(*lookups, call("send_email", to="x")), reply("done")])


async def test_a_full_stream_still_shows_an_approval_request() -> None:
    """Events that ask something of the consumer are never dropped with the overflow:
    the agent would wait for a decision its consumer was never shown."""
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", busy(), tools=[send_email, lookup]))
        with anyio.fail_after(5):
            async with ref.stream("go", buffer=1) as run:
                (request,) = await pending(ref)  # the consumer is behind: the buffer is full
                ref.approve(request.id)
                events = [event async for event in run]
    assert run.missed > 0  # other events were dropped...
    (asked,) = [e.detail for e in events if isinstance(e.detail, ApprovalAsked)]  # ...not this
    assert (asked.id, asked.tool) == (request.id, "send_email")
    assert run.result.text == "done"


async def test_a_full_subscription_still_gets_an_approval_request() -> None:
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("mailer", busy(), tools=[send_email, lookup]))
        async with rt.events(buffer=1) as subscription, anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "go")
            (request,) = await pending(ref)
            ref.approve(request.id)
            await anyio.wait_all_tasks_blocked()
            events = []
            while (event := subscription.receive_nowait()) is not None:
                events.append(event)
    assert subscription.missed > 0
    (asked,) = [e for e in events if e.kind == "approval_request"]
    assert asked.detail["id"] == request.id
    assert asked.missed > 0  # it says how many were dropped before it


@pytest.mark.parametrize("hosts", [0, 1], ids=["here", "on_a_host"])
async def test_a_request_names_its_place_in_the_whole_tree_wherever_it_runs(hosts: int) -> None:
    """One meaning per name, local or on another host: ``path`` runs from the
    top-level agent down to the one that asked, ``depth`` counts from the top as the
    tree does (1: the top-level agent), in the request, its stream event and the
    runtime's event alike."""
    from fractor.actors import LocalHosts

    def mailer_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply(request.messages[-1].content)
        return call("send_email", to="x")

    def team_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply(f"team: {request.messages[-1].content}")
        return call("mailer", task="mail")

    mailer = Agent("mailer", FunctionModel(mailer_turns), tools=[send_email])
    team = Agent("team", FunctionModel(team_turns), subagents=[mailer])
    lead = Agent("lead", ScriptedModel([call("team", task="go"), reply("ok")]), subagents=[team])
    streamed: list[Event[ApprovalAsked]] = []
    listed: list[ApprovalRequest] = []
    async with Runtime(hosts=LocalHosts(hosts) if hosts else None) as rt:
        ref = await rt.spawn(lead)
        async with rt.events() as subscription:
            with anyio.fail_after(10):
                async with ref.stream("go") as run:
                    async for event in run:
                        if isinstance(event.detail, ApprovalAsked):
                            streamed.append(event)  # type: ignore[arg-type]
                            listed.extend(ref.approvals())
                            ref.approve(event.detail.id)
            published = []
            while (seen := subscription.receive_nowait()) is not None:
                if seen.kind == "approval_request":
                    published.append(seen)
        placed = {n.name: n.host for n in rt.tree().nodes}
    assert run.result.text == "ok"
    assert placed["team"] == ("default-0" if hosts else "")
    (request,) = listed
    (event,) = streamed
    (runtime_event,) = published
    assert request.path == event.detail.path == ("lead", "team", "mailer")
    assert tuple(runtime_event.detail["path"]) == request.path
    assert request.depth == event.depth == runtime_event.depth == 3
    assert (request.agent, event.agent) == ("mailer", "mailer")


async def test_a_call_waiting_for_a_person_holds_no_worker() -> None:
    # Issue 40 item 17: with one worker, the step's other calls go on while a call
    # waits for its approval, and it runs on that worker once approved.
    model = ScriptedModel(
        [
            calls(
                call("send_email", to="a"),
                call("lookup", topic="x"),
                call("lookup", topic="y"),
            ),
            reply("done"),
        ]
    )
    agent = Agent("mailer", model, tools=[send_email, lookup], tool_concurrency=1)
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        async with anyio.create_task_group() as tg:
            tg.start_soon(ref.ask, "go")
            (request,) = await pending(ref)
            # The lookups did not wait for the person.
            assert [c.name for c in ref.progress().in_flight] == ["send_email"]
            ref.approve(request.id)
    contents = [r.content for r in results(model)]
    assert contents == ["sent to a", "notes on x", "notes on y"]
    assert RAN == ["a"]


async def test_agent_id_has_one_meaning_in_requests_results_events_and_the_tree() -> None:
    """``agent_id`` is the id of the agent's actor wherever it is named: a request, a
    result, an event, and ``actor_id`` in ``rt.tree()``; ``execution_id`` is the
    execution's node. For the top-level agent it is ``ref.id``, not its execution's
    id; a subagent's actor is named by its one execution."""

    def mailer_turns(request: ModelRequest) -> Turn:
        if isinstance(request.messages[-1], ToolResultMessage):
            return reply("mailed")
        return call("send_email", to="team")

    mailer = Agent("mailer", FunctionModel(mailer_turns), tools=[send_email])
    lead = Agent(
        "lead",
        ScriptedModel([calls(call("mailer", task="mail"), call("send_email", to="me")),
                       reply("ok")]),
        subagents=[mailer],
        tools=[send_email],
    )  # fmt: skip
    listed: dict[str, ApprovalRequest] = {}
    async with Runtime() as rt, rt.events() as subscription:
        ref = await rt.spawn(lead)
        with anyio.fail_after(10):
            async with anyio.create_task_group() as group:

                async def decide() -> None:
                    while len(listed) < 2:
                        for request in await pending(ref, 2 - len(listed)):
                            listed[request.agent] = request
                            ref.approve(request)

                group.start_soon(decide)
                result = await ref.ask("go")
        tree = rt.tree()
        events = []
        while (event := subscription.receive_nowait()) is not None:
            events.append(event)
    assert result.text == "ok"
    top, sub = listed["lead"], listed["mailer"]
    assert top.agent_id == result.agent_id == ref.id
    assert top.execution_id == result.execution_id != ref.id
    for request in (top, sub):
        assert tree.node(request.execution_id).actor_id == request.agent_id
    for event in events:
        if event.execution_id:
            assert tree.node(event.execution_id).actor_id == event.agent_id, event
