"""A cap on a tool's calls in flight across the whole runtime (issue 29):
``Runtime(tool_limits={"browse": 8})``, whatever agent makes the calls.

Each agent's model asks for many calls of one tool in one turn (its own
``tool_concurrency`` would run them all at once); the tool counts how many of its
calls run at the same moment.
"""

from __future__ import annotations

import anyio
import pytest

from fractor.actors import Agent, RateWait, ScriptedModel, call, calls, reply, tool
from fractor.runtime import Budget, Runtime

AGENTS = 50
CALLS = 20
CAP = 8


class Gauge:
    """How many calls run now, and the most that ever ran at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.calls = 0

    async def browse(self, url: str) -> str:
        """Open a page."""
        self.now += 1
        self.calls += 1
        self.peak = max(self.peak, self.now)
        await anyio.sleep(0.001)
        self.now -= 1
        return f"page {url}"


def browsing_agent(name: str, gauge: Gauge, *, budget: Budget | None = None) -> Agent:
    script = [
        calls(*(call("browse", url=f"{name}/{i}") for i in range(CALLS))),
        reply("read them all"),
    ]
    return Agent(
        name,
        ScriptedModel(script),
        tools=[tool(gauge.browse, name="browse")],
        tool_concurrency=CALLS,
        budget=budget,
    )


async def test_a_thousand_calls_from_fifty_agents_never_pass_the_runtime_cap() -> None:
    gauge = Gauge()
    async with Runtime(tool_limits={"browse": CAP}) as rt:
        refs = [await rt.spawn(browsing_agent(f"a{i}", gauge)) for i in range(AGENTS)]
        results: list[str] = []

        async def ask(index: int) -> None:
            result = await refs[index].ask("Read.")
            results.append(result.status)

        with anyio.fail_after(60):
            async with anyio.create_task_group() as tg:
                for index in range(AGENTS):
                    tg.start_soon(ask, index)
        lane = rt.statistics().lanes["tool:browse"]
    assert results == ["completed"] * AGENTS
    assert gauge.calls == AGENTS * CALLS  # waits, never drops
    assert gauge.peak == CAP  # the cap held, and was used
    assert (lane.concurrency, lane.in_flight, lane.waiting) == (CAP, 0, 0)
    assert lane.waits > 0


async def test_without_a_cap_the_same_calls_run_as_the_agents_allow() -> None:
    gauge = Gauge()
    async with Runtime() as rt:
        refs = [await rt.spawn(browsing_agent(f"a{i}", gauge)) for i in range(5)]
        async with anyio.create_task_group() as tg:
            for ref in refs:
                tg.start_soon(ref.ask, "Read.")
        assert "tool:browse" not in rt.statistics().lanes
    assert gauge.peak > CAP


async def test_a_call_waiting_for_a_slot_is_seen_and_charges_nothing_until_it_runs() -> None:
    gauge = Gauge()
    seen: list[RateWait] = []
    budget = Budget(tool_calls=CALLS)
    async with Runtime(tool_limits={"browse": 1}) as rt:
        ref = await rt.spawn(browsing_agent("a", gauge, budget=budget))
        async with rt.events() as events, anyio.create_task_group() as tg:

            async def watch() -> None:
                async for event in events:  # (until cancelled: no comprehension)
                    if isinstance(event.detail, RateWait):
                        seen.append(event.detail)  # noqa: PERF401

            tg.start_soon(watch)
            result = await ref.ask("Read.")
            tg.cancel_scope.cancel()
    assert result.status == "completed", result.stop_reason
    assert result.usage.tool_calls == CALLS
    assert gauge.peak == 1
    assert seen
    assert {wait.lane for wait in seen} == {"tool:browse"}
    assert all("tool:browse" in wait.reason for wait in seen)


@pytest.mark.parametrize("limits", [{"browse": 0}, {"browse": True}, {"": 3}])
def test_a_tool_limit_is_validated(limits: dict[str, int]) -> None:
    with pytest.raises(ValueError, match="tool"):
        Runtime(tool_limits=limits)


class Held:
    """A tool whose calls stay in flight until ``release``: how many run at once."""

    def __init__(self) -> None:
        self.now = 0
        self.peak = 0
        self.released = anyio.Event()

    async def browse(self, url: str) -> str:
        """Open a page."""
        self.now += 1
        self.peak = max(self.peak, self.now)
        try:
            await self.released.wait()
        finally:
            self.now -= 1
        return f"page {url}"


async def test_the_usual_one_call_step_keeps_the_cap_with_nobody_observing() -> None:
    # Issue 40 item 1: a step of one call of an async tool is awaited by the step
    # itself when nobody observes the tree; a capped tool's calls must still wait
    # for the runtime's slots there.
    held = Held()
    browse = tool(held.browse, name="browse")
    assert browse.direct
    agents = 10

    def agent(name: str) -> Agent:
        script = [call("browse", url=name), reply("read")]
        return Agent(name, ScriptedModel(script), tools=[browse])

    async with Runtime(tool_limits={"browse": 3}) as rt:
        refs = [await rt.spawn(agent(f"a{i}")) for i in range(agents)]
        results: list[str] = []

        async def ask(index: int) -> None:
            result = await refs[index].ask("Read.")
            results.append(result.status)

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                for index in range(agents):
                    tg.start_soon(ask, index)
                await anyio.wait_all_tasks_blocked()
                in_flight = held.now
                held.released.set()
        lane = rt.statistics().lanes.get("tool:browse")
    assert in_flight == 3  # the others wait in the tool's lane
    assert held.peak == 3
    assert lane is not None
    assert lane.waits == agents - 3
    assert results == ["completed"] * agents
