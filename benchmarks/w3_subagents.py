"""W3 subagents: 50 children in parallel, each one tool call; and a tree of depth 3.

fractor spawns each child as an actor with its own execution; the raw loop runs each
child's execution as a task. Target for the 50 children: at most 4 x the raw loop.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio

from fractor.actors import Agent, Message, ModelResponse, ToolCall, tool
from fractor.runtime import Runtime

from ._common import _USAGE, CycleModel, fanout_turns, raw_execution
from ._harness import Row, compare, judged

__all__ = ["run"]


async def _echo(x: int) -> int:
    return x


echo = tool(_echo, name="echo")


def _delegating(child: str, k: int) -> list[ModelResponse]:
    calls = tuple(
        ToolCall(id=f"call_0_{i}", name=child, arguments=f'{{"task": "part {i}"}}')
        for i in range(k)
    )
    return [
        ModelResponse(tool_calls=calls, usage=_USAGE, finish_reason="tool_calls"),
        ModelResponse(text="merged", usage=_USAGE),
    ]


def _tree(depth: int, fanout: int) -> Agent:
    """A lead whose every agent delegates to ``fanout`` children, ``depth`` levels."""
    agent = Agent("leaf", CycleModel(fanout_turns("echo", 1)), tools=[echo])
    for level in range(depth - 1, 0, -1):
        agent = Agent(
            f"level{level}", CycleModel(_delegating(agent.name, fanout)), subagents=[agent]
        )
    return agent


async def _raw_tree(depth: int, fanout: int, conversation: list[Message]) -> None:
    """The raw loop's version of ``_tree``: each child is a task running its execution."""
    leaf_turns: Sequence[ModelResponse] = fanout_turns("echo", 1)
    if depth == 1:
        await raw_execution(leaf_turns, _echo, [])
        return

    async def child(x: int) -> str:
        await _raw_tree(depth - 1, fanout, [])
        return "child answer"

    await raw_execution(_delegating("child", fanout), child, conversation)


async def _pair(name: str, depth: int, fanout: int, repeats: int, target: float | None) -> Row:
    async with Runtime() as rt:
        lead = await rt.spawn(_tree(depth, fanout))

        async def fractor() -> None:
            await lead.ask("go")

        conversation: list[Message] = []

        async def baseline() -> None:
            await _raw_tree(depth, fanout, conversation)

        row = await compare(
            name,
            fractor=fractor,
            baseline=baseline,
            operations=1,
            repeats=repeats,
            better="lower",
            min_ratio=0,
        )
    if target is None:
        return judged(row, "reported", True)
    return judged(row, f"<= {target:g} x raw", row.ratio >= 1 / target)


async def run(*, quick: bool = False) -> list[Row]:
    repeats = 5 if quick else 15
    with anyio.fail_after(120):
        return [
            await _pair("W3 50 children in parallel (wall)", 2, 50, repeats, 4),
            await _pair("W3 tree depth 3, fan-out 8 (wall)", 3, 8, repeats, None),
        ]
