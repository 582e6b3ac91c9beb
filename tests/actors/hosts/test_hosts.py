"""Subtrees on other hosts keep every promise of a local tree (issue: scale-out).

Each scenario runs on hosts in this process (``LocalHosts``) and on a real local Ray
instance (``RayHosts``), on both backends of the driver: a tree spread over two hosts
answers; one shared budget holds across hosts with zero overshoot and no premature
stop; a deadline, a cancellation and a spent limit reach remote subtrees; a lost host
answers ``failed`` and its leases count as spent; nothing hangs.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import msgspec
import pytest

from fractor.actors import (
    Agent,
    ApprovalError,
    ExecutionEnd,
    ExecutionStart,
    LocalHosts,
    ModelText,
    RestartPolicy,
    ScriptedModel,
    ToolStart,
    call,
    calls,
    fail,
    reply,
    tool,
)
from fractor.runtime import Budget, Caps, MemoryStore, Runtime

from .conftest import MakeHosts
from .trees import SLOW, asking, digger, guarded, lead, nested_worker, researcher, until


async def test_a_tree_spread_over_two_hosts_answers(make_hosts: MakeHosts) -> None:
    tasks = [f"topic {i}" for i in range(6)]
    store = MemoryStore()
    async with Runtime(hosts=make_hosts(2), store=store) as rt:
        ref = await rt.spawn(lead(nested_worker(), tasks))
        result = await ref.ask("Research six topics.")
        tree = rt.tree()
        outcomes = (await ref.trace())[-1].steps[0].outcomes
    assert (result.status, result.text) == ("completed", "All done."), result.stop_reason
    # Each worker's answer came back as its call's result, its helper's inside it.
    assert [o.content for o in outcomes] == [f"{t}: found help with {t}" for t in tasks]
    workers = [n for n in tree.nodes if n.name == "worker"]
    helpers = [n for n in tree.nodes if n.name == "helper"]
    assert sorted(n.host for n in workers) == ["default-0"] * 3 + ["default-1"] * 3
    # A placed subtree stays whole on its host: each helper runs beside its worker.
    by_id = {n.id: n for n in tree.nodes}
    assert len(helpers) == 6
    assert all(h.host == by_id[h.parent_id or ""].host for h in helpers)
    assert all(h.depth == 3 and h.status == "completed" for h in helpers)
    # One ledger: the lead's usage includes every remote execution's.
    lead_node = tree.node(result.execution_id)
    assert result.usage == lead_node.usage
    assert lead_node.usage.requests == 2 + 6 * 2 + 6 * 2  # lead, workers, helpers
    assert lead_node.usage.tool_calls == 6
    # The driver's store holds every trace of the tree: the remote ones too.
    stored = {record.id: record for record in await store.records()}
    assert {n.id for n in workers + helpers} <= set(stored)
    assert all(stored[n.id].parent_id == result.execution_id for n in workers)


async def test_one_budget_across_hosts_overshoots_nothing_and_stops_nothing_early(
    make_hosts: MakeHosts,
) -> None:
    # The demand of 40 children, measured without a budget, then given as the limit
    # on every field at once (tokens with room for the last request's minimum output,
    # 16, beyond its real 3): everything completes (no premature stop), nothing is over
    # (no overshoot).
    tasks = [f"t{i}" for i in range(40)]
    async with Runtime(hosts=make_hosts(2)) as rt:
        unlimited = await (await rt.spawn(lead(researcher(), tasks))).ask("go")
    demand = unlimited.usage
    budget = Budget(
        tokens=demand.total_tokens + 16,
        input_tokens=demand.input_tokens,
        requests=demand.requests,
        tool_calls=demand.tool_calls,
        agents=len(tasks),
        steps=1 + 2 * len(tasks) + 1,
    )
    async with Runtime(hosts=make_hosts(2), min_output_tokens=16) as rt:
        result = await (await rt.spawn(lead(researcher(max_tokens=64), tasks, budget))).ask("go")
        tree = rt.tree()
        held = rt.tree().node(result.execution_id)
    assert result.status == "completed", result.stop_reason
    assert [n.status for n in tree.nodes if n.name == "worker"] == ["completed"] * 40
    usage = held.usage
    assert usage.total_tokens <= budget.tokens  # type: ignore[operator]
    assert usage.input_tokens <= budget.input_tokens  # type: ignore[operator]
    assert usage.requests <= budget.requests  # type: ignore[operator]
    assert usage.tool_calls <= budget.tool_calls  # type: ignore[operator]
    assert held.agents <= 40
    assert held.steps <= budget.steps  # type: ignore[operator]


#: The concurrent children of the test below: 500 (the issue's case) under ``make
#: stress``, 150 in the suite (its two runs of 500 took 17 s of one worker's time).
CHILDREN = 500 if os.environ.get("FRACTOR_STRESS") else 150


async def test_hundreds_of_concurrent_children_on_two_hosts_share_one_budget_exactly(
    make_hosts: MakeHosts,
) -> None:
    # Hundreds of children across 2 hosts under one budget on every field, sized to
    # their demand: none stops early, nothing is over, every lease comes back.
    tasks = [f"t{i}" for i in range(CHILDREN)]
    caps = Caps(agents=None)
    async with Runtime(hosts=make_hosts(2), caps=caps) as rt:
        demand = (await (await rt.spawn(lead(researcher(max_tokens=64), tasks))).ask("go")).usage
    budget = Budget(
        tokens=demand.total_tokens + 16,
        output_tokens=demand.output_tokens + 16,
        requests=demand.requests,
        tool_calls=demand.tool_calls,
        agents=CHILDREN,
        steps=1 + 2 * CHILDREN + 1,
    )
    async with Runtime(hosts=make_hosts(2), caps=caps, min_output_tokens=16) as rt:
        ref = await rt.spawn(lead(researcher(max_tokens=64), tasks, budget))
        result = await ref.ask("go")
        tree = rt.tree()
        root = rt.supervisor.root
        asks = rt.supervisor.ledger.asks
    assert result.status == "completed", result.stop_reason
    workers = [n for n in tree.nodes if n.name == "worker"]
    assert [n.status for n in workers] == ["completed"] * CHILDREN
    assert {n.host for n in workers} == {"default-0", "default-1"}
    node = tree.node(result.execution_id)
    assert node.usage.total_tokens <= budget.tokens  # type: ignore[operator]
    assert node.usage.output_tokens <= budget.output_tokens  # type: ignore[operator]
    assert node.usage.requests <= budget.requests  # type: ignore[operator]
    assert node.usage.tool_calls <= budget.tool_calls  # type: ignore[operator]
    assert (node.agents, node.steps) == (CHILDREN, 2 * CHILDREN + 2)
    # The subtrees of the lead on one host draw from one lease, which grows
    # geometrically: a few round trips for each host, not one for each subtree.
    assert 2 <= asks <= 2 * 20
    assert root.held is not None
    assert (root.held.leases, root.held.tokens, root.held.steps, root.held.agents) == (0, 0, 0, 0)


async def test_a_spent_budget_stops_remote_subtrees_with_an_honest_reason(
    make_hosts: MakeHosts,
) -> None:
    tasks = [f"t{i}" for i in range(20)]
    budget = Budget(tokens=1_500)
    async with Runtime(hosts=make_hosts(2), min_output_tokens=16) as rt:
        ref = await rt.spawn(lead(researcher(max_tokens=32), tasks, budget))
        result = await ref.ask("go")
        tree = rt.tree()
        lead_node = tree.node(result.execution_id)
    assert result.status == "budget_exceeded"
    assert result.stop_reason.startswith("tokens limit of 1,500 reached")
    assert lead_node.usage.total_tokens <= 1_500  # zero overshoot across hosts
    workers = [n for n in tree.nodes if n.name == "worker"]
    assert {n.status for n in workers} <= {"completed", "budget_exceeded"}
    assert any(n.status == "completed" for n in workers)  # it spent, then stopped
    assert all(n.host for n in workers)
    stopped = [n for n in workers if n.status == "budget_exceeded"]
    assert all("(budget of lead" in n.stop_reason for n in stopped)


async def test_a_deadline_reaches_remote_subtrees(make_hosts: MakeHosts) -> None:
    tasks = [f"slow {i}" for i in range(4)]
    async with Runtime(hosts=make_hosts(2)) as rt:
        ref = await rt.spawn(lead(digger(), tasks, Budget(seconds=0.5)))
        with anyio.fail_after(10):  # not the 30 s of the remote tools: stopped there
            result = await ref.ask("go")
        tree = rt.tree()
    assert result.status == "timed_out", result.stop_reason
    workers = [n for n in tree.nodes if n.name == "worker"]
    assert [n.status for n in workers] == ["timed_out"] * 4
    assert all("did not answer" not in n.stop_reason for n in workers)


async def test_a_cancellation_reaches_remote_subtrees(make_hosts: MakeHosts) -> None:
    tasks = [f"slow {i}" for i in range(4)]
    async with Runtime(hosts=make_hosts(2)) as rt:
        ref = await rt.spawn(lead(digger(), tasks))
        async with anyio.create_task_group() as tg:
            results = []

            async def ask() -> None:
                results.append(await ref.ask("go"))

            tg.start_soon(ask)
            await until(lambda: sum(n.name == "worker" for n in rt.tree().nodes) == 4)
            await anyio.sleep(0.2)  # the remote tools are running
            lead_node = next(n for n in rt.tree().nodes if n.name == "lead")
            with anyio.fail_after(10):  # not the 30 s of the remote tools
                rt.supervisor.cancel(lead_node.id)
                await until(lambda: bool(results))
        tree = rt.tree()
    assert results[0].status == "cancelled"
    workers = [n for n in tree.nodes if n.name == "worker"]
    assert [n.status for n in workers] == ["cancelled"] * 4
    assert all("did not answer" not in n.stop_reason for n in workers)


async def test_a_dead_host_answers_failed_and_what_its_leases_held_comes_back(
    make_hosts: MakeHosts,
) -> None:
    # Workers alternate between the two hosts: the even ones (on default-0) dig
    # slowly; default-0 is killed while they do.
    tasks = [f"slow {i}" if i % 2 == 0 else f"quick {i}" for i in range(6)]
    budget = Budget(tokens=100_000, tool_calls=50)
    hosts = make_hosts(2)
    async with Runtime(hosts=hosts) as rt:
        ref = await rt.spawn(lead(digger(), tasks, budget))
        async with anyio.create_task_group() as tg:
            results = []

            async def ask() -> None:
                results.append(await ref.ask("go"))

            tg.start_soon(ask)
            await until(lambda: sum(n.name == "worker" for n in rt.tree().nodes) == 6)
            await anyio.sleep(0.3)
            hosts.kill("default-0")  # type: ignore[attr-defined]
        tree = rt.tree()
        lead_node = rt.supervisor.root  # the lead's execution has ended: its ancestor
        held = lead_node.held
    assert results[0].status == "completed", results[0].stop_reason
    workers = {n.id: n for n in tree.nodes if n.name == "worker"}
    lost = [n for n in workers.values() if n.host == "default-0"]
    alive = [n for n in workers.values() if n.host == "default-1"]
    assert [n.status for n in lost] == ["failed"] * 3
    assert all("host 'default-0' lost" in n.stop_reason for n in lost)
    assert [n.status for n in alive] == ["completed"] * 3
    # The host is known dead (killed: its process is gone), and its subtrees were in a
    # tool call, no request in flight: everything their leases held came back.
    assert held is not None
    assert held.leases == 0
    assert (held.tokens, held.tool_calls) == (0, 0)
    assert held.lost is not None
    assert (held.lost.tokens, held.lost.tool_calls) == (0, 0)


async def test_an_agent_pinned_to_a_pool_runs_there(make_hosts: MakeHosts) -> None:
    gpu_worker = researcher("gpu_worker", host="gpu")
    lead_agent = Agent(
        "lead",
        ScriptedModel([calls(call("gpu_worker", task="render")), reply("ok")]),
        subagents=[gpu_worker],
    )
    async with Runtime(hosts=make_hosts(pools={"default": 1, "gpu": 1})) as rt:
        result = await (await rt.spawn(lead_agent)).ask("go")
        node = next(n for n in rt.tree().nodes if n.name == "gpu_worker")
    assert result.status == "completed", result.stop_reason
    assert (node.host, node.status) == ("gpu-0", "completed")


async def test_a_pool_with_no_host_refuses_the_call_clearly() -> None:
    lead_agent = Agent(
        "lead",
        ScriptedModel([calls(call("w", task="x")), reply("ok")]),
        subagents=[researcher("w", host="gpu")],
    )
    async with Runtime(hosts=LocalHosts(1)) as rt:
        ref = await rt.spawn(lead_agent)
        result = await ref.ask("go")
        outcome = (await ref.trace())[-1].steps[0].outcomes[0]
    assert result.status == "completed"
    assert outcome.is_error
    assert "runs on a host of pool 'gpu', and none is known (pools: default)" in outcome.content


async def test_events_of_remote_executions_reach_the_driver_with_their_host(
    make_hosts: MakeHosts,
) -> None:
    async with Runtime(hosts=make_hosts(2)) as rt:
        ref = await rt.spawn(lead(nested_worker(), ["a", "b"]))
        async with rt.events() as subscription:
            result = await ref.ask("go")
            # A host sends a subtree's events before its answer: all are here.
            events = []
            while (event := subscription.receive_nowait()) is not None:
                events.append(event)
    assert result.status == "completed", result.stop_reason
    remote = [e for e in events if e.agent in ("worker", "helper")]
    # Each remote execution's events, in its order, at its place in the whole tree.
    for agent, depth in (("worker", 2), ("helper", 3)):
        ends = [e for e in remote if e.agent == agent and e.kind == "execution_end"]
        assert len(ends) == 2
        assert all(e.depth == depth for e in remote if e.agent == agent)
    assert {e.detail["host"] for e in remote} == {"default-0", "default-1"}
    tools = [e for e in remote if e.kind == "tool_start"]
    assert [e.agent for e in tools] == ["helper", "helper"]
    workers = {e.execution_id for e in remote if e.agent == "worker"}
    lead_id = result.execution_id
    assert all(e.parent_id == lead_id for e in remote if e.agent == "worker")
    assert all(e.parent_id in workers for e in remote if e.agent == "helper")


async def test_a_streamed_ask_sees_its_remote_subtrees_without_a_subscriber(
    make_hosts: MakeHosts,
) -> None:
    async with Runtime(hosts=make_hosts(2)) as rt:
        ref = await rt.spawn(lead(nested_worker(), ["a", "b"]))
        assert not rt.event_bus.active  # nobody subscribes: only the stream watches
        async with ref.stream("go", subagents=True) as run:
            events = [event async for event in run]
    assert run.result.status == "completed", run.result.stop_reason
    started = [e for e in events if isinstance(e.detail, ExecutionStart)]
    finished = [e for e in events if isinstance(e.detail, ExecutionEnd)]
    # Both workers and their helpers, at their depth in the whole tree, each ended.
    assert sorted((e.agent, e.depth) for e in started) == [
        ("helper", 3),
        ("helper", 3),
        ("worker", 2),
        ("worker", 2),
    ]
    assert sorted(e.execution_id for e in finished) == sorted(e.execution_id for e in started)
    assert all(e.detail.status == "completed" for e in finished)  # type: ignore[attr-defined]
    tools = [e for e in events if isinstance(e.detail, ToolStart)]
    assert [(e.agent, e.depth) for e in tools] == [("helper", 3), ("helper", 3)]
    texts = {e.execution_id: e for e in events if isinstance(e.detail, ModelText) and e.depth == 2}
    assert len(texts) == 2  # each worker's answer streamed from its host


def digging(rt: Runtime) -> int:
    """How many workers have started their tool (as their hosts last reported)."""
    return sum(n.usage.tool_calls for n in rt.tree().nodes if n.name == "worker")


async def test_a_subtree_of_a_lost_host_is_placed_again_if_its_restart_policy_allows() -> None:
    # In this process, so that the test can make the digs quick once the host died.
    tasks = [f"slow {i}" for i in range(4)]
    hosts = LocalHosts(2)
    worker = digger(restart=RestartPolicy(max_restarts=1))
    try:
        async with Runtime(hosts=hosts, budget=Budget(tokens=100_000)) as rt:
            ref = await rt.spawn(lead(worker, tasks))
            async with rt.events() as subscription:
                async with anyio.create_task_group() as tg:
                    results = []

                    async def ask() -> None:
                        results.append(await ref.ask("go"))

                    tg.start_soon(ask)
                    await until(lambda: digging(rt) == 4)
                    SLOW["digs"] = False  # what runs again is quick
                    hosts.kill("default-0")
                restarts = []
                while (event := subscription.receive_nowait()) is not None:
                    if event.kind == "restart":
                        restarts.append(event)
            tree = rt.tree()
            held = rt.supervisor.root.held
    finally:
        SLOW["digs"] = True
    # The two workers of the lost host ran again on the other one, and answered.
    assert results[0].status == "completed", results[0].stop_reason
    workers = [n for n in tree.nodes if n.name == "worker"]
    assert [n.status for n in workers] == ["completed"] * 4
    assert sorted(n.host for n in workers) == ["default-1"] * 4
    # A worker placed again has no children: all of its usage is its own, the part
    # the lost run reported (its tool call) included.
    assert all(n.usage == n.own_usage for n in workers)
    assert sorted(n.usage.tool_calls for n in workers) == [1, 1, 2, 2]
    assert len(restarts) == 2
    assert all("host 'default-0' lost" in e.detail["reason"] for e in restarts)
    assert {e.detail["host"] for e in restarts} == {"default-1"}
    # The host is known dead and its workers were in a tool, no request in flight:
    # what their lost leases held came back, all of it.
    assert held is not None
    assert held.lost is not None
    assert held.tokens == held.lost.tokens == 0


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: LocalHosts(0), r"pool 'default' needs a whole number of hosts >= 1, got 0"),
        (lambda: LocalHosts(2, placement="random"), r"placement must be one of"),  # type: ignore[arg-type]
        (lambda: LocalHosts(pools={"": 1}), r"a pool's name must be a non-empty string"),
        (lambda: Runtime(hosts=object()), r"hosts must implement fractor.Hosts"),  # type: ignore[arg-type]
        (lambda: researcher("w", host=""), r"host must name a pool of hosts, got ''"),
    ],
)
def test_bad_hosts_are_refused_at_once_with_what_to_do(make: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        make()


def test_bad_ray_pools_are_refused_at_once(ray_instance: None) -> None:
    from fractor.actors.integrations.ray import HostPool, RayHosts

    with pytest.raises(ValueError, match=r"HostPool.count must be a whole number >= 1, got 0"):
        HostPool(count=0)
    with pytest.raises(ValueError, match=r"HostPool.num_gpus must be a finite number >= 0"):
        HostPool(num_gpus=-1)
    with pytest.raises(TypeError, match=r"pool 'gpu' must be a HostPool, got int"):
        RayHosts(pools={"gpu": 1})  # type: ignore[dict-item]


def test_a_tool_with_a_limiter_is_not_shipped_to_another_host() -> None:
    import pickle

    async def measure(site: str) -> str:
        return site

    limited = tool(measure, name="limited", limiter=anyio.CapacityLimiter(2))
    with pytest.raises(TypeError, match=r"tool 'limited' has a limiter, which bounds calls in one"):
        pickle.dumps(limited)


def test_an_agent_ships_whole_and_is_rebuilt_on_arrival() -> None:
    import pickle

    agent = nested_worker()
    again = pickle.loads(pickle.dumps(agent))
    assert again.name == agent.name
    assert [s.name for s in again.specs] == [s.name for s in agent.specs]
    assert again.subagents_by_name["helper"].toolbox.direct.keys() == {"lookup"}


async def test_a_subtree_its_host_cannot_run_still_answers_failed() -> None:
    # Driven by hand, as a transport would: two subtrees with one node id on one host.
    from fractor.actors._hosts._host import AgentHost, HostConfig
    from fractor.actors._hosts._remote import Done, Start, decode_up, encode

    host = AgentHost(HostConfig(name="h"))
    start = Start(
        run=1,
        text="t",
        node_id="w#1.x",
        name="worker",
        depth=2,
        parent_id="lead",
        limits=Budget(),
        pool=1,
        pool_limits=Budget(),
    )
    async with anyio.create_task_group() as tg:
        tg.start_soon(host.serve)
        await host.ready()
        host.start(encode([start, msgspec.structs.replace(start, run=2)]), digger())
        answers: dict[int, Done] = {}
        while len(answers) < 2:
            for message in decode_up(await host.drain(timeout=5)):
                if isinstance(message, Done):
                    answers[message.run] = message
        tg.cancel_scope.cancel()
    statuses = sorted(answer.result.status for answer in answers.values())
    assert statuses == ["completed", "failed"]
    failed = next(a for a in answers.values() if a.result.status == "failed")
    assert failed.result.stop_reason.startswith("the host 'h' could not run it: ")


async def test_a_remote_subtree_is_linked_to_the_attempt_that_delegated_it(
    make_hosts: MakeHosts,
) -> None:
    """The lead's first attempt delegates to a worker on a host, then fails; its
    second attempt answers. The worker's stored trace hangs from the first attempt."""
    worker = Agent("worker", ScriptedModel([reply("worked")]))
    model = ScriptedModel([call("worker", task="w"), fail(RuntimeError("lead down")), reply("ok")])
    lead_agent = Agent("lead", model, subagents=[worker], restart=RestartPolicy(max_restarts=1))
    store = MemoryStore()
    async with Runtime(hosts=make_hosts(1), store=store) as rt:
        result = await (await rt.spawn(lead_agent)).ask("go")
        remote = [n for n in rt.tree().nodes if n.name == "worker"]
    assert result.ok, result.stop_reason
    assert [n.host for n in remote] == ["default-0"]
    stored = {record.id: record for record in await store.records()}
    first = f"{result.execution_id}~1"
    assert stored[first].parent_id == result.execution_id
    assert stored[remote[0].id].parent_id == first


@pytest.mark.parametrize(
    ("approved", "reason", "answer"),
    [(True, "", "notes on tides"), (False, "not today", "a person denied this call: not today")],
)
async def test_a_remote_subtree_asks_the_driver_for_approval(
    make_hosts: MakeHosts, approved: bool, reason: str, answer: str
) -> None:
    """The worker runs on a host; its call waits for a person, who answers through
    the top-level agent's ref on the driver; the decision goes down to the host."""
    with anyio.fail_after(30):
        async with Runtime(hosts=make_hosts(1)) as rt:
            ref = await rt.spawn(lead(guarded(), ["tides"]))
            async with asking(ref) as results:
                (request,) = ref.approvals()
                if approved:
                    ref.approve(request.id)
                else:
                    ref.deny(request.id, reason)
            remote = [n for n in rt.tree().nodes if n.name == "worker"]
            (trace,) = await ref.trace()
            assert ref.approvals() == ()
    assert request.id.startswith("default-0/approval-")
    assert request.path == ("lead", "worker")
    assert request.depth == 2
    assert request.call.name == "lookup"
    assert [n.host for n in remote] == ["default-0"]
    assert results[0].ok
    assert answer in trace.steps[0].outcomes[0].content


async def test_a_remote_wait_for_approval_ends_with_the_deadline(make_hosts: MakeHosts) -> None:
    with anyio.fail_after(30):
        async with Runtime(hosts=make_hosts(1)) as rt:
            ref = await rt.spawn(lead(guarded(), ["tides"]))
            async with asking(ref, budget=Budget(seconds=1.0)) as results:
                pass
            # Withdrawn on the driver once the host's wait ended.
            await until(lambda: not ref.approvals())
    assert results[0].status == "timed_out"


async def test_a_lost_hosts_approval_requests_are_withdrawn() -> None:
    """The worker waits for approval on a host that dies; placed again on the other
    host (its restart policy), it asks again: only the new request is listed."""
    hosts = LocalHosts(2)
    worker = guarded(restart=RestartPolicy(max_restarts=1))
    with anyio.fail_after(30):
        async with Runtime(hosts=hosts) as rt:
            ref = await rt.spawn(lead(worker, ["tides"]))
            async with asking(ref) as results:
                (first,) = ref.approvals()
                dead = first.id.split("/")[0]
                hosts.kill(dead)
                await until(lambda: [r.id for r in ref.approvals()] not in ([], [first.id]))
                (second,) = ref.approvals()
                ref.approve(second.id)
            with pytest.raises(ApprovalError):
                ref.approve(first.id)
    assert not second.id.startswith(f"{dead}/")
    assert results[0].ok
