"""One set of rate limits for a runtime and its hosts (issue 29): a host's requests of
a declared lane wait in the driver's, so two hosts do not each send the full rate.

A lead hands its workers to hosts; each worker's requests (and tool calls) count in
the driver's lanes. On ``LocalHosts`` the workers' model and tool are objects of
this process, so the test sees every request and call as it happens; on Ray it
reads what the driver's lanes saw.
"""

from __future__ import annotations

import anyio

from fractor.actors import Agent, FunctionModel, LocalHosts, ModelRequest, call, calls, reply, tool
from fractor.actors._models._protocol import Turn
from fractor.runtime import RateLimit, Runtime

from .conftest import MakeHosts
from .trees import _asked

WORKERS = 12
#: A scaled-down minute, and what it admits.
PERIOD = 0.25
PER_PERIOD = 6


class Seen:
    """When each worker request came, and how many tool calls ran at once."""

    def __init__(self) -> None:
        self.requests: list[float] = []
        self.now = 0
        self.peak = 0
        self.calls = 0

    async def working(self, request: ModelRequest) -> Turn:
        self.requests.append(anyio.current_time())
        if _asked(request) == 0:
            return calls(*(call("browse", url=f"page {i}") for i in range(4)))
        return reply("read")

    async def browse(self, url: str) -> str:
        """Open a page."""
        self.calls += 1
        self.now += 1
        self.peak = max(self.peak, self.now)
        await anyio.sleep(0.002)
        self.now -= 1
        return url


def _tree(seen: Seen | None = None) -> Agent:
    seen = seen or Seen()
    worker = Agent(
        "worker",
        FunctionModel(seen.working, name="worker-model"),
        tools=[tool(seen.browse, name="browse")],
        tool_concurrency=4,
    )
    script = [calls(*(call("worker", task=f"t{i}") for i in range(WORKERS))), reply("done")]
    from fractor.actors import ScriptedModel

    return Agent("lead", ScriptedModel(script, name="lead-model"), subagents=[worker])


async def test_requests_on_two_hosts_share_the_drivers_rate_limit() -> None:
    seen = Seen()
    limits = {"worker-model": RateLimit(requests_per_minute=PER_PERIOD, period=PERIOD)}
    async with Runtime(hosts=LocalHosts(2), rate_limits=limits) as rt:
        with anyio.fail_after(30):
            result = await (await rt.spawn(_tree(seen))).ask("go")
        lane = rt.statistics().lanes["worker-model"]
        placed = {node.host for node in rt.tree().nodes if node.name == "worker"}
    assert result.status == "completed", result.stop_reason
    assert placed == {"default-0", "default-1"}
    arrived = sorted(seen.requests)
    assert len(arrived) == 2 * WORKERS
    for at in arrived:  # the hosts together never pass the limit in any window
        assert sum(1 for other in arrived if at <= other < at + PERIOD) <= PER_PERIOD
    assert lane.waits > 0
    assert (lane.in_flight, lane.waiting) == (0, 0)


async def test_a_tool_cap_holds_across_hosts() -> None:
    seen = Seen()
    async with Runtime(hosts=LocalHosts(2), tool_limits={"browse": 3}) as rt:
        with anyio.fail_after(30):
            result = await (await rt.spawn(_tree(seen))).ask("go")
        lane = rt.statistics().lanes["tool:browse"]
    assert result.status == "completed", result.stop_reason
    assert seen.peak == 3  # 12 workers x 4 calls at once, on two hosts: 3 at a time
    assert lane.waits > 0


async def test_a_tool_cap_holds_across_hosts_for_one_call_steps() -> None:
    # Issue 40 item 1: each worker's step is one call, which the step awaits itself
    # when nobody observes the tree; the cap holds there too, on either host.
    seen = Seen()

    async def working(request: ModelRequest) -> Turn:
        asked = _asked(request)
        return call("browse", url=f"page {asked}") if asked < 3 else reply("read")

    worker = Agent(
        "worker",
        FunctionModel(working, name="worker-model"),
        tools=[tool(seen.browse, name="browse")],
    )
    from fractor.actors import ScriptedModel

    script = [calls(*(call("worker", task=f"t{i}") for i in range(WORKERS))), reply("done")]
    lead = Agent("lead", ScriptedModel(script), subagents=[worker], tool_concurrency=WORKERS)
    async with Runtime(hosts=LocalHosts(2), tool_limits={"browse": 3}) as rt:
        with anyio.fail_after(30):
            result = await (await rt.spawn(lead)).ask("go")
        lane = rt.statistics().lanes["tool:browse"]
    assert result.status == "completed", result.stop_reason
    assert seen.calls == 3 * WORKERS
    assert seen.peak <= 3
    assert lane.waits > 0


async def test_a_thousand_calls_from_fifty_agents_on_two_hosts_keep_the_runtime_cap() -> None:
    # The case: 1,000 calls of a capped tool from 50 agents, on LocalHosts.
    seen = Seen()

    async def working(request: ModelRequest) -> Turn:
        if _asked(request) == 0:
            return calls(*(call("browse", url=f"page {i}") for i in range(20)))
        return reply("read")

    worker = Agent(
        "worker",
        FunctionModel(working, name="worker-model"),
        tools=[tool(seen.browse, name="browse")],
        tool_concurrency=20,
    )
    from fractor.actors import ScriptedModel

    script = [calls(*(call("worker", task=f"t{i}") for i in range(50))), reply("done")]
    lead = Agent("lead", ScriptedModel(script), subagents=[worker], tool_concurrency=50)
    async with Runtime(hosts=LocalHosts(2), tool_limits={"browse": 8}) as rt:
        with anyio.fail_after(60):
            result = await (await rt.spawn(lead)).ask("go")
        lane = rt.statistics().lanes["tool:browse"]
    assert result.status == "completed", result.stop_reason
    assert seen.calls == 1_000  # waits, never drops
    assert seen.peak == 8
    assert (lane.in_flight, lane.waiting) == (0, 0)


async def test_a_pause_one_host_heard_holds_every_host(make_hosts: MakeHosts) -> None:
    # The driver's lane pauses: the hosts' requests wait there, whoever got the 429.
    # The pause begins once the hosts are up (a first tree started them: on Ray that
    # may take longer than any pause a test would sit through), and lasts 2 s, which
    # the workers' first requests reach on any machine.
    async with Runtime(hosts=make_hosts(2), rate_limits={"worker-model": RateLimit()}) as rt:
        with anyio.fail_after(60):
            first = await (await rt.spawn(_tree())).ask("go")
        before = rt.statistics().lanes["worker-model"]
        lane = rt.supervisor.rates.lane("worker-model")
        rt.supervisor.rates.pause(lane, 2.0)
        with anyio.fail_after(60):
            result = await (await rt.spawn(_tree())).ask("go")
        statistics = rt.statistics().lanes["worker-model"]
    assert first.status == result.status == "completed", result.stop_reason
    assert statistics.pauses == before.pauses + 1
    # Every worker's first request waited on the driver for the pause.
    assert statistics.waits - before.waits >= WORKERS
    assert statistics.wait_seconds > before.wait_seconds
