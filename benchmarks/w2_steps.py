"""W2 sequential steps: one execution of S steps (one zero-latency call each).

Per-step overhead at most 3 x the raw loop, and flat: S = 1000 costs per step at most
1.2 x what S = 50 costs (no work that grows with history per step).
"""

from __future__ import annotations

import msgspec

from actors import Agent, Message, tool
from runtime import Runtime

from ._common import CycleModel, raw_execution, step_turns
from ._harness import Row, compare, judged

__all__ = ["run"]


async def _echo(x: int) -> int:
    return x


echo = tool(_echo, name="echo")


async def _steps(steps: int, executions: int, repeats: int) -> Row:
    turns = step_turns("echo", steps)
    async with Runtime() as rt:

        async def fractor() -> None:
            for _ in range(executions):
                # A fresh agent per execution: the figure is the steps, not a long chat.
                ref = await rt.spawn(Agent("steps", CycleModel(turns), tools=[echo]))
                await ref.ask("go")
                await ref.stop()

        async def baseline() -> None:
            for _ in range(executions):
                conversation: list[Message] = []
                await raw_execution(turns, _echo, conversation)

        return await compare(
            f"W2 steps S={steps} (time per step)",
            fractor=fractor,
            baseline=baseline,
            operations=steps * executions,
            repeats=repeats,
            better="lower",
            min_ratio=1 / 3,
        )


async def run(*, quick: bool = False) -> list[Row]:
    repeats = 3 if quick else 5
    budget = 2_000 if quick else 10_000  # steps per measurement
    rows = [await _steps(s, max(1, budget // s), repeats) for s in (50, 200, 1000)]
    rows = [judged(row, "<= 3 x raw per step", row.ratio >= 1 / 3) for row in rows]
    flat = rows[-1].fractor / rows[0].fractor
    rows.append(
        msgspec.structs.replace(
            rows[-1],
            workload="W2 flatness: per step S=1000 / S=50",
            unit="x",
            fractor=flat,
            baseline=rows[-1].baseline / rows[0].baseline,
            ratio=flat,
            target="<= 1.2",
            holds=flat <= 1.2,
        )
    )
    return rows
