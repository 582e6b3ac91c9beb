"""The process that ``tests.stress.crash`` kills: agents working on one SQLite file.

``python -m tests.stress.crash_worker DB BACKEND SEED`` (from the repository's root).

It opens ``SQLiteStore(DB)`` and a ``Runtime``, spawns the persistent agent
``lead`` (which resumes its stored conversation), prints ``READY`` and then asks it
numbered tasks, ``task SEED-1``, ``task SEED-2``, ..., forever. Each task is a mix:
plain tool calls (some sleeping a few milliseconds), then several ``worker``
subagents in parallel, each with tool calls of its own and sometimes a nested
``helper`` subagent, then a final answer. After each ``ask`` returns it prints one
line, ``ACK <task> <execution id> <status>``: an acknowledged turn, which the
store must keep whatever happens next.

Beside it, a second runtime with a store of its own on the same file (a second
connection, so the file has two writers) now and then asks the persistent agent
``side`` a burst of tasks, ``side SEED-1``, ...: acknowledged the same way.

Every choice (how many calls, how long each sleep) comes from one
``random.Random(SEED)``; latencies stay within 0 to 5 ms so that many turns
complete per second. The model decides from the request alone which step it is
at, so one model serves any number of concurrent executions.
"""

from __future__ import annotations

import random
import sys

import anyio
import anyio.lowlevel

from fractor.actors import (
    Agent,
    AgentRef,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    UserMessage,
    call,
    calls,
    reply,
    tool,
)
from fractor.runtime import Runtime, SQLiteStore

__all__ = ["AGENT_OF_PREFIX", "LEAD", "SIDE", "answer_to", "main"]

#: The ids of the two persistent agents.
LEAD = "lead"
SIDE = "side"
#: The first word of a task names the agent it was asked of.
AGENT_OF_PREFIX = {"task": LEAD, "side": SIDE}


def answer_to(task: str) -> str:
    """The final answer the models give to ``task`` (when nothing stops them)."""
    return f"answer to {task}"


@tool
async def work(ms: int) -> str:
    """Work for ``ms`` milliseconds."""
    if ms:
        await anyio.sleep(ms / 1000)
    else:
        await anyio.lowlevel.checkpoint()
    return f"worked {ms} ms"


class Script:
    """The models of every agent of one process, driven by one seeded generator."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    async def latency(self) -> None:
        """A model's think time: none half of the time, else up to 5 ms."""
        if self.rng.random() < 0.5:
            await anyio.lowlevel.checkpoint()
        else:
            await anyio.sleep(self.rng.random() * 0.005)

    def work(self) -> ModelResponse:
        """A plain tool call: no sleep, or a sleep of 1 to 5 ms."""
        return call("work", ms=self.rng.choice((0, 0, 1, 2, 5)))

    async def lead(self, request: ModelRequest) -> ModelResponse:
        """Plain tool calls, then 2 to 4 workers in parallel, then the answer."""
        await self.latency()
        task, step = _position(request)
        if step == 0:
            return calls(*(self.work() for _ in range(self.rng.randint(1, 3))))
        if step == 1:
            count = self.rng.randint(2, 4)
            workers = [call("worker", task=f"part {i} of {task}") for i in range(count)]
            if self.rng.random() < 0.5:
                workers.append(self.work())
            return calls(*workers)
        return reply(answer_to(task))

    async def worker(self, request: ModelRequest) -> ModelResponse:
        """One or two tool calls, sometimes a nested helper, then the answer."""
        await self.latency()
        task, step = _position(request)
        if step == 0:
            return calls(*(self.work() for _ in range(self.rng.randint(1, 2))))
        if step == 1 and self.rng.random() < 0.4:
            return call("helper", task=f"help with {task}")
        return reply(answer_to(task))

    async def helper(self, request: ModelRequest) -> ModelResponse:
        """One tool call, then the answer."""
        await self.latency()
        task, step = _position(request)
        if step == 0:
            return self.work()
        return reply(answer_to(task))

    def agent(self, name: str) -> Agent:
        """A top-level agent ``name`` with workers and helpers under it."""
        helper = Agent(
            "helper", FunctionModel(self.helper), tools=[work], description="Helps a worker."
        )
        worker = Agent(
            "worker",
            FunctionModel(self.worker),
            tools=[work],
            subagents=[helper],
            description="Works on one part.",
        )
        return Agent(name, FunctionModel(self.lead), tools=[work], subagents=[worker])


def _position(request: ModelRequest) -> tuple[str, int]:
    """The task of this execution (its last user turn) and how many steps it has taken
    (the tool-calling answers after that turn)."""
    steps = 0
    for message in reversed(request.messages):
        if isinstance(message, UserMessage):
            return message.content, steps
        if isinstance(message, AssistantMessage) and message.tool_calls:
            steps += 1
    raise AssertionError("a request without a user turn")


async def ask(ref: AgentRef, text: str) -> None:
    """Ask ``text`` and acknowledge the turn once ``ask`` has returned."""
    result = await ref.ask(text)
    print(f"ACK {text} {result.execution_id} {result.status}", flush=True)


async def side(db: str, seed: int, script: Script) -> None:
    """Now and then a burst of 1 to 4 tasks for ``side``, through a second store."""
    rng = script.rng
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(script.agent(SIDE), id=SIDE)
        number = 0
        while True:
            await anyio.sleep(rng.random() * 0.3)
            for _ in range(rng.randint(1, 4)):
                number += 1
                await ask(ref, f"side {seed}-{number}")


async def run(db: str, seed: int) -> None:
    script = Script(random.Random(seed))
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        lead = await rt.spawn(script.agent(LEAD), id=LEAD)
        print("READY", flush=True)
        async with anyio.create_task_group() as tg:
            tg.start_soon(side, db, seed, script)
            number = 0
            while True:
                number += 1
                await ask(lead, f"task {seed}-{number}")


def main() -> None:
    db, backend, seed = sys.argv[1], sys.argv[2], int(sys.argv[3])
    anyio.run(run, db, seed, backend=backend)


if __name__ == "__main__":
    main()
