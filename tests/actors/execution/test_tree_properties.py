"""Property tests over random agent trees run for real (DESIGN.md section 5, invariants
1, 4 and 5).

Each example draws one or two top-level agents, each the root of a random tree (one to
three levels, up to three subagents per agent) with random scripts: steps of parallel
tool calls (some slow, some failing) and subagent calls, a final reply or a model
error, explicit or estimated usage, and random budgets on the runtime and on some
agents. Every agent's script is a ``FunctionModel`` that reads only its own request,
so concurrent agents cannot steal each other's turns, and every text an agent writes
carries its marker (``<name>``), so a leak shows. After each round of asks:

- (a) no limit of any node is exceeded, the runtime's own included;
- (b) every node's usage is its own usage plus its children's;
- (c) every ask got one ``Result`` and nothing is left running;
- (d) a parent's conversation and every request its model received hold nothing of a
  child but the result of the tool call that delegated to it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fractor.actors import (
    Agent,
    AgentRef,
    AssistantMessage,
    FunctionModel,
    Message,
    ModelRequest,
    ModelResponse,
    Result,
    ToolResultMessage,
    UserMessage,
    call,
    calls,
    estimate_tokens,
    reply,
    tool,
)
from fractor.runtime import Budget, Price, Runtime, TreeSnapshot, Usage

USAGE_FIELDS = ("input_tokens", "output_tokens", "cached_tokens", "requests", "tool_calls")
STATUSES = {"completed", "budget_exceeded", "timed_out", "cancelled", "failed"}
MODEL = "fake"
#: A thousandth of a unit per input token, four per output token.
PRICE = Price(input_per_million=1_000, output_per_million=4_000)


@tool
async def work(tag: str, delay_ms: int, broken: bool) -> str:
    """Do one piece of work for the agent that ``tag`` names."""
    if delay_ms:
        await anyio.sleep(delay_ms / 1000)
    if broken:
        raise ValueError(f"{tag} work failed")
    return f"{tag} work done"


def marker(name: str) -> str:
    return f"<{name}>"


# -- random trees ----------------------------------------------------------------------


@dataclass(frozen=True)
class Action:
    """One call of a step: the ``work`` tool, or the subagent ``child`` (an index)."""

    kind: Literal["tool", "sub"]
    delay_ms: int = 0
    broken: bool = False
    child: int = 0


#: Real usage of one model turn: (fraction of the input estimate, output tokens), or
#: None to let the fake estimate it.
TurnUsage = tuple[float, int] | None


@dataclass(frozen=True)
class Step:
    actions: tuple[Action, ...]
    usage: TurnUsage


@dataclass(frozen=True)
class Spec:
    """One agent definition of the tree and its script."""

    name: str
    steps: tuple[Step, ...]
    ending: Literal["reply", "fail"]
    final_usage: TurnUsage
    budget: Budget | None
    max_tokens: int | None
    children: tuple[Spec, ...]

    def walk(self) -> list[Spec]:
        """This spec, then every spec under it."""
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found


LIMITS: dict[str, st.SearchStrategy[Any]] = {
    "tokens": st.integers(0, 20_000),
    "output_tokens": st.integers(0, 400),
    "requests": st.integers(0, 12),
    "tool_calls": st.integers(0, 8),
    "steps": st.integers(0, 10),
    "agents": st.integers(0, 8),
    "depth": st.integers(0, 3),
    "cost": st.floats(0.05, 5.0),
}


@st.composite
def budgets(draw: st.DrawFn) -> Budget | None:
    """No budget (two times in three), or one with one to three random limits."""
    if draw(st.integers(0, 2)):
        return None
    names = draw(st.sets(st.sampled_from(sorted(LIMITS)), min_size=1, max_size=3))
    limits: dict[str, Any] = {name: draw(LIMITS[name]) for name in sorted(names)}
    return Budget(**limits)


turn_usages: st.SearchStrategy[TurnUsage] = st.one_of(
    st.none(), st.tuples(st.floats(0, 1), st.integers(1, 60))
)


@st.composite
def specs(draw: st.DrawFn, name: str, levels_below: int) -> Spec:
    # sampled_from draws evenly; integers() would favour the smallest trees.
    fan_out = draw(st.sampled_from([0, 1, 2, 3])) if levels_below else 0
    children = tuple(draw(specs(f"{name}s{index}", levels_below - 1)) for index in range(fan_out))
    tools = st.builds(
        Action,
        kind=st.just("tool"),
        delay_ms=st.sampled_from([0, 0, 1, 3]),
        broken=st.booleans(),
    )
    if children:
        delegations = st.builds(
            Action, kind=st.just("sub"), child=st.integers(0, len(children) - 1)
        )
        actions = st.one_of(tools, delegations, delegations)
    else:
        actions = tools
    step = st.builds(
        Step, actions=st.lists(actions, min_size=1, max_size=3).map(tuple), usage=turn_usages
    )
    steps = [draw(step) for _ in range(draw(st.sampled_from([0, 1, 1, 2, 2])))]
    if children:
        # Every subagent gets a task in the first step, so the whole tree runs.
        first = draw(step) if not steps else steps[0]
        everyone = tuple(Action(kind="sub", child=index) for index in range(len(children)))
        steps[:1] = [Step(actions=everyone + first.actions, usage=first.usage)]
    return Spec(
        name=name,
        steps=tuple(steps),
        ending=draw(st.sampled_from(["reply"] * 7 + ["fail"])),
        final_usage=draw(turn_usages),
        budget=draw(budgets()),
        max_tokens=draw(st.one_of(st.none(), st.none(), st.integers(3, 40))),
        children=children,
    )


@st.composite
def forests(draw: st.DrawFn) -> list[Spec]:
    """One or two top-level trees of one to three levels each."""
    count = draw(st.integers(1, 2))
    levels = st.sampled_from([0, 1, 2, 2])
    return [draw(specs(f"t{index}", draw(levels))) for index in range(count)]


# -- scripts -----------------------------------------------------------------------------


def steps_done(messages: tuple[Message, ...]) -> int:
    """How many steps of the current execution ran: its assistant messages so far."""
    last_task = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    return sum(isinstance(m, AssistantMessage) for m in messages[last_task + 1 :])


def with_usage(response: ModelResponse, usage: TurnUsage, request: ModelRequest) -> ModelResponse:
    """Give the turn explicit usage: at most the input estimate the budget checked."""
    if usage is None:
        return response
    fraction, output_tokens = usage
    input_tokens = math.floor(estimate_tokens(request) * fraction)
    explicit = Usage(input_tokens=input_tokens, output_tokens=output_tokens, requests=1)
    return msgspec.structs.replace(response, usage=explicit)


def script(spec: Spec) -> Callable[[ModelRequest], ModelResponse]:
    """The agent's model: a function of its own request only."""
    me = marker(spec.name)

    def respond(request: ModelRequest) -> ModelResponse:
        index = steps_done(request.messages)
        if index < len(spec.steps):
            step = spec.steps[index]
            turns = []
            for action in step.actions:
                if action.kind == "tool":
                    arguments = {"tag": me, "delay_ms": action.delay_ms, "broken": action.broken}
                    turns.append(call("work", arguments))
                else:
                    child = spec.children[action.child].name
                    turns.append(call(child, {"task": f"{me} delegates step {index}"}))
            response = calls(*turns, text=f"{me} step {index}")
            return with_usage(response, step.usage, request)
        if spec.ending == "fail":
            raise RuntimeError(f"{me} model failed")  # the request fails: not retryable
        return with_usage(reply(f"{me} final answer"), spec.final_usage, request)

    return respond


def build(spec: Spec, models: dict[str, FunctionModel]) -> Agent:
    model = models[spec.name] = FunctionModel(script(spec), name=MODEL)
    return Agent(
        spec.name,
        model,
        tools=[work],
        instructions=f"You are {marker(spec.name)}.",
        subagents=[build(child, models) for child in spec.children],
        budget=spec.budget,
        max_tokens=spec.max_tokens,
    )


# -- the properties ------------------------------------------------------------------------


def check_limits(tree: TreeSnapshot, runtime_budget: Budget | None) -> None:
    """(a) No node is over any of its limits; the root's limits are the runtime's."""
    assert tree.node("root").limits == runtime_budget
    parents = {node.id: node.parent_id for node in tree.nodes}
    for node in tree.nodes:
        limits, usage = node.limits, node.usage
        if limits is None:
            continue
        under(usage.input_tokens + usage.output_tokens, limits.tokens, node.id)
        under(usage.input_tokens, limits.input_tokens, node.id)
        under(usage.output_tokens, limits.output_tokens, node.id)
        under(usage.requests, limits.requests, node.id)
        under(usage.tool_calls, limits.tool_calls, node.id)
        under(node.steps, limits.steps, node.id)
        under(node.agents, limits.agents, node.id)
        if limits.cost is not None:
            assert usage.cost <= limits.cost + 1e-9, (node.id, usage.cost, limits.cost)
        if limits.depth is not None:
            for other in tree.nodes:
                ancestor = parents[other.id]
                while ancestor is not None and ancestor != node.id:
                    ancestor = parents[ancestor]
                if ancestor == node.id:
                    under(other.depth - node.depth, limits.depth, other.id)


def under(value: int, limit: int | None, node_id: str) -> None:
    assert limit is None or value <= limit, (node_id, value, limit)


def check_sums(tree: TreeSnapshot) -> None:
    """(b) usage == own usage + the usage of every child, field by field."""
    for node in tree.nodes:
        children = tree.children(node.id)
        total = sum((child.usage for child in children), node.own_usage)
        for field in USAGE_FIELDS:
            assert getattr(node.usage, field) == getattr(total, field), (node.id, field)
        assert node.usage.cost == pytest.approx(total.cost, rel=1e-9, abs=1e-12)


def texts(message: Message) -> str:
    if isinstance(message, AssistantMessage):
        calls_text = " ".join(f"{c.name} {c.arguments}" for c in message.tool_calls)
        return f"{message.content} {calls_text}"
    return message.content


def check_isolation(
    spec: Spec,
    models: dict[str, FunctionModel],
    every_marker: set[str],
    allowed: frozenset[str],
) -> None:
    """(d) In every request of ``spec``'s model, a child's marker appears only in the
    result of the call that delegated to that child; no other agent's marker but the
    ancestors' (who wrote the task) and its own appears at all."""
    allowed = allowed | {marker(spec.name)}
    children = {child.name: marker(child.name) for child in spec.children}
    for request in models[spec.name].requests:
        called: dict[str, str] = {}
        for message in request.messages:
            found = {m for m in every_marker if m in texts(message)} - allowed
            if isinstance(message, AssistantMessage):
                called.update((c.id, c.name) for c in message.tool_calls)
            if isinstance(message, ToolResultMessage) and message.name in children:
                # The result of a delegation, answering the call that made it.
                assert called.get(message.call_id) == message.name
                found.discard(children[message.name])
            assert not found, (spec.name, found, message)
    for child in spec.children:
        check_isolation(child, models, every_marker, allowed)


#: How the answer to an ask the supervisor refused to start begins.
NOT_STARTED = "[budget_exceeded] The task was not started"


async def check_conversation(ref: AgentRef, every_marker: set[str], asked: int) -> None:
    """(d) The top-level conversation: tasks and final answers, nothing of a child."""
    conversation = await ref.conversation()
    assert conversation.execution == ()
    assert len(conversation.messages) == 2 * asked
    me = marker(ref.agent.name)
    for index, message in enumerate(conversation.messages):
        kind = UserMessage if index % 2 == 0 else AssistantMessage
        assert isinstance(message, kind)
        if isinstance(message, AssistantMessage):
            assert message.tool_calls == ()
        others = {m for m in every_marker if m in message.content} - {me}
        assert not others, (ref.agent.name, others, message)


def check_answers(tree: TreeSnapshot, results: dict[int, list[Result]]) -> None:
    """(c) One ``Result`` per ask, with a known status, as its node ended."""
    for answers in results.values():
        assert len(answers) == 1
        (result,) = answers
        assert isinstance(result, Result)
        assert result.status in STATUSES
        assert result.text
        if result.execution_id:  # empty when the runtime refused to start it
            node = tree.node(result.execution_id)
            assert node.status == result.status
            assert node.stop_reason == result.stop_reason
            # Abandoned children may still charge a little after their parent answered.
            for field in USAGE_FIELDS:
                assert getattr(result.usage, field) <= getattr(node.usage, field), field


def still_running(tree: TreeSnapshot) -> list[str]:
    return [node.id for node in tree.nodes if node.status == "running" and node.id != "root"]


async def quiescent(rt: Runtime, top_level: int) -> TreeSnapshot:
    """The tree once every abandoned child has unwound (a parent answers without
    waiting for them): no node left running, only the top-level actors alive and no
    ask pending. Fails if that takes more than a second."""
    with anyio.move_on_after(1):
        while still_running(rt.tree()) or rt.statistics().live_actors != top_level:
            await anyio.wait_all_tasks_blocked()
    tree = rt.tree()
    assert still_running(tree) == []
    statistics = rt.statistics()
    assert statistics.live_actors == top_level
    assert statistics.pending_asks == 0
    return tree


async def ask_into(results: list[Result], ref: AgentRef, task: str) -> None:
    results.append(await ref.ask(task))


@settings(
    max_examples=100,
    deadline=None,
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)
@given(forest=forests(), runtime_budget=budgets(), rounds=st.integers(1, 2))
async def test_random_trees_keep_budgets_sums_replies_and_isolation(
    forest: list[Spec], runtime_budget: Budget | None, rounds: int
) -> None:
    models: dict[str, FunctionModel] = {}
    agents = [build(spec, models) for spec in forest]
    every_marker = {marker(spec.name) for top in forest for spec in top.walk()}
    with anyio.fail_after(30):
        async with Runtime(budget=runtime_budget, prices={MODEL: PRICE}) as rt:
            refs = [await rt.spawn(agent) for agent in agents]
            started = [0] * len(refs)  # asks that ran: a refused one joins no conversation
            for round_index in range(rounds):
                results: dict[int, list[Result]] = {i: [] for i in range(len(refs))}
                async with anyio.create_task_group() as tg:
                    for index, ref in enumerate(refs):
                        task = f"{marker(ref.agent.name)} user task {round_index}"
                        tg.start_soon(ask_into, results[index], ref, task)
                check_answers(rt.tree(), results)
                # (a) and (b) hold at any time, right after the asks as well.
                check_limits(rt.tree(), runtime_budget)
                check_sums(rt.tree())
                # (c) nothing is left running once abandoned children have unwound.
                tree = await quiescent(rt, len(refs))
                check_limits(tree, runtime_budget)
                check_sums(tree)
                for index, ref in enumerate(refs):
                    started[index] += sum(
                        not r.text.startswith(NOT_STARTED) for r in results[index]
                    )
                    await check_conversation(ref, every_marker, started[index])
            for spec in forest:
                check_isolation(spec, models, every_marker, frozenset())


async def test_a_stopped_subtree_starts_no_new_step() -> None:
    def worker_script(request: ModelRequest) -> ModelResponse:
        if steps_done(request.messages) < 3:
            return call("work", {"tag": "<worker>", "delay_ms": 0, "broken": False})
        return reply("<worker> final answer")

    def boss_script(request: ModelRequest) -> ModelResponse:
        if steps_done(request.messages) == 0:
            return call("worker", {"task": "<boss> delegates"})
        return reply("<boss> final answer")

    worker_model = FunctionModel(worker_script)
    worker = Agent("worker", worker_model, tools=[work])
    # One tool call for the whole subtree: the worker's second call is refused.
    boss = Agent(
        "boss", FunctionModel(boss_script), subagents=[worker], budget=Budget(tool_calls=1)
    )
    with anyio.fail_after(5):
        async with Runtime() as rt:
            result = await (await rt.spawn(boss)).ask("go")
            tree = await quiescent(rt, 1)
    assert result.status == "budget_exceeded"
    (node,) = [n for n in tree.nodes if n.name == "worker"]
    assert node.status == "budget_exceeded"
    assert node.usage.tool_calls == 1
    # Two steps ran (the second one's call was refused), two requests reached the model.
    assert len(worker_model.requests) == 2
    assert (node.steps, node.usage.requests) == (2, 2)
