"""The whole K = 1 path: spawn an agent, ask it, one tool call, its answer, stop it.

Baseline: the raw loop doing the same by hand: a task started in a task group
(``TaskGroup.start``: running when spawn returns) with a bounded mailbox (a memory
object stream); the task and a reply stream sent; the same scripted turns, decoding
and history (``raw_execution``); the answer sent back; the mailbox closed and the
task's end awaited (as ``ActorRef.stop`` awaits the actor's). fractor:
``Runtime.spawn`` of an ``Agent`` with one tool, ``ask``, ``stop``. Target: at most
1.5 x raw per path.
"""

from __future__ import annotations

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from fractor.actors import Agent, Message, tool
from fractor.runtime import Runtime

from ._common import CycleModel, raw_execution, step_turns
from ._harness import Row, compare, judged

__all__ = ["TARGET", "run"]

#: Whole path at most this many times the raw loop's.
TARGET = 1.5


async def _echo(x: int) -> int:
    return x


echo = tool(_echo, name="echo")

_Mail = tuple[str, MemoryObjectSendStream[str]]


async def _raw_agent(
    inbox: MemoryObjectReceiveStream[_Mail],
    ended: anyio.Event,
    *,
    task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
) -> None:
    """One hand-written agent: its conversation, one execution per message, until its
    mailbox closes; it says when it has started and when it has ended."""
    turns = step_turns("echo", 1)
    conversation: list[Message] = []
    try:
        async with inbox:
            task_status.started()
            async for task, reply in inbox:
                async with reply:
                    await reply.send(await raw_execution(turns, _echo, conversation, task))
    finally:
        ended.set()


async def run(*, quick: bool = False, paths: int | None = None) -> list[Row]:
    if paths is None:
        paths = 500 if quick else 3_000
    repeats = 3 if quick else 5
    turns = step_turns("echo", 1)
    # An agent is a definition, made once and spawned as often as needed; its model
    # cycles through the two turns, one path after the other.
    agent = Agent("k1", CycleModel(turns), tools=[echo])
    async with Runtime() as rt:

        async def fractor() -> None:
            for _ in range(paths):
                ref = await rt.spawn(agent)
                result = await ref.ask("go")
                if result.text != "done":
                    raise RuntimeError(f"the K=1 path answered {result!r}")
                await ref.stop()

        async def baseline() -> None:
            async with anyio.create_task_group() as tg:
                for _ in range(paths):
                    # Spawn: the agent's task started, with its mailbox.
                    mailbox, inbox = anyio.create_memory_object_stream[_Mail](16)
                    ended = anyio.Event()
                    await tg.start(_raw_agent, inbox, ended)
                    # Ask: the task and where to answer it; the answer.
                    answer, answers = anyio.create_memory_object_stream[str](1)
                    async with answers:
                        await mailbox.send(("go", answer))
                        if await answers.receive() != "done":
                            raise RuntimeError("the raw K=1 path answered wrong")
                    # Stop: the mailbox closed, the task ended.
                    await mailbox.aclose()
                    await ended.wait()

        row = await compare(
            "Whole K=1 path: spawn, ask, one tool call, answer (time per path)",
            fractor=fractor,
            baseline=baseline,
            operations=paths,
            repeats=repeats,
            better="lower",
            min_ratio=1 / TARGET,
        )
    return [judged(row, f"<= {TARGET:g} x raw per path", row.ratio >= 1 / TARGET)]
