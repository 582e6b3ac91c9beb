"""Random-tree agents for the lease property tests (``test_lease_properties.py``):
module-level tools and models, so that Ray ships them by reference.

One ``worker`` definition serves every worker of a tree: what a worker does is
written in its task (``plan``), and its model is a function of its own request
only, so that a tree sends the very same requests however its workers interleave,
on any host, with or without a budget (the reply of a request cut short and asked
again is the same reply).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import anyio

from fractor.actors import (
    Agent,
    FunctionModel,
    ModelRequest,
    ScriptedModel,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget, Price

from .trees import _asked, _task

#: The one model name of the trees, and its price (cost is a real field).
MODEL = "fake"
#: A thousandth of a unit per input token, four per output token.
PRICE = Price(input_per_million=1_000, output_per_million=4_000)
#: Four characters make one estimated token.
_CHARS_PER_TOKEN = 4
_FILLER = "the quick brown fox jumps over the lazy dog; "


@tool
async def look(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


@dataclass(frozen=True)
class Plan:
    """What one worker does: ``steps`` lookups (one a step), then a reply of
    ``reply`` output tokens; first, with ``helper`` set, it asks its helper, which
    looks once and replies with ``helper`` output tokens. With ``delay`` (ms), each
    of its model calls and its helper's takes up to that long (``latency``), as real
    models do: requests of siblings then overlap as timing decides."""

    name: str
    steps: int
    reply: int
    helper: int | None
    delay: int = 0

    def task(self) -> str:
        helper = "-" if self.helper is None else str(self.helper)
        delay = f" d{self.delay}" if self.delay else ""
        return f"{self.name} s{self.steps} r{self.reply} h{helper}{delay}"


def plan(task: str) -> Plan:
    """The plan a worker's task (``Plan.task``) writes."""
    name, steps, answer, helper, *delay = task.split()
    return Plan(
        name=name,
        steps=int(steps[1:]),
        reply=int(answer[1:]),
        helper=None if helper == "h-" else int(helper[1:]),
        delay=int(delay[0][1:]) if delay else 0,
    )


async def latency(delay: int, *key: object) -> None:
    """Wait as a model of up to ``delay`` ms would: a time drawn from ``key`` (the
    same request waits as long on every run; siblings differ)."""
    if delay:
        drawn = zlib.crc32(repr(key).encode()) % (delay * 1000)
        await anyio.sleep(drawn / 1_000_000)


def text_of(name: str, tokens: int) -> str:
    """A reply of exactly ``tokens`` estimated output tokens."""
    head = f"{name} says: "
    chars = tokens * _CHARS_PER_TOKEN
    body = head + _FILLER * (chars // len(_FILLER) + 1)
    return body[:chars]


async def working(request: ModelRequest) -> Turn:
    """A worker: its helper first (if its plan has one), its lookups, its reply."""
    me = plan(_task(request))
    step = _asked(request)
    await latency(me.delay, me.name, step)
    if me.helper is not None:
        if step == 0:
            delay = f" d{me.delay}" if me.delay else ""
            return call("helper", task=f"help {me.name} r{me.helper}{delay}")
        step -= 1
    if step < me.steps:
        return call("look", topic=f"{me.name} {step}")
    return reply(text_of(me.name, me.reply))


async def helping(request: ModelRequest) -> Turn:
    """A helper: one lookup, then its reply of the length its task names."""
    _, name, tokens, *delay = _task(request).split()
    await latency(int(delay[0][1:]) if delay else 0, name, "helper", _asked(request))
    if _asked(request) == 0:
        return call("look", topic=f"{name} for help")
    return reply(text_of(f"{name}'s helper", int(tokens[1:])))


def worker() -> Agent:
    """The worker of every tree, with its helper (placed beside it on its host)."""
    helper = Agent("helper", FunctionModel(helping, name=MODEL), tools=[look])
    return Agent("worker", FunctionModel(working, name=MODEL), tools=[look], subagents=[helper])


def lead(plans: list[Plan], budget: Budget | None = None) -> Agent:
    """A lead on the driver: asks every worker at once, then answers "All done."."""
    script = [calls(*(call("worker", task=p.task()) for p in plans)), reply("All done.")]
    return Agent("lead", ScriptedModel(script, name=MODEL), subagents=[worker()], budget=budget)
