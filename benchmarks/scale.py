"""Scale: memory of idle agents, cancelling a large tree, a shared budget's overshoot.

- RSS of 10,000 live idle agents: under 100 MiB more than before they were spawned
  (the raw figure: 10,000 tasks each waiting on its own memory object stream).
- A tree of 1,000 agents, every one blocked in a tool, cancelled within 2 x the raw
  figure: 1,000 blocked tasks in a task group, cancelled. Beside it, the floor that
  any design with cancel scopes of its own pays: the same 1,000 tasks, each blocked
  inside two nested cancel scopes (anyio's scope per task comes on top, on both
  sides).
- 1,000 concurrent children sharing a budget of 100 tool calls: zero overshoot.
"""

from __future__ import annotations

import gc
import os
import time

import anyio
import msgspec
from anyio.streams.memory import MemoryObjectReceiveStream

from fractor.actors import Agent, ModelResponse, ToolCall, tool
from fractor.runtime import Budget, Runtime

from ._common import _USAGE, CycleModel, fanout_turns
from ._harness import Row, judged, single, summarize

__all__ = ["run"]

_PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib() -> float:
    """Resident memory of this process now, in MiB (Linux /proc)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * _PAGE / 2**20


def _row(workload: str, unit: str, ours: float, raw: float, target: str, holds: bool) -> Row:
    ratio = raw / ours if ours else 1.0
    return single(workload, unit, ours, raw, ratio=ratio, target=target, holds=holds)


async def _idle_memory(count: int) -> Row:
    agent = Agent("idle", CycleModel(fanout_turns("echo", 1)))
    gc.collect()
    before = rss_mib()
    async with Runtime() as rt:
        refs = [await rt.spawn(agent) for _ in range(count)]
        gc.collect()
        ours = rss_mib() - before
        assert rt.statistics().live_actors == len(refs)
    del refs
    gc.collect()
    before = rss_mib()

    async def raw_actor(receive: MemoryObjectReceiveStream[object]) -> None:
        async with receive:
            async for _ in receive:
                pass

    async with anyio.create_task_group() as tg:
        senders = []
        for _ in range(count):
            send, receive = anyio.create_memory_object_stream[object](16)
            senders.append(send)
            tg.start_soon(raw_actor, receive)
        await anyio.wait_all_tasks_blocked()
        gc.collect()
        raw = rss_mib() - before
        for send in senders:
            send.close()
    limit = 100 * count / 10_000
    return _row(
        f"Scale: RSS of {count:,} idle agents", "MiB", ours, raw, f"< {limit:g} MiB", ours < limit
    )


def _blocking_tree(children: int, all_in: anyio.Event) -> Agent:
    entered = 0

    @tool
    async def block(x: int) -> str:
        """Blocks until cancelled."""
        nonlocal entered
        entered += 1
        if entered == children:
            all_in.set()
        await anyio.sleep_forever()
        return "never"  # pragma: no cover

    child = Agent("child", CycleModel(fanout_turns("block", 1)), tools=[block])
    calls = tuple(
        ToolCall(id=f"call_0_{i}", name="child", arguments='{"task": "wait"}')
        for i in range(children)
    )
    lead_turns = [
        ModelResponse(tool_calls=calls, usage=_USAGE, finish_reason="tool_calls"),
        ModelResponse(text="unreached", usage=_USAGE),
    ]
    return Agent("lead", CycleModel(lead_turns), subagents=[child], tool_concurrency=children)


async def _cancel_once(children: int) -> float:
    """Seconds from cancelling a blocked tree's lead until its ask has answered."""
    all_in = anyio.Event()
    async with Runtime() as rt:
        ref = await rt.spawn(_blocking_tree(children, all_in))
        results = []
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                results.append(await ref.ask("block"))

            tg.start_soon(ask)
            with anyio.fail_after(60):
                await all_in.wait()
            lead = next(n for n in rt.tree().nodes if n.name == "lead")
            gc.collect()  # a full collection now, not one billed to the cancellation
            began = time.perf_counter()
            rt.supervisor.cancel(lead.id)
        ours = time.perf_counter() - began  # the ask has answered: the tree is down
        assert results[0].status == "cancelled"
        assert rt.statistics().live_actors == 1  # only the lead: every child has ended
    return ours


async def _raw_cancel_once(children: int) -> float:
    """Seconds to cancel ``children`` bare blocked tasks in a task group."""
    return await _bare_cancel_once(children, scopes=False)


async def _floor_cancel_once(children: int) -> float:
    """The raw figure with each task blocked inside two nested cancel scopes."""
    return await _bare_cancel_once(children, scopes=True)


async def _bare_cancel_once(children: int, *, scopes: bool) -> float:
    async def blocked() -> None:
        await anyio.sleep_forever()

    async def scoped() -> None:
        with anyio.CancelScope(), anyio.CancelScope():
            await anyio.sleep_forever()

    async with anyio.create_task_group() as tg:
        for _ in range(children):
            tg.start_soon(scoped if scopes else blocked)
        await anyio.wait_all_tasks_blocked()
        gc.collect()
        began = time.perf_counter()
        tg.cancel_scope.cancel()
    return time.perf_counter() - began


async def _cancel_tree(children: int, repeats: int) -> list[Row]:
    """The median of ``repeats`` runs after a warm-up, each side built afresh; the
    floor is measured in the same rounds, against the same raw runs."""
    await _cancel_once(children)
    await _raw_cancel_once(children)
    await _floor_cancel_once(children)
    ours: list[float] = []
    raw: list[float] = []
    floor: list[float] = []
    for _ in range(repeats):
        ours.append(await _cancel_once(children))
        raw.append(await _raw_cancel_once(children))
        floor.append(await _floor_cancel_once(children))
    row = summarize(f"Scale: cancel a tree of {children:,} agents", "s", ours, raw, better="lower")
    floor_row = summarize(
        f"  cancel floor: {children:,} tasks, 2 scopes each", "s", floor, raw, better="lower"
    )
    return [
        judged(row, ">= 0.5 x raw", row.ratio >= 0.5),
        judged(floor_row, "reference, no target", True),
    ]


async def _overshoot(children: int, limit: int) -> Row:
    ran = [0]

    @tool
    async def work(x: int) -> str:
        """Counts the calls that really run."""
        ran[0] += 1
        await anyio.lowlevel.checkpoint()
        return "ok"

    child = Agent("child", CycleModel(fanout_turns("work", 1)), tools=[work])
    calls = tuple(
        ToolCall(id=f"call_0_{i}", name="child", arguments='{"task": "work"}')
        for i in range(children)
    )
    lead = Agent(
        "lead",
        CycleModel(
            [
                ModelResponse(tool_calls=calls, usage=_USAGE, finish_reason="tool_calls"),
                ModelResponse(text="merged", usage=_USAGE),
            ]
        ),
        subagents=[child],
        tool_concurrency=children,
        budget=Budget(tool_calls=limit),
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        with anyio.fail_after(120):
            result = await ref.ask("fan out")
    overshoot = ran[0] - limit
    row = _row(
        f"Scale: overshoot, {children:,} children, budget {limit}",
        "x",
        float(overshoot),
        0.0,
        "== 0",
        overshoot == 0 and result.usage.tool_calls == limit,
    )
    return msgspec.structs.replace(row, ratio=1.0 if overshoot == 0 else 0.0)


async def run(*, quick: bool = False) -> list[Row]:
    return [
        await _idle_memory(1_000 if quick else 10_000),
        *await _cancel_tree(100 if quick else 1_000, 3 if quick else 9),
        await _overshoot(100 if quick else 1_000, 10 if quick else 100),
    ]
