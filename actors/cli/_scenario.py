"""``fractor demo``: a research team of nested agents, scripted, with no network.

A **lead** agent plans, then spawns one **researcher** subagent per topic, all in
parallel. Each researcher searches, fetches two pages at once and takes notes; the
tools take 50 to 400 ms, so the tree is visibly alive for a few seconds. The first
researcher hands a claim to a **fact-checker** subagent (which, with ``depth`` > 1,
hands it on to a deeper one, and so on). The last researcher has a tight token
budget of its own (``Budget(tokens=budget_tokens)``): the long pages it fetched do
not fit in its next request, so it answers ``budget_exceeded`` while the others
complete. The lead then reads the tool results in its request and writes one final
answer that says which topic is missing and why.

Its tools and their fake web pages live in ``_world.py``. Every model is a
``FunctionModel`` script: a function of the request that picks its next turn from
what the execution buffer holds so far. The scripts report the usage a real model
would: each request carries a system prompt and tool schemas (``PROMPT_TOKENS``)
besides its messages, and the same count is the model's token estimate, so the
supervisor's pre-check sees what will be charged. Prices are illustrative, so that
costs show.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

import msgspec
from rich.console import Console

from fractor.runtime import Budget, Price, Runtime, SQLiteStore, Store, TreeSnapshot, Usage

from .._agent._agent import Agent
from .._messages import (
    AssistantMessage,
    ModelRequest,
    ModelResponse,
    Result,
    ToolResultMessage,
    UserMessage,
)
from .._models._protocol import (
    FunctionModel,
    Streamed,
    call,
    calls,
    estimate_tokens,
    reply,
    streamed,
)
from .._observation._traces import collect_trace_tree
from .._tools._tool import Tool
from ._live import watch
from ._ui import web_view
from ._world import Clock, Topic, make_tools, pick_topics, url

__all__ = [
    "DEFAULT_BUDGET_TOKENS",
    "QUESTION",
    "DemoOptions",
    "DemoRun",
    "build_team",
    "describe",
    "run_demo",
]

QUESTION = "How can a mid-sized city cut the emissions of its electricity and heating by 2030?"
#: The token budget of the last researcher: its fetched pages do not fit in it.
DEFAULT_BUDGET_TOKENS = 4_000
#: What every request carries besides its messages: system prompt and tool schemas.
PROMPT_TOKENS = 900
#: Output tokens a model spends on a turn besides what it writes (reasoning, framing).
THINKING_TOKENS = 40
#: Illustrative prices per million tokens, so that the usage table shows costs.
PRICES = {
    "demo-large": Price(input_per_million=3.0, output_per_million=15.0),
    "demo-small": Price(input_per_million=0.25, output_per_million=1.25),
}


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """What ``fractor demo`` runs: ``fanout`` researchers (at least 2), ``depth``
    levels of fact-checkers under the first one, the last one's token budget,
    ``speed`` (every latency is divided by it) and ``db`` (None: no store)."""

    fanout: int = 3
    depth: int = 1
    budget_tokens: int = DEFAULT_BUDGET_TOKENS
    speed: float = 1.0
    db: str | None = "fractor.db"

    def check(self) -> list[str]:
        """What is wrong with these options, in words (empty when they are fine)."""
        problems: list[str] = []
        if not 2 <= self.fanout <= 50:
            problems.append(
                f"--fanout must be between 2 and 50, got {self.fanout} (one researcher runs "
                "out of its budget while the others complete, so at least 2)"
            )
        if not 0 <= self.depth <= 8:
            problems.append(f"--depth must be between 0 and 8, got {self.depth}")
        if self.budget_tokens < 1:
            problems.append(f"--budget-tokens must be >= 1, got {self.budget_tokens}")
        if not (math.isfinite(self.speed) and 0.1 <= self.speed <= 1000):
            problems.append(f"--speed must be between 0.1 and 1000, got {self.speed}")
        return problems


@dataclass(frozen=True, slots=True)
class DemoRun:
    """What one run of the demo did: the lead's result, the final tree, the store."""

    options: DemoOptions
    result: Result
    tree: TreeSnapshot
    researchers: tuple[str, ...]
    #: How many execution traces the store holds for the lead's execution (0: no store).
    stored_traces: int


# -- the scripts --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Seen:
    """What a script reads in a request: the task, the steps so far, their results."""

    task: str
    step: int
    results: list[ToolResultMessage]

    def result(self, name: str) -> ToolResultMessage | None:
        return next((result for result in self.results if result.name == name), None)


def _seen(request: ModelRequest) -> _Seen:
    messages = request.messages
    last_user = max(
        (i for i, message in enumerate(messages) if type(message) is UserMessage), default=-1
    )
    current = messages[last_user + 1 :]
    return _Seen(
        task=messages[last_user].content if last_user >= 0 else "",
        step=sum(type(message) is AssistantMessage for message in current),
        results=[message for message in current if type(message) is ToolResultMessage],
    )


class _DemoModel(FunctionModel):
    """A ``FunctionModel`` whose token counts are those of a real agent's requests."""

    def estimate_tokens(self, request: ModelRequest) -> int:
        return PROMPT_TOKENS + super().estimate_tokens(request)


Script = Callable[[_Seen], ModelResponse]


#: Seconds between two streamed pieces of a demo model's text (at speed 1).
STREAM_GAP = 0.03
#: About how many characters a streamed piece holds.
STREAM_PIECE = 24


def _model(key: str, price: str, clock: Clock, script: Script) -> FunctionModel:
    """A model that thinks 100-250 ms, then streams ``script(what it sees)``: its text
    in pieces of a few words, ``STREAM_GAP`` seconds apart (the live view shows each
    agent's latest line as it comes)."""

    async def respond(request: ModelRequest) -> Streamed:
        seen = _seen(request)
        await clock.wait(f"think:{key}:{seen.step}", 0.1, 0.25)
        response = script(seen)
        written = len(response.text) + sum(
            len(c.name) + len(c.arguments) for c in response.tool_calls
        )
        usage = Usage(
            input_tokens=PROMPT_TOKENS + estimate_tokens(request),
            output_tokens=THINKING_TOKENS + -(-written // 4),
        )
        pieces = max(1, min(len(response.text) // STREAM_PIECE, 60))
        return streamed(
            msgspec.structs.replace(response, usage=usage),
            chunks=pieces,
            delay=STREAM_GAP * clock.scale,
        )

    return _DemoModel(respond, name=price)


def _checker(level: int, depth: int, clock: Clock, tools: dict[str, Tool[..., Any]]) -> Agent:
    """The fact-checker of ``level`` (1 = right under the researcher), and those below."""
    name = "fact-checker" if level == 1 else f"fact-checker-{level}"
    deeper = _checker(level + 1, depth, clock, tools) if level < depth else None

    def script(seen: _Seen) -> ModelResponse:
        claim = seen.task.removeprefix("Check this claim: ")
        if seen.step == 0:
            return calls(
                call("lookup_source", claim=claim),
                call("search", query=f"evidence {claim[:40]}"),
                text="Looking for primary sources.",
            )
        if seen.step == 1 and deeper is not None:
            return call(deeper.name, task=f"Check this claim: {claim}")
        text = f"Verified ({name}): two independent primary sources support the claim."
        below = seen.result(deeper.name) if deeper is not None else None
        if below is not None:
            verdict = "agrees" if not below.is_error else "could not finish"
            text += f" A deeper check {verdict}."
        return reply(text)

    return Agent(
        name=name,
        model=_model(name, "demo-small", clock, script),
        tools=[tools["lookup_source"], tools["search"]],
        subagents=() if deeper is None else (deeper,),
        instructions="Check one claim against primary sources. Be terse.",
        description="checks one claim against primary sources",
    )


def _researcher(
    topic: Topic,
    clock: Clock,
    tools: dict[str, Tool[..., Any]],
    *,
    checker: Agent | None,
    budget: Budget | None,
) -> Agent:
    query = f"{topic.title} city emissions 2030"

    def script(seen: _Seen) -> ModelResponse:
        if seen.step == 0:
            return call("search", query=query, text=f"Searching for {topic.title}.")
        if seen.step == 1:
            return calls(*(call("fetch_page", url=url(query, n)) for n in (1, 2)))
        if seen.step == 2:
            notes = call("take_notes", topic=topic.title, notes=" ".join(topic.findings))
            if checker is None:
                return notes
            check = call(checker.name, task=f"Check this claim: {topic.findings[0]}")
            return calls(notes, check)
        text = f"{topic.title.capitalize()}: {topic.findings[0]} {topic.findings[1]}"
        text += f" Sources: {url(query, 1)}, {url(query, 2)}."
        checked = seen.result(checker.name) if checker is not None else None
        if checked is not None:
            text += f" Fact-check: {checked.content}"
        return reply(text)

    name = f"researcher-{topic.slug}"
    return Agent(
        name=name,
        model=_model(name, "demo-small", clock, script),
        tools=[tools["search"], tools["fetch_page"], tools["take_notes"]],
        subagents=() if checker is None else (checker,),
        budget=budget,
        instructions=f"Research {topic.title}: search, read two sources, take notes, summarize.",
        description=f"researches {topic.title}",
    )


_STOPPED = re.compile(r"^\[(\w+)\] The task stopped before a final answer: (.*?)\. Done so far")


def _merge(question: str, researchers: dict[str, Topic], results: list[ToolResultMessage]) -> str:
    """The lead's final answer, from what each researcher's tool result says."""
    found: list[str] = []
    missing: list[str] = []
    for result in results:
        topic = researchers.get(result.name)
        if topic is None:
            continue
        if not result.is_error:
            checked = " (fact-checked)" if "Fact-check:" in result.content else ""
            found.append(f"- {topic.title.capitalize()}{checked}: {topic.findings[0]}")
            continue
        stopped = _STOPPED.match(result.content)
        status, reason = stopped.groups() if stopped else ("failed", result.content[:120])
        missing.append(
            f"- {topic.title.capitalize()}: no finding. Its researcher stopped ({status}: "
            f"{reason.split(' (budget of')[0]}) before it could summarize its sources."
        )
    lines = [question, "", f"Findings from {len(found)} of {len(researchers)} topics:"]
    lines += found
    if missing:
        lines += ["", "Not covered:", *missing]
        lines.append("Treat these as open questions; rerun them with a larger budget.")
    if found:
        lines += ["", "Start with the measures that need one owner and no new grid capacity."]
    return "\n".join(lines)


def _lead(
    topics: Sequence[Topic],
    researchers: Sequence[Agent],
    clock: Clock,
    tools: dict[str, Tool[..., Any]],
) -> Agent:
    by_name = {agent.name: topic for agent, topic in zip(researchers, topics, strict=True)}

    def script(seen: _Seen) -> ModelResponse:
        if seen.step == 0:
            return call("plan_research", question=seen.task, text="Splitting the question.")
        if seen.step == 1:
            delegated = [
                call(agent.name, task=f"Research {topic.title} for this question: {seen.task}")
                for agent, topic in zip(researchers, topics, strict=True)
            ]
            return calls(*delegated, text="One researcher per topic, all in parallel.")
        return reply(_merge(seen.task, by_name, seen.results))

    return Agent(
        name="lead",
        model=_model("lead", "demo-large", clock, script),
        tools=[tools["plan_research"]],
        subagents=tuple(researchers),
        instructions="Plan the research, delegate each topic, merge what comes back honestly.",
    )


def describe(options: DemoOptions) -> list[str]:
    """Two lines saying what ``options`` will run."""
    topics = pick_topics(options.fanout)
    levels = "level" if options.depth == 1 else "levels"
    checkers = (
        f"; {options.depth} {levels} of fact-checkers under researcher-{topics[0].slug}"
        if options.depth
        else ""
    )
    return [
        f"a lead and {options.fanout} researchers in parallel{checkers}",
        f"researcher-{topics[-1].slug} has a budget of its own: {options.budget_tokens:,} tokens",
    ]


def build_team(options: DemoOptions) -> tuple[Agent, tuple[str, ...]]:
    """The lead agent of ``options`` and the names of its researchers."""
    clock = Clock(options.speed)
    topics = pick_topics(options.fanout)
    tools = make_tools(clock, topics)
    checker = _checker(1, options.depth, clock, tools) if options.depth else None
    researchers = [
        _researcher(
            topic,
            clock,
            tools,
            checker=checker if index == 0 else None,
            budget=Budget(tokens=options.budget_tokens) if index == len(topics) - 1 else None,
        )
        for index, topic in enumerate(topics)
    ]
    return _lead(topics, researchers, clock, tools), tuple(agent.name for agent in researchers)


# -- running it ---------------------------------------------------------------------------


async def run_demo(
    options: DemoOptions,
    *,
    console: Console | None = None,
    plain: bool | None = None,
    ui: bool = False,
) -> DemoRun:
    """Run the scenario once, watched on ``console``; the store is opened and closed here.

    Raises ``ValueError`` for bad options and ``StoreError`` for a database that
    cannot be opened.
    """
    problems = options.check()
    if problems:
        raise ValueError("; ".join(problems))
    lead, researchers = build_team(options)
    budget = Budget(
        tokens=40_000 * (options.fanout + options.depth + 1),
        depth=2 + options.depth,
        seconds=60.0 / min(options.speed, 1.0),
    )
    async with AsyncExitStack() as stack:
        store: SQLiteStore | None = None
        if options.db is not None:
            store = await stack.enter_async_context(SQLiteStore(options.db))
        async with (
            Runtime(budget=budget, prices=PRICES, store=store) as rt,
            watch(rt, console=console, plain=plain, title="fractor demo"),
            web_view(rt, ui),
        ):
            ref = await rt.spawn(lead)
            result = await ref.ask(QUESTION)
        tree = rt.tree()
        stored = await _stored(store, result.execution_id)
    return DemoRun(
        options=options, result=result, tree=tree, researchers=researchers, stored_traces=stored
    )


async def _stored(store: Store | None, execution_id: str) -> int:
    if store is None or not execution_id:
        return 0
    return len(await collect_trace_tree(store, execution_id))
