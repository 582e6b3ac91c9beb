"""Agents that ``fractor mcp-serve`` serves in the tests (``test_mcp_serve.py``).

Their models are ``FunctionModel``\\ s answering from the request, so each call (a fresh
actor on every one) gets the same script, with no network: ``echo`` calls its tool
``shout`` on the task and answers with the result; ``greedy`` asks for ``shout`` twice
in each step, under a budget of one tool call, so its tree is stopped; ``painter``
answers with a PNG and a PDF beside its text; ``sleeper`` never answers (it prints
``asleep`` on stderr once its model is asked, so a test knows the call is in flight).
"""

from __future__ import annotations

import sys

import anyio

from fractor.actors import (
    Agent,
    Document,
    FunctionModel,
    Image,
    ModelRequest,
    ModelResponse,
    ToolResultMessage,
    call,
    calls,
    reply,
    tool,
)
from fractor.runtime import Budget
from tests.actors.parts_data import pdf, png


@tool
def shout(text: str) -> str:
    """Repeat the text in capitals."""
    return text.upper()


def _echo(request: ModelRequest) -> ModelResponse:
    last = request.messages[-1]
    if isinstance(last, ToolResultMessage):
        return reply(f"The agent says: {last.content}")
    return call("shout", {"text": getattr(last, "content", "")})


def _greedy(request: ModelRequest) -> ModelResponse:
    last = request.messages[-1]
    text = getattr(last, "content", "")
    return calls(call("shout", {"text": text}), call("shout", {"text": text}))


echo = Agent(
    name="echo",
    model=FunctionModel(_echo),
    tools=[shout],
    description="Shouts the task back, through its tool.",
)

greedy = Agent(
    name="greedy",
    model=FunctionModel(_greedy),
    tools=[shout],
    instructions="Shout everything twice.",
    budget=Budget(tool_calls=1),
)

#: What ``painter`` answers with besides its text.
PAINTING = Image(data=png(8, 6, fill=200))
REPORT = Document(data=pdf(3), name="report.pdf")

painter = Agent(
    name="painter",
    model=FunctionModel(lambda request: reply("Here it is.", parts=(PAINTING, REPORT))),
    description="Paints what it is asked for.",
)


async def _asleep(request: ModelRequest) -> ModelResponse:
    print("asleep", file=sys.stderr, flush=True)
    await anyio.sleep_forever()
    raise AssertionError("unreachable")


sleeper = Agent(name="sleeper", model=FunctionModel(_asleep), description="Never answers.")

not_an_agent = 42
