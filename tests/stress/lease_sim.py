"""Ledger round trips, overshoot and cancellation on many in-process hosts (issue 28).

A lead hands one task to each of M workers at once; the workers are placed over N
in-process hosts (``LocalHosts(N)``, round-robin), each with a runtime of its own
whose subtrees run under a lease of the driver's ledger. A worker looks its task up
twice, then answers: 3 requests and 2 tool calls. The tree runs under three budget
regimes, each on the lead:

- ``none``: no budget (the runtime's default caps only: ``Caps(agents=10_000)``
  still makes ``agents`` a leased field);
- ``generous``: 10 x the demand measured by the ``none`` run, on every field it
  measures (tokens, input and output tokens, cost, requests, tool calls, steps, agents);
- ``scarce``: 60% of that demand, on the same fields.

For each it counts the **ledger round trips** (asks from a lease on a host to the
driver's ledger: ``Ledger.asks``, every ask answered, granted or refused;
``Ledger.refusals`` the refused ones, ``Ledger.waits`` those that waited), per
1,000 operations (requests + tool calls spent by the tree); the
**overshoot** (spent minus limit, on every budgeted field: 0 means none); whether
every worker call was answered; and, in a second run of the same tree whose lookups
are slow, the time from a cancellation of the lead until its ask answers, every
worker reached (``cancelled``, or ended before by its budget).

The lead calls its workers 100 at a time (one turn of a thousand calls outgrows the
default ``max_tokens``); in the cancellation run it calls them all in one turn
(``max_tokens`` and ``tool_concurrency`` sized for it), so that every worker runs
when it is cancelled.

Run ``python -m tests.stress.lease_sim --hosts 100 --agents 1000 --backend asyncio``
(``--help`` for the options). On the 2-core machine it was written on, 100 hosts x
1,000 agents takes 4-6 s for the three regimes with their cancellations, on asyncio
or trio; 200 x 2,000 about 9 s; 400 x 4,000 about 28 s (it did not end within 5
minutes while each subtree had a lease of its own). The short version in the suite,
4 x 40, takes ~3 s per backend.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass, field
from typing import Any

import anyio

from fractor.actors import (
    Agent,
    FunctionModel,
    LocalHosts,
    ModelRequest,
    ScriptedModel,
    UserMessage,
    call,
    calls,
    reply,
    tool,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Budget, Price, Runtime, TreeSnapshot

__all__ = ["REGIMES", "Outcome", "main", "simulate", "table"]

#: The model's name, priced so that cost is a budgeted field too.
MODEL = "sim"
PRICE = Price(input_per_million=1_000, output_per_million=4_000)
#: The least output a request reserves: replies here are ~25 tokens, so the default
#: (256) would make a budget of 10 x their output hold only a few requests at once
#: (they would wait for each other at home too): the simulation measures leases.
MIN_OUTPUT = 16
#: Lookups per worker before it answers (requests per worker: one more).
LOOKUPS = 2
#: Worker calls per turn of the lead.
BATCH = 100
#: The budget regimes: a factor of the measured demand (None: no budget).
REGIMES: dict[str, float | None] = {"none": None, "generous": 10.0, "scarce": 0.6}

#: How many slow lookups started; whether they are still slow.
_STATE = {"started": 0, "slow": True}


@tool
async def lookup(topic: str) -> str:
    """Look a topic up ("slow ..." topics wait until the simulation ends them)."""
    if topic.startswith("slow"):
        _STATE["started"] += 1
        while _STATE["slow"]:  # noqa: ASYNC110 (the simulation ends it: no event)
            await anyio.sleep(0.01)
    return f"notes on {topic}"


def _task(request: ModelRequest) -> str:
    for message in request.messages:
        if isinstance(message, UserMessage):
            return str(message.content)
    return ""


async def _work(request: ModelRequest) -> Turn:
    asked = sum(bool(getattr(m, "tool_calls", None)) for m in request.messages)
    if asked < LOOKUPS:
        return call("lookup", topic=_task(request))
    return reply(f"found {_task(request)}")


def _tree(agents: int, budget: Budget | None, prefix: str, batch: int = 0) -> Agent:
    """The lead calls its workers ``batch`` at a time (a turn of a thousand calls
    outgrows the default ``max_tokens``); ``batch=0``: all in one turn, the lead's
    ``max_tokens`` and ``tool_concurrency`` sized for it."""
    worker = Agent("worker", FunctionModel(_work, name=MODEL), tools=[lookup])
    size = batch or agents
    script = [
        calls(
            *(call("worker", task=f"{prefix} {i}") for i in range(start, min(start + size, agents)))
        )
        for start in range(0, agents, size)
    ]
    script.append(reply("All done."))
    options: dict[str, Any] = {}
    if not batch:
        options = {"max_tokens": 16 * agents + 256, "tool_concurrency": max(agents, 1)}
    return Agent(
        "lead", ScriptedModel(script, name=MODEL), subagents=[worker], budget=budget, **options
    )


@dataclass
class Outcome:
    """What one regime measured."""

    regime: str
    budget: Budget | None
    status: str
    seconds: float
    operations: int
    asks: int  # every ask answered by the ledger (round trips): ``Ledger.asks``
    refused: int  # ``Ledger.refusals``
    waits: int  # ``Ledger.waits``
    issued: int  # worker calls the lead made
    answered: int  # worker calls with an outcome
    workers: int  # worker executions opened
    overshoot: dict[str, float] = field(default_factory=dict)
    cancel_seconds: float = 0.0
    cancel_reached: int = 0
    cancel_workers: int = 0
    spent: dict[str, float] = field(default_factory=dict)

    @property
    def per_1000(self) -> float:
        return 1000 * self.asks / max(self.operations, 1)


def _spent(snapshot: TreeSnapshot, execution_id: str) -> dict[str, float]:
    node = snapshot.node(execution_id)
    usage = node.usage
    return {
        "tokens": usage.total_tokens,
        "input_tokens": usage.input_tokens,
        "output_tokens": usage.output_tokens,
        "cost": usage.cost,
        "requests": usage.requests,
        "tool_calls": usage.tool_calls,
        "steps": node.steps,
        "agents": node.agents,
    }


def _budget(demand: dict[str, float], factor: float) -> Budget:
    def whole(name: str) -> int:
        return max(int(demand[name] * factor), 1)

    return Budget(
        tokens=whole("tokens"),
        input_tokens=whole("input_tokens"),
        output_tokens=whole("output_tokens"),
        cost=demand["cost"] * factor if demand["cost"] else None,
        requests=whole("requests"),
        tool_calls=whole("tool_calls"),
        steps=whole("steps"),
        agents=whole("agents"),
    )


async def _run(hosts: int, agents: int, budget: Budget | None, regime: str) -> Outcome:
    async with Runtime(
        hosts=LocalHosts(hosts), prices={MODEL: PRICE}, min_output_tokens=MIN_OUTPUT
    ) as rt:
        ledger = rt.supervisor.ledger
        ref = await rt.spawn(_tree(agents, budget, "topic", BATCH))
        began = time.perf_counter()
        result = await ref.ask("Research every topic.")
        seconds = time.perf_counter() - began
        snapshot = rt.tree()
        trace = await ref.trace()
        spent = _spent(snapshot, result.execution_id)
    steps = trace[-1].steps
    issued = sum(len(step.tool_calls) for step in steps)
    answered = sum(len(step.outcomes) for step in steps)
    overshoot = {}
    if budget is not None:
        for name, used in spent.items():
            limit = getattr(budget, name)
            if limit is not None:
                overshoot[name] = max(used - limit, 0)
    return Outcome(
        regime=regime,
        budget=budget,
        status=result.status,
        seconds=seconds,
        operations=int(spent["requests"] + spent["tool_calls"]),
        asks=ledger.asks,
        refused=ledger.refusals,
        waits=ledger.waits,
        issued=issued,
        answered=answered,
        workers=sum(n.name == "worker" for n in snapshot.nodes),
        overshoot=overshoot,
        spent=spent,
    )


async def _cancel(hosts: int, agents: int, budget: Budget | None, outcome: Outcome) -> None:
    """Run the tree with slow lookups, cancel the lead once the lookups that will
    start have started, and time until its ask answers."""
    _STATE["started"], _STATE["slow"] = 0, True
    results = []
    async with Runtime(
        hosts=LocalHosts(hosts), prices={MODEL: PRICE}, min_output_tokens=MIN_OUTPUT
    ) as rt:
        ref = await rt.spawn(_tree(agents, budget, "slow"))
        async with anyio.create_task_group() as tg:

            async def ask() -> None:
                results.append(await ref.ask("Research every topic."))

            tg.start_soon(ask)
            # Settled: lookups started and none more for a while (a scarce budget
            # stops some workers before theirs).
            last, still = -1, 0.0
            while _STATE["started"] < agents and still < 1.0:
                await anyio.sleep(0.05)
                now = _STATE["started"]
                still = still + 0.05 if now == last else 0.0
                last = now
            lead = next(n for n in rt.tree().nodes if n.name == "lead")
            began = time.perf_counter()
            cancelled = lead.status == "running"
            if cancelled:  # (a scarce budget may have stopped it already)
                rt.supervisor.cancel(lead.id)
        outcome.cancel_seconds = time.perf_counter() - began if cancelled else math.nan
        _STATE["slow"] = False
        workers = [n for n in rt.tree().nodes if n.name == "worker"]
    assert results
    if cancelled:
        assert results[0].status == "cancelled", results[0].stop_reason
    outcome.cancel_workers = len(workers)
    outcome.cancel_reached = sum(n.status in ("cancelled", "budget_exceeded") for n in workers)


async def simulate(
    hosts: int, agents: int, regimes: tuple[str, ...] = tuple(REGIMES), cancel: bool = True
) -> list[Outcome]:
    """Measure each regime (the demand comes from the ``none`` run, always first)."""
    outcomes = []
    none = await _run(hosts, agents, None, "none")
    demand = none.spent
    for regime in regimes:
        factor = REGIMES[regime]
        if factor is None:
            outcome = none
        else:
            outcome = await _run(hosts, agents, _budget(demand, factor), regime)
        if cancel:
            await _cancel(hosts, agents, outcome.budget, outcome)
        outcomes.append(outcome)
    return outcomes


def table(outcomes: list[Outcome], hosts: int, agents: int) -> str:
    """The outcomes as a text table."""
    head = (
        f"{'regime':<9} {'status':<16} {'ops':>7} {'asks':>7} {'refused':>7} {'waits':>6} "
        f"{'asks/1k ops':>11} {'answered':>9} {'overshoot':>9} {'run s':>7} "
        f"{'cancel s':>8} {'reached':>9}"
    )
    lines = [f"{hosts} hosts x {agents} agents ({LOOKUPS + 1} requests, {LOOKUPS} tool calls each)"]
    lines += [head, "-" * len(head)]
    for o in outcomes:
        over = max(o.overshoot.values(), default=0)
        lines.append(
            f"{o.regime:<9} {o.status:<16} {o.operations:>7} {o.asks:>7} {o.refused:>7} "
            f"{o.waits:>6} {o.per_1000:>11.1f} {o.answered:>4}/{o.issued:<4} {over:>9g} "
            f"{o.seconds:>7.2f} {o.cancel_seconds:>8.3f} "
            f"{o.cancel_reached:>4}/{o.cancel_workers:<4}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m tests.stress.lease_sim",
        description="Ledger round trips, overshoot and cancellation of M agents on N "
        "in-process hosts, under no budget, a generous one (10 x demand) and a scarce "
        "one (60%% of demand).",
    )
    parser.add_argument("--hosts", type=int, default=10, help="in-process hosts (10)")
    parser.add_argument("--agents", type=int, default=100, help="workers of the lead (100)")
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    parser.add_argument("--no-cancel", action="store_true", help="skip the cancellation runs")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    outcomes = anyio.run(
        lambda: simulate(args.hosts, args.agents, cancel=not args.no_cancel),
        backend=args.backend,
    )
    print(table(outcomes, args.hosts, args.agents))
    print(f"total {time.perf_counter() - began:.1f} s on {args.backend}")


if __name__ == "__main__":
    main()
