"""Tools shared by the agent tests. Tools that keep per-test state are factories."""

from __future__ import annotations

from typing import Any

import anyio
import anyio.lowlevel

from fractor.actors import (
    Agent,
    AssistantMessage,
    FunctionModel,
    Model,
    ModelRequest,
    Result,
    RetryPolicy,
    Tool,
    tool,
)
from fractor.actors._models._turns import Turn
from fractor.runtime import Runtime


@tool
async def get_weather(city: str) -> str:
    """Current weather for a city."""
    return f"22°C and sunny in {city}"


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


class Counter:
    """How many calls of a counting tool really ran."""

    def __init__(self) -> None:
        self.ran = 0


def counting_work() -> tuple[Tool[..., Any], Counter]:
    """A ``work`` tool that counts the calls that really run (one checkpoint each)."""
    counter = Counter()

    @tool
    async def work() -> str:
        """Counts the calls that really run."""
        counter.ran += 1
        await anyio.lowlevel.checkpoint()
        return "ok"

    return work, counter


def hanging() -> tuple[Tool[..., Any], anyio.Event]:
    """A ``hang`` tool that never returns, and an event set once it has been entered."""
    entered = anyio.Event()

    @tool
    async def hang() -> str:
        """Never returns."""
        entered.set()
        await anyio.sleep_forever()
        return "never"  # pragma: no cover

    return hang, entered


async def ask_once(model: Model, text: str = "Go", *, retries: int = 2) -> Result:
    """One task for a fresh agent on ``model``, retrying model requests at once."""
    agent = Agent("assistant", model, retry=RetryPolicy(retries=retries, initial_delay=0))
    async with Runtime() as rt:
        return await (await rt.spawn(agent)).ask(text)


def stepped(*turns: Turn) -> FunctionModel:
    """A model answering each execution with ``turns`` in order, counting its own steps
    (the tool-call messages of its execution so far): concurrent and nested executions
    of one definition never mix their scripts."""

    def respond(request: ModelRequest) -> Turn:
        done = sum(isinstance(m, AssistantMessage) and bool(m.tool_calls) for m in request.messages)
        return turns[min(done, len(turns) - 1)]

    return FunctionModel(respond)


#: The emails ``send_email`` sent (cleared before each test: tests/actors/conftest.py).
RAN: list[str] = []


@tool(approval=True)
async def send_email(to: str) -> str:
    """Send an email."""
    RAN.append(to)
    return f"sent to {to}"
