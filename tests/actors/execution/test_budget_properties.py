"""Property tests of the budgets over random agent trees run for real (DESIGN.md
section 3, "Hard" and "Honest"; section 5, invariants 4 and 5).

Each example draws one or two top-level agents, each the root of a random tree one to
three levels deep. A step of an agent with subagents makes one to five subagent calls
at once (they run concurrently) and maybe a tool call or two. Every model is a
``FunctionModel`` that reads only its own request: the turn is chosen by how many
steps the execution has run, the usage is explicit (the input tokens are the
request's own estimate, so the budget's pre-check is exact; the output tokens are
drawn per turn) and 0 to 3 ms of latency are slept. What a request answers thus
depends on the request only, never on timing or on the order of concurrent requests.

``test_budgets_are_hard_and_honest`` puts random budgets (tokens, input and output
tokens, requests, tool calls, steps, cost) on the runtime, on random agents and on
the top-level asks, and watches the supervisor: every stop it makes is recorded at
the instant it happens, with the usage the stopped node had *settled* then. It
checks that

1. no node's usage is over any of its limits (hard);
2. every token or cost refusal was made when that node's settled usage plus the
   request's minimum (its input estimate plus ``min_output_tokens``, or less if the
   agent's ``max_tokens`` is smaller) went past the limit, and says so: ``need >
   left`` and ``left == limit - settled``; no counter was refused below its limit;
   nothing is stopped after the fact (honest);
3. every ask is answered exactly once with a ``Result`` of a known status, every
   tool call gets exactly one result, and after the runtime's block nothing waits
   for budget and no actor is alive.

``test_a_tree_whose_usage_fits_its_budget_completes`` runs each tree twice: without
budgets to measure its demand, then under budgets that just hold that demand.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
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
from fractor.runtime import (
    Budget,
    BudgetExceeded,
    Node,
    NodeSnapshot,
    Price,
    Reservation,
    Runtime,
    RuntimeStatistics,
    Supervisor,
    TreeSnapshot,
    Usage,
)
from fractor.runtime._admission import Need

MODEL = "fake"
#: A thousandth of a unit per input token, four per output token.
PRICE = Price(input_per_million=1_000, output_per_million=4_000)
STATUSES = {"completed", "budget_exceeded", "timed_out", "cancelled", "failed"}
#: The limits reserved and settled (the others are counters, checked and charged).
TOKEN_LIMITS = ("tokens", "input_tokens", "output_tokens", "cost")
COUNTER_LIMITS = ("requests", "steps", "tool_calls")
#: Seconds one runtime may take, hangs included.
RUN_TIMEOUT = 10
#: Each example runs whole trees for real: a few dozen per test and backend.
SUPPRESSED = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]


@tool
async def work(tag: str) -> str:
    """Do one piece of work for the agent that ``tag`` names."""
    return f"{tag} work done"


# -- random trees ----------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One model request of an execution, the step it starts and how it answers."""

    #: One subagent call per entry (the index of the child), all in this one step.
    delegations: tuple[int, ...]
    #: Calls of the ``work`` tool in the same step.
    tools: int
    output_tokens: int
    latency_ms: int

    @property
    def final(self) -> bool:
        return not self.delegations and not self.tools


@dataclass(frozen=True)
class Spec:
    """One agent definition of the tree and its script; the last turn answers."""

    name: str
    turns: tuple[Turn, ...]
    max_tokens: int | None
    children: tuple[Spec, ...]

    def walk(self) -> list[Spec]:
        """This spec, then every spec under it."""
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found

    def executions(self) -> int:
        """How many executions one task for this agent runs, its own included."""
        return 1 + sum(
            self.children[child].executions() for turn in self.turns for child in turn.delegations
        )


latencies = st.sampled_from([0, 0, 1, 2, 3])


@st.composite
def specs(
    draw: st.DrawFn, name: str, levels: int, room: int, outputs: st.SearchStrategy[int]
) -> Spec:
    """An agent ``levels`` deep whose one task runs at most ``room`` executions."""
    children: list[Spec] = []
    if levels and room > 1:
        for index in range(draw(st.integers(1, 2))):
            # The first child goes down as far as its room lets it.
            below = levels - 1 if index == 0 else draw(st.integers(0, levels - 1))
            child_room = draw(st.integers(1, max(1, (room - 1) // 2)))
            children.append(draw(specs(f"{name}s{index}", below, child_room, outputs)))
    turns: list[Turn] = []
    if children:
        used = 1
        for _ in range(draw(st.integers(1, 2))):
            wanted = draw(st.lists(st.integers(0, len(children) - 1), min_size=1, max_size=5))
            delegations: list[int] = []
            for child in wanted:
                size = children[child].executions()
                if used + size <= room:  # always true for the first call
                    delegations.append(child)
                    used += size
            if not delegations:
                break
            tools = draw(st.integers(0, 2))
            turns.append(Turn(tuple(delegations), tools, draw(outputs), draw(latencies)))
    else:
        tool_steps = st.builds(Turn, st.just(()), st.integers(1, 2), outputs, latencies)
        turns.extend(draw(st.lists(tool_steps, max_size=2)))
    turns.append(Turn((), 0, draw(outputs), draw(latencies)))
    max_tokens = draw(st.one_of(st.none(), st.none(), st.none(), st.integers(4, 120)))
    return Spec(name, tuple(turns), max_tokens, tuple(children))


@st.composite
def forests(draw: st.DrawFn, outputs: st.SearchStrategy[int]) -> list[Spec]:
    """One or two top-level trees, one to three levels deep, 60 executions at most."""
    count = draw(st.integers(1, 2))
    room = 60 // count
    return [
        draw(specs(f"t{index}", draw(st.integers(1, 3)), room, outputs)) for index in range(count)
    ]


# -- scripts -----------------------------------------------------------------------------


def marker(name: str) -> str:
    return f"<{name}>"


def steps_done(messages: tuple[Message, ...]) -> int:
    """How many steps of the current execution ran: its assistant messages so far."""
    last_task = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
    return sum(isinstance(m, AssistantMessage) for m in messages[last_task + 1 :])


class ScriptModel(FunctionModel):
    """A ``FunctionModel`` that remembers every input estimate it gave."""

    def __init__(self, spec: Spec) -> None:
        super().__init__(script(spec), name=MODEL)
        self.estimates: set[int] = set()

    def estimate_tokens(self, request: ModelRequest) -> int:
        tokens = super().estimate_tokens(request)
        self.estimates.add(tokens)
        return tokens


def script(spec: Spec) -> Callable[[ModelRequest], Awaitable[ModelResponse]]:
    """The agent's model: a function of its own request only."""
    me = marker(spec.name)

    async def respond(request: ModelRequest) -> ModelResponse:
        index = steps_done(request.messages)
        turn = spec.turns[index]
        await anyio.sleep(turn.latency_ms / 1000)
        usage = Usage(
            input_tokens=estimate_tokens(request), output_tokens=turn.output_tokens, requests=1
        )
        if turn.final:
            return reply(f"{me} final answer", usage=usage)
        asked = [
            call(spec.children[child].name, {"task": f"{me} step {index} call {number}"})
            for number, child in enumerate(turn.delegations)
        ]
        asked += [call("work", tag=me) for _ in range(turn.tools)]
        response = calls(*asked, text=f"{me} step {index}")
        return msgspec.structs.replace(response, usage=usage)

    return respond


def build(spec: Spec, models: dict[str, ScriptModel], budgets: Mapping[str, Budget]) -> Agent:
    model = models[spec.name] = ScriptModel(spec)
    return Agent(
        spec.name,
        model,
        tools=[work],
        instructions=f"You are {marker(spec.name)}.",
        subagents=[build(child, models, budgets) for child in spec.children],
        budget=budgets.get(spec.name),
        max_tokens=spec.max_tokens,
    )


# -- watching the supervisor -----------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A model request as the supervisor was admitting it."""

    node_id: str
    name: str
    chain: tuple[str, ...]
    input: int
    output: int
    wanted: int


@dataclass(frozen=True)
class Stop:
    """One ``stop_subtree`` of the supervisor, as it happened."""

    node_id: str
    status: str
    reason: str
    error: BudgetExceeded | None
    limits: Budget | None
    #: The node's totals then: settled tokens and cost, counters as charged.
    totals: Usage
    steps: int
    #: What ``settle`` had charged under the node until then, added up by the test.
    ledger: Usage
    #: The request being admitted, if the stop is its refusal.
    request: Request | None


@dataclass
class Observer:
    """Records every stop of one supervisor at the instant it is made.

    Wraps, on the instances: ``admit`` of the supervisor's admission (to know the
    request a refusal is about: admission is synchronous, so the request being
    admitted when a stop is made is the refused one), the supervisor's ``settle``
    (the entry every request is settled through: to add up what each request must
    be charged, node by node), and both ways a stop is made: the supervisor's
    ``stop_subtree`` (counters, cancellations) and the ``stop`` its admission was
    handed (refusals of requests, usage past a limit).
    """

    supervisor: Supervisor
    stops: list[Stop] = field(default_factory=list)
    ledger: dict[str, Usage] = field(default_factory=dict)
    admitting: Request | None = None
    need: Need | None = None
    #: What went wrong inside the supervisor's calls, checked after the run.
    problems: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        supervisor = self.supervisor
        admission = supervisor.admission
        admit, settle, stop_subtree = admission.admit, supervisor.settle, supervisor.stop_subtree

        def observed_admit(
            node: Node, need: Need, max_tokens: int | None, seq: float
        ) -> Reservation | Node:
            chain = tuple(current.id for current in node.chain())
            self.admitting = Request(
                node.id, node.name, chain, need.input, need.output, need.wanted
            )
            self.need = need
            try:
                return admit(node, need, max_tokens, seq)
            finally:
                self.admitting = None

        def observed_settle(
            node: Node,
            reservation: Reservation,
            usage: Usage | None,
            *,
            model: str = "",
            estimate: Callable[[], int] | None = None,
        ) -> Usage:
            # What settling must charge, added up before the supervisor settles: a
            # request it admits while settling sees this one settled already.
            if usage is None:  # cut off: its input estimate
                tokens = (reservation.input or (estimate() if estimate else 0), 0)
            else:
                tokens = (usage.input_tokens, usage.output_tokens)
            due = Usage(
                input_tokens=tokens[0],
                output_tokens=tokens[1],
                requests=1,
                cost=PRICE.cost(*tokens),
            )
            for current in node.chain():
                self.ledger[current.id] = self.ledger.get(current.id, Usage()) + due
            charged = settle(node, reservation, usage, model=model, estimate=estimate)
            if (charged.input_tokens, charged.output_tokens) != tokens or (
                charged.cost != pytest.approx(due.cost, rel=1e-12)
            ):  # an assertion here would fail the execution, not the test
                self.problems.append(f"charged {charged} for {usage}, {reservation}")
            return charged

        def observed_stop(
            node: Node,
            status: Any,
            reason: str,
            error: BudgetExceeded | None = None,
            *,
            cancel: bool = True,
        ) -> None:
            self.stops.append(
                Stop(
                    node_id=node.id,
                    status=status,
                    reason=reason,
                    error=error,
                    limits=node.limits,
                    totals=node.usage(),
                    steps=node.steps,
                    ledger=self.ledger.get(node.id, Usage()),
                    # (a request asked again lowers what it asks for to what the
                    # settled usage leaves before it is refused: as refused)
                    request=dataclasses.replace(self.admitting, output=self.need.output)
                    if self.admitting is not None and self.need is not None
                    else self.admitting,
                )
            )
            stop_subtree(node, status, reason, error, cancel=cancel)

        admission.admit = observed_admit  # type: ignore[method-assign]
        supervisor.settle = observed_settle
        supervisor.stop_subtree = observed_stop  # type: ignore[method-assign]
        admission.stop = observed_stop


# -- running a forest ------------------------------------------------------------------


@dataclass(frozen=True)
class Run:
    tree: TreeSnapshot
    results: list[list[Result]]
    stops: list[Stop]
    statistics: RuntimeStatistics
    models: dict[str, ScriptModel]
    specs: dict[str, Spec]
    min_output: int
    default_max_tokens: int


async def ask_into(answers: list[Result], ref: AgentRef, budget: Budget | None) -> None:
    answers.append(await ref.ask(f"{marker(ref.agent.name)} user task", budget=budget))


async def run_forest(
    forest: list[Spec],
    *,
    min_output: int,
    runtime_budget: Budget | None = None,
    agent_budgets: Mapping[str, Budget] | None = None,
    ask_budgets: Sequence[Budget | None] = (),
) -> Run:
    """Ask each top-level agent of ``forest`` its one task, concurrently, in one
    ``Runtime``; the tree and statistics are taken after its block."""
    models: dict[str, ScriptModel] = {}
    agents = [build(spec, models, agent_budgets or {}) for spec in forest]
    rt = Runtime(budget=runtime_budget, prices={MODEL: PRICE}, min_output_tokens=min_output)
    observer = Observer(rt.supervisor)
    results: list[list[Result]] = [[] for _ in agents]
    budgets = list(ask_budgets) or [None] * len(agents)
    with anyio.fail_after(RUN_TIMEOUT):
        async with rt:
            refs = [await rt.spawn(agent) for agent in agents]
            async with anyio.create_task_group() as tg:
                for answers, ref, budget in zip(results, refs, budgets, strict=True):
                    tg.start_soon(ask_into, answers, ref, budget)
    assert observer.problems == []
    return Run(
        tree=rt.tree(),
        results=results,
        stops=observer.stops,
        statistics=rt.statistics(),
        models=models,
        specs={spec.name: spec for top in forest for spec in top.walk()},
        min_output=min_output,
        default_max_tokens=rt.supervisor.default_max_tokens,
    )


# -- the checks ------------------------------------------------------------------------


def used(node: NodeSnapshot, limit: str) -> float:
    """What ``node`` used of the resource that the ``Budget`` field ``limit`` bounds."""
    usage = node.usage
    return {
        "tokens": usage.total_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "requests": usage.requests,
        "tool_calls": usage.tool_calls,
        "steps": node.steps,
        "cost": usage.cost,
    }[limit]


def settled(usage: Usage, limit: str) -> float:
    return {
        "tokens": usage.total_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost": usage.cost,
    }[limit]


def check_hard(tree: TreeSnapshot) -> None:
    """1. No node is over any of its limits, field by field."""
    for node in tree.nodes:
        limits = node.limits
        if limits is None:
            continue
        for limit in ("tokens", "input_tokens", "output_tokens", *COUNTER_LIMITS):
            allowed = getattr(limits, limit)
            assert allowed is None or used(node, limit) <= allowed, (node.id, limit, allowed)
        if limits.cost is not None:
            assert node.usage.cost <= limits.cost * (1 + 1e-9), (node.id, node.usage.cost)


def check_honest(run: Run) -> None:
    """2. Every stop for a limit was made when the node had no room left for it."""
    reasons = set()
    for stop in run.stops:
        error = stop.error
        if error is None:
            continue  # a cancellation, or a stop handed down to an abandoned subtree
        assert stop.status == "budget_exceeded"
        assert stop.reason == str(error)
        assert error.node_id == stop.node_id
        assert stop.limits is not None
        assert error.allowed == getattr(stop.limits, error.limit)
        reasons.add(stop.reason)
        event(f"stopped by the {error.limit} limit")
        if error.limit in TOKEN_LIMITS:
            check_refusal(run, stop, error)
        elif error.limit in ("steps", "requests", "tool_calls"):
            # A counter is refused only for the one that would go past it.
            count = stop.steps if error.limit == "steps" else getattr(stop.totals, error.limit)
            assert count >= error.allowed, (stop, count)
            assert (stop.request is not None) == (error.limit == "requests")
        else:
            pytest.fail(f"a stop for a limit no budget of this test has: {stop}")
    # Every node that ended over budget was stopped by one of those refusals.
    for node in run.tree.nodes:
        if node.status == "budget_exceeded":
            assert node.stop_reason in reasons, node


def check_refusal(run: Run, stop: Stop, error: BudgetExceeded) -> None:
    """A token or cost refusal: made at admission, against settled usage, for a
    request that needed at least its minimum."""
    limit = error.limit
    # Estimates are exact: nothing admitted can go past a limit afterwards.
    assert error.need is not None, f"stopped after the fact: {stop}"
    assert error.left is not None
    request = stop.request
    assert request is not None, stop
    assert stop.node_id in request.chain
    # What the request needed at least: its input estimate and a minimum output.
    spec = run.specs[request.name]
    wanted = spec.max_tokens if spec.max_tokens is not None else run.default_max_tokens
    assert request.wanted == wanted
    assert min(run.min_output, wanted) <= request.output <= wanted
    assert request.input > 0
    assert request.input in run.models[request.name].estimates
    # The node's totals are its settled usage: what settle() charged under it.
    spent = settled(stop.totals, limit)
    assert spent == pytest.approx(settled(stop.ledger, limit), rel=1e-9, abs=1e-12)
    if limit == "cost":
        assert error.need == pytest.approx(PRICE.cost(request.input, request.output))
        assert error.left == pytest.approx(error.allowed - spent, rel=1e-9, abs=1e-12)
        assert error.need > error.left + 1e-9 * error.allowed, stop
    else:
        need = {
            "tokens": request.input + request.output,
            "input_tokens": request.input,
            "output_tokens": request.output,
        }[limit]
        assert error.need == need
        assert error.left == error.allowed - spent
        assert error.need > error.left, stop


def check_pairs(messages: tuple[Message, ...]) -> None:
    """Every tool call of the request has exactly one result, after it."""
    open_calls: set[str] = set()
    answered: set[str] = set()
    for message in messages:
        if isinstance(message, AssistantMessage):
            assert not open_calls, open_calls
            open_calls = {c.id for c in message.tool_calls}
            assert len(open_calls) == len(message.tool_calls)
        elif isinstance(message, ToolResultMessage):
            assert message.call_id in open_calls
            assert message.call_id not in answered
            open_calls.discard(message.call_id)
            answered.add(message.call_id)
    assert not open_calls, open_calls


def check_answers(run: Run) -> None:
    """3. One ``Result`` per ask; every node ended; nothing waits or lives on."""
    for answers in run.results:
        assert len(answers) == 1
        (result,) = answers
        assert isinstance(result, Result)
        assert result.status in STATUSES
        assert result.text
        node = run.tree.node(result.execution_id)
        assert (node.status, node.stop_reason) == (result.status, result.stop_reason)
    for node in run.tree.nodes:
        assert node.id == "root" or node.status in STATUSES, node
    for model in run.models.values():
        for request in model.requests:
            check_pairs(request.messages)
    assert run.statistics.budget_waiting == 0
    assert run.statistics.live_actors == 0
    assert run.statistics.pending_asks == 0


# -- 1, 2, 3: random budgets -----------------------------------------------------------

LIMITS: dict[str, st.SearchStrategy[Any]] = {
    "tokens": st.integers(0, 10_000),
    "input_tokens": st.integers(0, 8_000),
    "output_tokens": st.integers(0, 1_500),
    "requests": st.integers(0, 50),
    "tool_calls": st.integers(0, 40),
    "steps": st.integers(0, 50),
    "cost": st.floats(0.05, 15.0),
}
#: Limits that requests reserve are drawn twice as often: they make requests wait.
LIMIT_NAMES = st.sampled_from(sorted([*LIMITS, *TOKEN_LIMITS]))


@st.composite
def budgets(draw: st.DrawFn, chance: int) -> Budget | None:
    """A budget one time in ``chance``, with one to three random limits."""
    if draw(st.integers(1, chance)) > 1:
        return None
    names = draw(st.sets(LIMIT_NAMES, min_size=1, max_size=3))
    return Budget(**{name: draw(LIMITS[name]) for name in sorted(names)})


@dataclass(frozen=True)
class Scenario:
    forest: list[Spec]
    min_output: int
    runtime_budget: Budget | None
    agent_budgets: dict[str, Budget]
    ask_budgets: list[Budget | None]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    min_output = draw(st.integers(16, 64))
    # Up to twice the minimum: some replies are cut where the budget's sharing caps them.
    forest = draw(forests(st.integers(1, 2 * min_output)))
    agent_budgets = {}
    for spec in (spec for top in forest for spec in top.walk()):
        budget = draw(budgets(3))
        if budget is not None:
            agent_budgets[spec.name] = budget
    return Scenario(
        forest=forest,
        min_output=min_output,
        runtime_budget=draw(budgets(2)),
        agent_budgets=agent_budgets,
        ask_budgets=[draw(budgets(3)) for _ in forest],
    )


@settings(max_examples=40, deadline=None, suppress_health_check=SUPPRESSED)
@given(scenario=scenarios())
async def test_budgets_are_hard_and_honest(scenario: Scenario) -> None:
    run = await run_forest(
        scenario.forest,
        min_output=scenario.min_output,
        runtime_budget=scenario.runtime_budget,
        agent_budgets=scenario.agent_budgets,
        ask_budgets=scenario.ask_budgets,
    )
    assert run.tree.node("root").limits == scenario.runtime_budget
    check_hard(run.tree)
    check_honest(run)
    check_answers(run)
    if run.statistics.budget_waits:
        event("a request waited for headroom")


# -- 4: a tree whose usage fits its budget completes -------------------------------------

FITTING_LIMITS = (*TOKEN_LIMITS, *COUNTER_LIMITS)


def fitting(node: NodeSnapshot, limits: Sequence[str], slack: float, min_output: int) -> Budget:
    """A budget over ``limits`` that holds ``node``'s usage (times ``1 + slack``) plus
    one request's minimum output."""
    room = {name: math.floor(used(node, name) * (1 + slack)) for name in FITTING_LIMITS}
    room["tokens"] += min_output
    room["output_tokens"] += min_output
    cost = node.usage.cost * (1 + slack) + PRICE.cost(0, min_output)
    values: dict[str, Any] = {name: cost if name == "cost" else room[name] for name in limits}
    return Budget(**values)


def demand(tree: TreeSnapshot) -> list[tuple[object, ...]]:
    """Every execution's name, depth, usage and steps, in a stable order."""
    return sorted(
        (node.name, node.depth, *(used(node, name) for name in FITTING_LIMITS if name != "cost"))
        for node in tree.nodes
        if node.id != "root"
    )


@dataclass(frozen=True)
class Fitting:
    forest: list[Spec]
    min_output: int
    limits: list[str]
    slack: float
    on_agents: bool
    on_asks: bool


@st.composite
def fitting_scenarios(draw: st.DrawFn) -> Fitting:
    min_output = draw(st.integers(16, 64))
    return Fitting(
        # No reply is longer than the minimum: none is cut by the budget's sharing.
        forest=draw(forests(st.integers(1, min_output))),
        min_output=min_output,
        limits=sorted(draw(st.sets(st.sampled_from(FITTING_LIMITS), min_size=1))),
        slack=draw(st.sampled_from([0.0, 0.0, 0.1, 0.5])),
        on_agents=draw(st.booleans()),
        on_asks=draw(st.booleans()),
    )


@settings(max_examples=30, deadline=None, suppress_health_check=SUPPRESSED)
@given(scenario=fitting_scenarios())
async def test_a_tree_whose_usage_fits_its_budget_completes(scenario: Fitting) -> None:
    """A budget that holds a tree's real usage plus one request's minimum output
    never stops it, and it uses exactly what it uses without budgets.

    Why that bound is enough: a request is refused only when the settled usage of a
    node plus the request's minimum (its input estimate, exact here, plus at most
    ``min_output_tokens``) goes past a limit. Run under budgets, the tree sends the
    very requests it sends without (each answers from its own request only, and no
    reply is longer than the minimum, so none is cut by the budget's sharing), so
    whenever one is admitted, what has settled plus the request's own usage is part
    of the tree's demand D: settled + input <= D - output, and settled + input +
    minimum <= D + min_output_tokens. Likewise for output tokens and cost (the
    minimum output at its price); input tokens, requests, tool calls and steps need
    no more than D. Headroom held by requests in flight only makes a request wait,
    and each of those settles. The same holds for an agent's budget against the
    largest demand of one of its executions, and for a top-level ask's budget.
    """
    forest, min_output = scenario.forest, scenario.min_output
    free = await run_forest(forest, min_output=min_output)
    assert {node.status for node in free.tree.nodes if node.id != "root"} == {"completed"}
    assert free.stops == []

    def holding(node: NodeSnapshot) -> Budget:
        return fitting(node, scenario.limits, scenario.slack, min_output)

    agent_budgets: dict[str, Budget] = {}
    if scenario.on_agents:
        # Each execution of an agent fits the budget that holds its largest one.
        for spec in (spec for top in forest for spec in top.walk()):
            held = [holding(node) for node in free.tree.nodes if node.name == spec.name]
            if not held:
                continue  # offered, never called
            agent_budgets[spec.name] = Budget(
                **{name: max(getattr(budget, name) for budget in held) for name in scenario.limits}
            )
    tops = [free.tree.node(answers[0].execution_id) for answers in free.results]
    bounded = await run_forest(
        forest,
        min_output=min_output,
        runtime_budget=holding(free.tree.node("root")),
        agent_budgets=agent_budgets,
        ask_budgets=[holding(top) if scenario.on_asks else None for top in tops],
    )
    check_hard(bounded.tree)
    check_answers(bounded)
    assert bounded.stops == []
    assert {node.status for node in bounded.tree.nodes if node.id != "root"} == {"completed"}
    assert demand(bounded.tree) == demand(free.tree)
    root, free_root = bounded.tree.node("root"), free.tree.node("root")
    assert root.usage.cost == pytest.approx(free_root.usage.cost, rel=1e-9)
    if bounded.statistics.budget_waits:
        event("a request waited for headroom")
