"""Subagents and the supervisor, end to end (DESIGN.md sections 3 and 4)."""

from __future__ import annotations

import anyio
import anyio.lowlevel
import pytest

from fractor.actors import (
    Agent,
    AssistantMessage,
    ModelRequest,
    RestartPolicy,
    RetryPolicy,
    ScriptedModel,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    fail,
    reply,
    tool,
)
from fractor.runtime import Budget, Price, Runtime

from ..sample_tools import counting_work, hanging, stepped


def last_message_text(request: ModelRequest) -> str:
    return request.messages[-1].content


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


async def test_only_the_childs_final_response_reaches_the_parent() -> None:
    researcher = Agent(
        "researcher",
        stepped(call("lookup", topic="tides"), reply("CHILD FINAL: tides follow the moon")),
        tools=[lookup],
        description="Researches one topic.",
    )
    lead_model = ScriptedModel(
        [call("researcher", task="research tides"), reply("Lead: the moon drives tides.")]
    )
    lead = Agent("lead", lead_model, subagents=[researcher])
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("Why are there tides?")
        conversation = await ref.conversation()
        live_after = rt.statistics().live_actors
    assert result.status == "completed"
    assert result.text == "Lead: the moon drives tides."
    # The child's usage is part of the parent's: 2 lead requests + 2 child requests.
    assert result.usage.requests == 4
    assert result.usage.tool_calls == 1
    spec = next(s for s in lead_model.requests[0].tools if s.name == "researcher")
    assert "Researches one topic." in spec.description
    assert spec.parameters["required"] == ["task"]
    # The parent saw exactly one trace of the child: the tool result, its final text.
    second = lead_model.requests[1].messages
    results = [m for m in second if isinstance(m, ToolResultMessage)]
    assert [r.content for r in results] == ["CHILD FINAL: tides follow the moon"]
    everything = [m.content for m in second] + [m.content for m in conversation.messages]
    assert not any("notes on tides" in text for text in everything)
    assert conversation.messages == (
        UserMessage(content="Why are there tides?"),
        AssistantMessage(content="Lead: the moon drives tides."),
    )
    assert live_after == 1  # the child actor was stopped once it answered


async def test_three_children_run_concurrently() -> None:
    # Each call returns only once all three are in flight: children run one after
    # another would never get there (and fail_after says so), run at once they do.
    in_flight = 0
    all_in = anyio.Event()

    @tool
    async def slow_fetch(topic: str) -> str:
        """Waits for the other two calls."""
        nonlocal in_flight
        in_flight += 1
        if in_flight == 3:
            all_in.set()
        await all_in.wait()
        return topic

    child = Agent(
        "child", stepped(call("slow_fetch", topic="x"), reply("child done")), tools=[slow_fetch]
    )
    lead = Agent(
        "lead",
        ScriptedModel(
            [calls(*(call("child", task=f"part {i}") for i in range(3))), reply("all done")]
        ),
        subagents=[child],
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(10):
            result = await ref.ask("go")
    assert result.text == "all done"
    assert result.usage.tool_calls == 3
    assert all_in.is_set()


async def test_a_thousand_children_share_a_tool_call_budget_exactly() -> None:
    work, counter = counting_work()
    child = Agent("child", stepped(call("work"), reply("done")), tools=[work])
    lead = Agent(
        "lead",
        ScriptedModel([calls(*(call("child", task=f"t{i}") for i in range(1000))), reply("x")]),
        subagents=[child],
        tool_concurrency=1000,
        budget=Budget(tool_calls=100),
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(60):
            result = await ref.ask("fan out")
        await anyio.wait_all_tasks_blocked()  # let the cancelled children finish
        tree = rt.tree()
        live = rt.statistics().live_actors
    assert counter.ran == 100
    assert result.status == "budget_exceeded"
    assert result.usage.tool_calls == 100
    assert "tool_calls limit of 100 reached" in result.stop_reason
    children = [n for n in tree.nodes if n.name == "child"]
    assert len(children) == 1000
    assert all(n.status in ("completed", "budget_exceeded") for n in children)
    assert not any(n.status == "running" for n in tree.nodes if n.id != "root")
    assert live == 1


async def test_top_level_agents_share_the_runtime_budget_and_all_answer() -> None:
    work, counter = counting_work()
    agent = Agent("worker", stepped(call("work"), reply("done")), tools=[work])
    results = []
    async with Runtime(budget=Budget(tool_calls=100)) as rt:
        refs = [await rt.spawn(agent) for _ in range(300)]

        async def ask(index: int) -> None:
            results.append(await refs[index].ask("work"))

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for index in range(len(refs)):
                    tg.start_soon(ask, index)
    assert counter.ran == 100
    assert len(results) == 300
    assert {r.status for r in results} <= {"completed", "budget_exceeded"}
    assert sum(r.usage.tool_calls for r in results) == 100


async def test_deadline_times_out_the_whole_tree_and_nothing_keeps_running() -> None:
    @tool
    async def sleepy() -> str:
        """Sleeps 30 s."""
        await anyio.sleep(30)
        return "late"  # pragma: no cover

    grandchild = Agent("grandchild", stepped(call("sleepy"), reply("never")), tools=[sleepy])
    child = Agent(
        "child",
        stepped(calls(call("sleepy"), call("grandchild", task="deeper")), reply("never")),
        tools=[sleepy],
        subagents=[grandchild],
    )
    lead = Agent(
        "lead",
        ScriptedModel([calls(*(call("child", task=f"c{i}") for i in range(3))), reply("never")]),
        subagents=[child],
        budget=Budget(seconds=0.3),
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(10):  # not the children's tools' time: they were stopped
            result = await ref.ask("go")
        await anyio.wait_all_tasks_blocked()  # let the cancelled children finish
        tree = rt.tree()
        live = rt.statistics().live_actors
    assert result.status == "timed_out"
    assert "deadline of 0.3 s passed (budget of lead" in result.stop_reason
    assert result.text.startswith("[timed_out]")
    nodes = [n for n in tree.nodes if n.id != "root"]
    assert sorted(n.name for n in nodes) == ["child"] * 3 + ["grandchild"] * 3 + ["lead"]
    assert {n.status for n in nodes} == {"timed_out"}
    assert live == 1


async def test_a_failing_child_is_a_value_and_the_parent_finishes() -> None:
    broken = Agent("broken", stepped(fail(RuntimeError("child exploded"))))
    lead_model = ScriptedModel([call("broken", task="try"), reply("Recovered without it.")])
    lead = Agent("lead", lead_model, subagents=[broken])
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
    assert result.status == "completed"
    assert result.text == "Recovered without it."
    (tool_result,) = [
        m for m in lead_model.requests[1].messages if isinstance(m, ToolResultMessage)
    ]
    assert tool_result.is_error
    assert tool_result.content.startswith("[failed]")
    assert "RuntimeError: child exploded" in tool_result.content


async def test_escalation_fails_the_parent() -> None:
    broken = Agent("broken", stepped(fail(RuntimeError("child exploded"))), escalate=True)
    lead = Agent(
        "lead", ScriptedModel([call("broken", task="try"), reply("never")]), subagents=[broken]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
    assert result.status == "failed"
    assert "subagent 'broken' failed and escalated" in result.stop_reason


async def test_a_child_over_its_own_budget_answers_and_the_parent_carries_on() -> None:
    chatty = Agent(
        "chatty",
        stepped(call("lookup", topic="a"), call("lookup", topic="b"), reply("never")),
        tools=[lookup],
        budget=Budget(steps=2),
    )
    lead_model = ScriptedModel([call("chatty", task="talk"), reply("Parent carried on.")])
    lead = Agent("lead", lead_model, subagents=[chatty])
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
        tree = rt.tree()
    assert result.status == "completed"
    assert result.text == "Parent carried on."
    (tool_result,) = [
        m for m in lead_model.requests[1].messages if isinstance(m, ToolResultMessage)
    ]
    assert tool_result.content.startswith("[budget_exceeded]")
    assert "steps limit of 2 reached (budget of chatty" in tool_result.content
    assert tree.children(result.execution_id)[0].status == "budget_exceeded"


async def test_depth_limit_refuses_the_spawn_as_a_tool_error() -> None:
    leaf = Agent("leaf", stepped(reply("leaf")))
    middle = Agent(
        "middle", stepped(call("leaf", task="x"), reply("middle done")), subagents=[leaf]
    )
    lead_model = ScriptedModel([call("middle", task="x"), reply("lead done")])
    lead = Agent("lead", lead_model, subagents=[middle])
    async with Runtime(budget=Budget(depth=2)) as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
        tree = rt.tree()
    assert result.text == "lead done"
    assert [n.name for n in tree.nodes if n.name == "leaf"] == []
    middle_node = next(n for n in tree.nodes if n.name == "middle")
    assert middle_node.status == "completed"
    assert middle_node.depth == 2


async def test_output_tokens_are_reserved_by_capping_max_tokens() -> None:
    model = ScriptedModel(
        [
            call("lookup", topic="x", usage=None),
            reply("a long answer " * 40),
        ]
    )
    agent = Agent("a", model, tools=[lookup], max_tokens=500)
    async with Runtime(min_output_tokens=16) as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("go", budget=Budget(output_tokens=60))
    first, second = model.requests
    assert first.max_tokens == 60
    used_first = 60 - second.max_tokens  # type: ignore[operator]
    assert 0 < used_first < 60
    assert result.usage.output_tokens <= 60
    # The reply ran into the cap the budget set; asked again, it would like twice
    # that, but gets what the settled usage leaves, refused only when even its
    # minimum output (16) does not fit: here nothing is left, the budget is spent.
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith(
        "output_tokens limit of 60 reached: the next request needs about 16 (16 output), 0 left"
    )


async def test_a_reply_cut_by_its_own_max_tokens_is_not_a_budget_stop() -> None:
    model = ScriptedModel([reply("a long answer " * 40)])
    agent = Agent("a", model, max_tokens=20)
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go", budget=Budget(tokens=100_000))
    assert model.requests[0].max_tokens == 20
    assert result.status == "completed"


async def test_one_request_does_not_reserve_a_whole_budget_and_starve_its_siblings() -> None:
    child = Agent("child", stepped(call("lookup", topic="x"), reply("child done")), tools=[lookup])
    lead_model = ScriptedModel(
        [calls(*(call("child", task=str(i)) for i in range(5))), reply("ok")]
    )
    lead = Agent("lead", lead_model, subagents=[child], budget=Budget(tokens=200_000))
    async with Runtime() as rt:
        result = await (await rt.spawn(lead)).ask("fan out")
    # With no max_tokens anywhere, each request reserves the default cap, not the
    # whole headroom: five concurrent children all fit in a large budget.
    assert result.status == "completed"
    assert lead_model.requests[0].max_tokens == 4096


async def test_cost_is_computed_from_prices_and_limited() -> None:
    model = ScriptedModel([reply("x" * 400)], name="priced")
    agent = Agent("a", model)
    prices = {"priced": Price(input_per_million=1_000_000, output_per_million=2_000_000)}
    async with Runtime(prices=prices) as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("hi", budget=Budget(cost=600.0))
    # input: a handful of tokens at 1 per token; output capped so the cost fits.
    assert result.status == "completed"
    assert 0 < result.usage.cost <= 600.0
    cap = model.requests[0].max_tokens
    assert cap is not None
    assert 256 <= cap < 300
    assert result.usage.input_tokens + cap * 2 <= 600


async def test_a_cost_limit_without_a_price_is_refused_at_the_ask() -> None:
    model = ScriptedModel([reply("x")], name="unpriced")
    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", model))
        with pytest.raises(ValueError, match="no price is known for model 'unpriced'") as caught:
            await ref.ask("hi", budget=Budget(cost=1.0))
        conversation = await ref.conversation()
    assert "Runtime(prices={'unpriced': Price(...)})" in str(caught.value)
    assert model.requests == type(model.requests)()  # no request was sent
    assert conversation.messages == ()  # nothing half-written


async def test_a_cost_limit_without_a_price_fails_the_spawn() -> None:
    helper = Agent("helper", ScriptedModel([], name="helper-model"), budget=Budget(cost=1.0))
    lead = Agent("lead", ScriptedModel([], name="lead-model"), subagents=[helper])
    async with Runtime(
        prices={"lead-model": Price(input_per_million=1, output_per_million=1)}
    ) as rt:
        with pytest.raises(ValueError, match="no price is known for model 'helper-model'"):
            await rt.spawn(lead)
    async with Runtime(budget=Budget(cost=1.0)) as rt:
        with pytest.raises(ValueError, match="'lead-model'"):
            await rt.spawn(Agent("lead", ScriptedModel([], name="lead-model")))


async def test_model_requests_are_retried_with_backoff() -> None:
    model = ScriptedModel(
        [fail(ConnectionError("reset")), fail(TimeoutError("slow")), reply("third time")]
    )
    agent = Agent("a", model, retry=RetryPolicy(retries=2, initial_delay=0.001, jitter=0.5))
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("go")
    assert (result.status, result.text) == ("completed", "third time")
    assert result.usage.requests == 3


async def test_programming_errors_are_not_retried() -> None:
    model = ScriptedModel([fail(ValueError("bad request shape")), reply("unreached")])
    agent = Agent("a", model, retry=RetryPolicy(retries=3, initial_delay=0))
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go")
    assert result.status == "failed"
    assert model.remaining == 1


def test_retry_delays_grow_exponentially_within_bounds() -> None:
    policy = RetryPolicy(retries=5, initial_delay=0.1, max_delay=0.5, multiplier=2, jitter=0)
    assert [policy.delay(n) for n in range(1, 6)] == [0.1, 0.2, 0.4, 0.5, 0.5]
    jittery = RetryPolicy(initial_delay=1.0, jitter=0.2)
    assert all(0.8 <= jittery.delay(1) <= 1.2 for _ in range(50))
    with pytest.raises(ValueError, match=r"RetryPolicy\.multiplier"):
        RetryPolicy(multiplier=0.5)


async def test_a_failed_execution_is_restarted_with_a_fresh_buffer() -> None:
    model = ScriptedModel(
        [call("lookup", topic="x"), fail(ValueError("broke mid-way")), reply("second run")]
    )
    agent = Agent("a", model, tools=[lookup], restart=RestartPolicy(max_restarts=1))
    async with Runtime() as rt:
        ref = await rt.spawn(agent)
        result = await ref.ask("go")
        conversation = await ref.conversation()
        traces = await ref.trace()
    assert (result.status, result.text) == ("completed", "second run")
    # The restart began from the conversation alone: no tool trace of the failed run.
    restarted = model.requests[2].messages
    assert [type(m).__name__ for m in restarted] == ["UserMessage"]
    assert len(conversation.messages) == 2
    assert [t.status for t in traces] == ["failed", "completed"]


async def test_restarts_are_bounded_by_the_policy() -> None:
    model = ScriptedModel([fail(ValueError(f"boom {i}")) for i in range(5)])
    agent = Agent("a", model, restart=RestartPolicy(max_restarts=2, window=60))
    async with Runtime() as rt:
        result = await (await rt.spawn(agent)).ask("go")
    assert result.status == "failed"
    assert model.remaining == 2  # one run and two restarts


async def test_cancelling_a_node_cancels_its_subtree_and_the_ask_answers() -> None:
    hang, entered = hanging()
    child = Agent("child", stepped(call("hang"), reply("never")), tools=[hang])
    lead = Agent(
        "lead", ScriptedModel([call("child", task="x"), reply("never")]), subagents=[child]
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        results = []

        async def ask() -> None:
            results.append(await ref.ask("go"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await entered.wait()
            tree = rt.tree()
            lead_node = next(n for n in tree.nodes if n.name == "lead")
            assert [n.name for n in tree.children(lead_node.id)] == ["child"]
            assert tree.node(lead_node.id).status == "running"
            rt.supervisor.cancel(lead_node.id)
        after = rt.tree()
    (result,) = results
    assert result.status == "cancelled"
    assert {n.status for n in after.nodes if n.id != "root"} == {"cancelled"}


@pytest.mark.parametrize("own_budget", [None, Budget(tokens=100_000)], ids=["bare", "budgeted"])
async def test_cancelling_one_child_lets_its_parent_carry_on(own_budget: Budget | None) -> None:
    # A child with no budget of its own runs without a cancel scope of its own (its
    # actor's task is cancelled); one with a budget has its scope: the parent reads
    # the same kind of answer either way and goes on.
    hang, entered = hanging()
    child = Agent("child", stepped(call("hang"), reply("never")), tools=[hang], budget=own_budget)
    lead_model = ScriptedModel([call("child", task="x"), reply("carried on")])
    lead = Agent("lead", lead_model, subagents=[child])
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        results = []

        async def ask() -> None:
            results.append(await ref.ask("go"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(ask)
            await entered.wait()
            child_node = next(n for n in rt.tree().nodes if n.name == "child")
            rt.supervisor.cancel(child_node.id)
        after = rt.tree()
        live = rt.statistics().live_actors
    (result,) = results
    assert (result.status, result.text) == ("completed", "carried on")
    assert after.node(child_node.id).status == "cancelled"
    seen = [m for m in lead_model.requests[1].messages if isinstance(m, ToolResultMessage)]
    (tool_result,) = seen
    assert tool_result.is_error
    assert "cancelled" in tool_result.content
    assert f"cancelled (child {child_node.id!r})" in tool_result.content
    assert live == 1  # the child's actor has ended


async def test_the_tree_snapshot_is_live() -> None:
    seen = []
    gate = anyio.Event()

    @tool
    async def wait_here() -> str:
        """Waits for the test."""
        await gate.wait()
        return "released"

    lead = Agent("lead", ScriptedModel([call("wait_here"), reply("ok")]), tools=[wait_here])
    async with Runtime(budget=Budget(tokens=10_000)) as rt:
        ref = await rt.spawn(lead)
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                seen.append(await ref.ask("go"))

            tg.start_soon(ask)
            await anyio.wait_all_tasks_blocked()
            running = rt.tree()
            gate.set()
        done = rt.tree()
    (node,) = [n for n in running.nodes if n.name == "lead"]
    assert node.status == "running"
    assert node.parent_id == "root"
    assert node.actor_id == ref.id
    assert node.usage.requests == 1
    assert running.node("root").limits == Budget(tokens=10_000)
    assert done.node(node.id).status == "completed"
    assert seen[0].execution_id == node.id


async def test_tool_concurrency_bounds_the_children_running_at_once() -> None:
    running = peak = 0

    @tool
    async def work(topic: str) -> str:
        """Counts the children inside it at once."""
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await anyio.sleep(0.01)
        running -= 1
        return f"worked on {topic}"

    child = Agent("child", stepped(call("work", topic="x"), reply("child done")), tools=[work])
    parts = [call("child", task=f"part {i}") for i in range(10)]
    lead = Agent(
        "lead",
        ScriptedModel([calls(*parts, call("lookup", topic="side")), reply("merged")]),
        tools=[lookup],
        subagents=[child],
        tool_concurrency=3,
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
        trace = (await ref.trace())[-1]
        live = rt.statistics().live_actors
    assert result.status == "completed"
    assert peak == 3
    outcomes = trace.steps[0].outcomes
    # In call order, the plain tool call (last) included, each child's final answer.
    assert [o.call.id for o in outcomes] == [c.id for c in trace.steps[0].tool_calls]
    assert [o.content for o in outcomes] == ["child done"] * 10 + ["notes on side"]
    assert live == 1
