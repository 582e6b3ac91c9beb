"""W1 fan-out: one step with K parallel tool calls, then a final answer.

- K = 1, 10, 100, 1000 zero-latency async tools: tool calls per second; at K = 1000
  fractor must reach at least 0.6 x the raw loop.
- K = 100 async tools sleeping 50 ms: fractor's wall time at most 1.15 x 50 ms.
- K = 100 sync tools sleeping 50 ms (worker threads): at most 1.5 x the raw loop.
"""

from __future__ import annotations

import time

import anyio
import anyio.to_thread

from fractor.actors import Agent, Message, tool
from fractor.runtime import Runtime

from ._common import CycleModel, fanout_turns, raw_execution
from ._harness import Row, compare, judged

__all__ = ["run"]


async def _echo(x: int) -> int:
    return x


async def _sleep_50ms(x: int) -> int:
    await anyio.sleep(0.05)
    return x


def _sleep_50ms_sync(x: int) -> int:
    time.sleep(0.05)
    return x


async def _sleep_50ms_in_thread(x: int) -> int:
    return await anyio.to_thread.run_sync(_sleep_50ms_sync, x)


echo = tool(_echo, name="echo")
sleepy = tool(_sleep_50ms, name="sleepy")
sleepy_sync = tool(_sleep_50ms_sync, name="sleepy_sync")


async def _pair(
    name: str, agent: Agent, raw_tool: object, k: int, executions: int, repeats: int
) -> Row:
    turns = fanout_turns(agent.tools[0].name, k)  # type: ignore[union-attr]
    async with Runtime() as rt:
        ref = await rt.spawn(agent)

        async def fractor() -> None:
            for _ in range(executions):
                await ref.ask("go")

        conversation: list[Message] = []

        async def baseline() -> None:
            for _ in range(executions):
                await raw_execution(turns, raw_tool, conversation)  # type: ignore[arg-type]

        return await compare(
            name,
            fractor=fractor,
            baseline=baseline,
            operations=k * executions,
            repeats=repeats,
            min_ratio=0.0,
        )


async def run(*, quick: bool = False) -> list[Row]:
    rows: list[Row] = []
    total = 2_000 if quick else 10_000
    repeats = 3 if quick else 5
    for k in (1, 10, 100, 1000):
        agent = Agent("fanout", CycleModel(fanout_turns("echo", k)), tools=[echo])
        row = await _pair(
            f"W1 fan-out K={k} (tool calls/s)", agent, _echo, k, max(1, total // k), repeats
        )
        if k == 1000:
            rows.append(judged(row, ">= 0.6 x raw", row.ratio >= 0.6))
        else:
            rows.append(judged(row, "reported", True))
    latency = Agent("fanout", CycleModel(fanout_turns("sleepy", 100)), tools=[sleepy])
    row = await _pair("W1 K=100 async tools 50 ms (wall)", latency, _sleep_50ms, 100, 1, 3)
    wall = 100 / row.fractor  # seconds for the one execution
    rows.append(
        judged(
            _as_wall(row),
            "<= 1.15 x 50 ms",
            wall <= 1.15 * 0.05,
        )
    )
    threads = Agent("fanout", CycleModel(fanout_turns("sleepy_sync", 100)), tools=[sleepy_sync])
    row = await _pair("W1 K=100 sync tools 50 ms (wall)", threads, _sleep_50ms_in_thread, 100, 1, 3)
    rows.append(judged(_as_wall(row), ">= 1/1.5 x raw", row.ratio >= 1 / 1.5))
    return rows


def _as_wall(row: Row) -> Row:
    """Turn a calls/s row of one 100-call execution into seconds of wall time."""
    import msgspec

    return msgspec.structs.replace(
        row,
        unit="s",
        fractor=100 / row.fractor,
        baseline=100 / row.baseline,
        fractor_min=100 / row.fractor_max,
        fractor_max=100 / row.fractor_min,
        baseline_min=100 / row.baseline_max,
        baseline_max=100 / row.baseline_min,
    )
