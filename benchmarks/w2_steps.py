"""W2 sequential steps: one execution of S steps (one zero-latency call each).

Per-step overhead at most 3 x the raw loop, and flat: S = 1000 costs per step at most
1.2 x what S = 50 costs (no work that grows with history per step).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec

from fractor.actors import Agent, Message, tool
from fractor.runtime import Runtime

from ._common import CycleModel, raw_execution, step_turns
from ._harness import Row, compare, judged

__all__ = ["run"]


async def _echo(x: int) -> int:
    return x


echo = tool(_echo, name="echo")


Runner = Callable[[], Awaitable[None]]


def _fractor(rt: Runtime, steps: int, executions: int) -> Runner:
    turns = step_turns("echo", steps)

    async def run() -> None:
        for _ in range(executions):
            # A fresh agent per execution: the figure is the steps, not a long chat.
            ref = await rt.spawn(Agent("steps", CycleModel(turns), tools=[echo]))
            result = await ref.ask("go")
            if result.steps != steps + 1:  # S tool steps and the answer; a stop: less
                raise RuntimeError(
                    f"W2 ran {result.steps} of {steps + 1} steps: {result.stop_reason}"
                )
            await ref.stop()

    return run


def _raw(steps: int, executions: int) -> Runner:
    turns = step_turns("echo", steps)

    async def run() -> None:
        for _ in range(executions):
            conversation: list[Message] = []
            await raw_execution(turns, _echo, conversation)

    return run


async def _steps(steps: int, executions: int, repeats: int) -> Row:
    # Up to 1,000 steps per execution: past the default cap of 200, removed here.
    async with Runtime(caps=None) as rt:
        return await compare(
            f"W2 steps S={steps} (time per step)",
            fractor=_fractor(rt, steps, executions),
            baseline=_raw(steps, executions),
            operations=steps * executions,
            repeats=repeats,
            better="lower",
            min_ratio=1 / 3,
        )


async def _flatness(budget: int, repeats: int) -> Row:
    """Per step at S = 1000 over per step at S = 50, both runs interleaved (like every
    comparison here), so a machine whose speed drifts does not decide the verdict.
    The baseline column is the raw loop's own figure, measured the same way."""
    long, short = 1000, 50
    async with Runtime(caps=None) as rt:
        ours = await compare(
            "ours",
            fractor=_fractor(rt, long, max(1, budget // long)),
            baseline=_fractor(rt, short, budget // short),
            operations=budget,
            repeats=repeats,
            better="lower",
            min_ratio=0,
        )
    raw = await compare(
        "raw",
        fractor=_raw(long, max(1, budget // long)),
        baseline=_raw(short, budget // short),
        operations=budget,
        repeats=repeats,
        better="lower",
        min_ratio=0,
    )
    flat = 1 / ours.ratio
    return msgspec.structs.replace(
        ours,
        workload=f"W2 flatness: per step S={long} / S={short}",
        unit="x",
        fractor=flat,
        baseline=1 / raw.ratio,
        fractor_min=ours.fractor_min / ours.baseline_max,
        fractor_max=ours.fractor_max / ours.baseline_min,
        baseline_min=raw.fractor_min / raw.baseline_max,
        baseline_max=raw.fractor_max / raw.baseline_min,
        ratio=flat,
        target="<= 1.2",
        holds=flat <= 1.2,
    )


async def run(*, quick: bool = False) -> list[Row]:
    repeats = 3 if quick else 5
    budget = 2_000 if quick else 10_000  # steps per measurement
    rows = [await _steps(s, max(1, budget // s), repeats) for s in (50, 200, 1000)]
    rows = [judged(row, "<= 3 x raw per step", row.ratio >= 1 / 3) for row in rows]
    rows.append(await _flatness(budget, repeats))
    return rows
