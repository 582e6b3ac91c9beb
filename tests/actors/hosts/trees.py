"""Agent trees for the host tests: module-level tools and models, so that Ray ships
them by reference (a test's own closures would not import on a host)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import anyio

from fractor.actors import (
    Agent,
    AgentRef,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    Result,
    ScriptedModel,
    UserMessage,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget


@tool
async def lookup(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


#: Whether "slow ..." topics are slow (a test in this process may make them quick).
SLOW = {"digs": True}


@tool
async def dig(topic: str) -> str:
    """Dig into a topic: slow when the topic says so ("slow ..." sleeps 30 s)."""
    if topic.startswith("slow"):
        for _ in range(3_000):  # 30 s, unless a test in this process ends it sooner
            if not SLOW["digs"]:
                break
            await anyio.sleep(0.01)
    return f"dug into {topic}"


def _asked(request: ModelRequest) -> int:
    return sum(isinstance(m, AssistantMessage) and bool(m.tool_calls) for m in request.messages)


def _task(request: ModelRequest) -> str:
    """The task of the execution: its one user message."""
    for message in request.messages:
        if isinstance(message, UserMessage):
            return message.content
    return ""


async def research(request: ModelRequest) -> Turn:
    """A worker: one lookup of its task, then an answer naming it."""
    if _asked(request) == 0:
        return call("lookup", topic=_task(request))
    return reply(f"found {_task(request)}")


async def delegate(request: ModelRequest) -> Turn:
    """A worker with a helper of its own: asks it, then answers with its answer."""
    if _asked(request) == 0:
        return call("helper", task=f"help with {_task(request)}")
    return reply(f"{_task(request)}: {request.messages[-1].content}")


async def digging(request: ModelRequest) -> Turn:
    """A worker that digs (slowly when its task says so), then answers."""
    if _asked(request) == 0:
        return call("dig", topic=_task(request))
    return reply(f"dug {_task(request)}")


async def until(condition: Callable[[], bool], seconds: float = 10.0) -> None:
    """Poll ``condition`` (the state of other hosts has no event to wait on here)."""
    for _ in range(int(seconds / 0.01)):
        if condition():
            return
        await anyio.sleep(0.01)
    raise AssertionError(f"not within {seconds} s")


def lead(worker: Agent, tasks: list[str], budget: Budget | None = None) -> Agent:
    """A lead that hands each task to ``worker`` at once, then answers "All done."."""
    script = [calls(*(call(worker.name, task=t) for t in tasks)), reply("All done.")]
    return Agent("lead", ScriptedModel(script), subagents=[worker], budget=budget)


def researcher(name: str = "worker", **options: object) -> Agent:
    return Agent(name, FunctionModel(research), tools=[lookup], **options)  # type: ignore[arg-type]


def nested_worker() -> Agent:
    helper = Agent("helper", FunctionModel(research), tools=[lookup])
    return Agent("worker", FunctionModel(delegate), subagents=[helper])


def digger(**options: object) -> Agent:
    return Agent("worker", FunctionModel(digging), tools=[dig], **options)  # type: ignore[arg-type]


async def echoing(request: ModelRequest) -> Turn:
    """A worker that looks its task up, then answers with what the lookup said."""
    if _asked(request) == 0:
        return call("lookup", topic=_task(request))
    return reply(str(request.messages[-1].content))


def guarded(**options: object) -> Agent:
    """A worker whose lookups wait for a person's approval."""
    return Agent(
        "worker",
        FunctionModel(echoing),
        tools=[lookup],
        approval=["lookup"],
        **options,  # type: ignore[arg-type]
    )


@asynccontextmanager
async def asking(ref: AgentRef, **options: Any) -> AsyncIterator[list[Result]]:
    """Ask ``ref`` "go" in the background; the block runs once a call of its tree
    waits for approval, and the ask's ``Result`` is in the list after it."""
    results: list[Result] = []

    async def ask() -> None:
        results.append(await ref.ask("go", **options))

    async with anyio.create_task_group() as tg:
        tg.start_soon(ask)
        await until(lambda: bool(ref.approvals()))
        yield results


#: How long a writer's answer is, in characters (about 4 a token): longer than a
#: request's minimum output, so a reply cut by a too small ``max_tokens`` shows.
ESSAY = 8_000


async def writing(request: ModelRequest) -> Turn:
    """A worker that looks its task up twice, then answers with a long essay."""
    asked = _asked(request)
    if asked < 2:
        return call("lookup", topic=f"{_task(request)} {asked}")
    return reply(f"essay on {_task(request)}: " + "word " * (ESSAY // 5))


def writer(**options: object) -> Agent:
    return Agent("worker", FunctionModel(writing), tools=[lookup], **options)  # type: ignore[arg-type]
