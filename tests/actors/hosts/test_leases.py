"""Leases are honest (issue 28): a subtree on another host spends what it would spend
at home, whatever budget the tree runs under, and asks the driver rarely.

Each scenario runs on ``LocalHosts`` and on a real local Ray instance: a worker whose
long answer outgrows a request's minimum output spends under a budget of 10 x its
demand, or of 1.2 x it (its lead's last request needs room for a minimum output),
exactly what it spends with no budget (the same requests, the same tokens: no reply
cut by what is left of a lease and asked again).
"""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from fractor.actors import (
    Agent,
    FunctionModel,
    LocalHosts,
    ModelRequest,
    Result,
    ScriptedModel,
    call,
    calls,
    reply,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget, Runtime, Usage

from .conftest import MakeHosts
from .trees import lead, writer


async def _ask(agent: Agent, hosts: object | None, budget: Budget | None = None) -> Result:
    async with Runtime(hosts=hosts, budget=budget) as rt:  # type: ignore[arg-type]
        return await (await rt.spawn(agent)).ask("go")


def _spent(usage: Usage) -> tuple[int, int, int, int]:
    return usage.requests, usage.input_tokens, usage.output_tokens, usage.tool_calls


@pytest.mark.parametrize("factor", [10.0, 1.2])
async def test_a_remote_worker_spends_its_demand_under_a_budget(
    make_hosts: MakeHosts, factor: float
) -> None:
    home = await _ask(lead(writer(), ["rivers"]), None)
    assert home.status == "completed", home.stop_reason
    demand = home.usage
    limit = int(demand.total_tokens * factor)
    budget = Budget(tokens=limit)
    # At home, under the budget: the same spend.
    budgeted = await _ask(lead(writer(), ["rivers"], budget), None)
    assert budgeted.status == "completed", budgeted.stop_reason
    assert _spent(budgeted.usage) == _spent(demand)
    # On a host, under the budget on the lead, and on the runtime.
    placed = await _ask(lead(writer(), ["rivers"], budget), make_hosts(1))
    assert placed.status == "completed", placed.stop_reason
    assert _spent(placed.usage) == _spent(demand)
    whole = await _ask(lead(writer(), ["rivers"]), make_hosts(1), budget)
    assert whole.status == "completed", whole.stop_reason
    assert _spent(whole.usage) == _spent(demand)


async def test_statistics_count_the_round_trips_of_leases(make_hosts: MakeHosts) -> None:
    tasks = [f"t{i}" for i in range(4)]
    # One runtime and its hosts for both trees (each start of hosts costs seconds of
    # Ray's): the counts of the second are what grew after the first.
    async with Runtime(hosts=make_hosts(2)) as rt:
        free = await (await rt.spawn(lead(writer(), tasks))).ask("go")
        unbudgeted = rt.statistics()
        assert free.status == "completed", free.stop_reason
        assert (unbudgeted.lease_asks, unbudgeted.lease_refusals) == (0, 0)
        budget = Budget(tokens=free.usage.total_tokens // 2)
        short = await (await rt.spawn(lead(writer(), tasks, budget))).ask("go")
        stats = rt.statistics()
        ledger = rt.supervisor.ledger
        asks, refusals, waits = ledger.asks, ledger.refusals, ledger.waits
    assert short.status == "budget_exceeded"
    # Every ask of a lease answered (granted or refused) is one round trip: the
    # subtrees of the lead on one host share a lease, and ask as one.
    assert stats.lease_asks == asks >= 2
    assert stats.lease_refusals == refusals > 0
    assert stats.lease_waits == waits


def _two_turns(tasks: list[str], budget: Budget) -> Agent:
    """A lead that hands half its tasks to writers, then the other half."""
    half = len(tasks) // 2
    script = [
        calls(*(call("worker", task=t) for t in tasks[:half])),
        calls(*(call("worker", task=t) for t in tasks[half:])),
        reply("All done."),
    ]
    return Agent("lead", ScriptedModel(script), subagents=[writer()], budget=budget)


async def test_subtrees_on_one_host_ask_as_one_lease(make_hosts: MakeHosts) -> None:
    # Eight writers of one lead on one host draw from one lease: its asks grow with
    # the log of what they need together, not with their number (8 or more before).
    tasks = [f"t{i}" for i in range(8)]
    demand = await _ask(lead(writer(), tasks), None)
    budget = Budget(tokens=demand.usage.total_tokens * 10, tool_calls=100, requests=100)
    async with Runtime(hosts=make_hosts(1)) as rt:
        result = await (await rt.spawn(lead(writer(), tasks, budget))).ask("go")
        asks = rt.supervisor.ledger.asks
    assert result.status == "completed", result.stop_reason
    assert _spent(result.usage) == _spent(demand.usage)
    assert 1 <= asks <= 4


async def test_a_lease_idle_between_turns_is_revived_without_a_round_trip() -> None:
    # The lead's second batch finds its lease on the host idle (the first batch
    # ended): it is granted again at once, with the first subtree of the batch.
    tasks = [f"t{i}" for i in range(8)]
    demand = await _ask(_two_turns(tasks, Budget()), None)
    budget = Budget(tokens=demand.usage.total_tokens * 10, tool_calls=100, requests=100)
    async with Runtime(hosts=LocalHosts(1)) as rt:
        await (await rt.spawn(lead(writer(), tasks[:4], budget))).ask("go")
        one_batch = rt.supervisor.ledger.asks
    hosts = LocalHosts(1)
    async with Runtime(hosts=hosts) as rt:
        result = await (await rt.spawn(_two_turns(tasks, budget))).ask("go")
        ledger = rt.supervisor.ledger
        asks, idle = ledger.asks, dict(ledger.idle)
        host = hosts.links[0].host  # type: ignore[attr-defined]
        assert host.runtime is not None
        leases = [n for n in host.runtime.supervisor.nodes.values() if n.name == "lease"]
    assert result.status == "completed", result.stop_reason
    assert _spent(result.usage) == _spent(demand.usage)
    assert asks <= one_batch  # a second batch as large, no more round trips
    # The lead closed: its idle lease ended, and the host closed the lease's node.
    assert idle == {}
    assert leases == []


#: Model calls of ``_slow`` running now, the most that ever ran at once, and the
#: event set once two run together (made by the test, in its event loop).
_running: dict[str, Any] = {"now": 0, "most": 0, "both": None}


async def _slow(request: ModelRequest) -> Turn:
    """A worker's model: answers once another call runs beside it, or after 2 s,
    counting the calls that overlap (hosts in this process share its event loop)."""
    both: anyio.Event = _running["both"]
    _running["now"] += 1
    _running["most"] = max(_running["most"], _running["now"])
    if _running["now"] >= 2:
        both.set()
    try:
        with anyio.move_on_after(2):
            await both.wait()
    finally:
        _running["now"] -= 1
    return reply("done")


async def test_with_whole_sharing_hosts_run_whole_requests_at_once_when_the_budget_holds_them() -> (
    None
):
    # Two workers on two hosts, each request wanting all of the default max_tokens,
    # under a budget that holds three such requests: the first host's lease takes
    # one whole request and its part of the budget, not the whole budget (it held
    # it all before, and the other host's request waited for it to end: measured on
    # 9 workers on 4 hosts, 3.1 x the unbudgeted wall at 2 x the demand, now 1.6 x).
    _running.update(now=0, most=0, both=anyio.Event())
    worker = Agent("worker", FunctionModel(_slow))
    script = [calls(call("worker", task="a"), call("worker", task="b")), reply("All done.")]
    lead = Agent("lead", ScriptedModel(script), subagents=[worker])
    async with Runtime(
        hosts=LocalHosts(2), budget=Budget(tokens=3 * 4_400), output_sharing="whole"
    ) as rt:
        result = await (await rt.spawn(lead)).ask("go")
        placed = {node.host for node in rt.tree().nodes if node.name == "worker"}
    assert result.status == "completed", result.stop_reason
    assert len(placed) == 2
    assert _running["most"] == 2
