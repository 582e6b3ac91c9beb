"""Budgets across hosts are honest, over random trees (issue 28, "Must show").

Each example draws a tree: a lead on the driver that asks K workers (2 to 12) at once,
placed on 2 to 4 hosts (``LocalHosts`` and ``RayHosts`` through ``make_hosts``); a
worker makes 0 to 3 lookups (one a step), may first ask a helper of its own (depth 3,
on the worker's host, one lookup), and replies with 2 to 900 output tokens (some long,
so that a reply cut by a ``max_tokens`` smaller than it shows). The models are
``FunctionModel``s of their own request only (``lease_trees.py``): usage is estimated
from the text, exactly (the input estimate is the input), and a reply cut at
``max_tokens`` comes back with ``finish_reason="length"`` and is asked again when the
budget's sharing cut it. Every model has a price, so cost is a real field.

The tree is run first with no budget: its usage is its *demand*. Then, for a budget
field (tokens, output tokens, cost, requests, tool calls) placed on the lead
(``Agent(budget=...)``) or on the ``Runtime``:

1. **Generous**: a limit of 1.1 x the demand on that field completes, and what the
   tree spent is its demand exactly, on every field: requests, input and output
   tokens, tool calls, and cost up to float rounding. "Within one request's estimate
   error" (the issue's words) is read as exact equality: the fakes' estimates are
   exact, so no request's estimate errs; a request more than the demand is a reply
   cut by the budget's sharing (on a host, at what is left of its subtree's lease;
   here, at a fair share of the free headroom) and asked again, which is the
   dishonesty this test is about.
   Output tokens and cost (``SHARED``) are held to zero overshoot only: the
   admission shares their headroom among the requests in flight as output caps (a
   fair share each), so under a limit a tenth above the demand a long reply is cut
   and asked again at home too, as the timing of the requests in flight decides
   (measured: 12 workers, 4,453 output tokens, a limit of 4,898 stops after 45 of 52
   requests). With ``Runtime(output_sharing="whole")`` (a request reserves all it
   wants or waits for requests in flight, here and through its lease on hosts), no
   reply is cut by sharing, and 1.1 x the demand of these two fields completes
   exactly too, at home and on hosts (``test_whole_output_sharing_...``).
   A token limit is shared the same way; it is held to exactness here because with
   these models (which answer at once) the requests a tree sends overlap little, and
   at home not at all where it matters. Models that take time overlap them as timing
   decides, and then fair sharing cuts long replies at home as on hosts: random trees
   whose model calls take up to 3 ms, tokens at 1.1 x the demand, 200 trees (400
   runs, lead and runtime) spent more than the demand on 71 trees at home and 37 on
   ``LocalHosts``; at 1.5 x, 15 and 10 of 300. With models that answer at once,
   none at home and about 1 in 200 on hosts, whose messages let requests overlap
   that at home run one after the other: the examples drawn here are not such trees
   (issue 28's notes, session 14). Whole sharing spends the demand exactly whatever
   the timing, at home and on both kinds of hosts
   (``test_with_models_that_take_time_...``).
   The runtimes run with ``min_output_tokens=16``, and a generous token (cost) limit
   is at least the demand plus 16 output tokens (their cost): a request is admitted
   only if its minimum output fits, so the lead's last request (a 3-token reply)
   needs that much room whatever its real reply. With the default minimum of 256, a
   tenth of a demand below 2,560 output tokens cannot hold it, and the tree stops
   (by the admission's rule, without hosts too: measured on the simplest tree, two
   600-token workers, "output_tokens limit of 1,339 reached: the next request needs
   about 256, 124 left").
2. **Scarce**: a limit of 30 to 90% of the demand on that field stops the tree
   (``budget_exceeded``, the stop reason naming that field's limit; it cannot complete
   on less than its demand without accepting a cut reply) with zero overshoot (spent
   <= limit, read from the budget's node in ``rt.tree()``: the lead's or the runtime's
   root, and from ``result.usage``), and it spends nearly all of it: spent >= limit -
   slack, with slack = 1.5 x the largest single request of the demand run (its total
   tokens for ``tokens``, its output tokens for ``output_tokens``, its cost for
   ``cost``) + 300 tokens (at the output price, for cost). For the counters
   (requests, tool calls) the reading is slack = 2: a request or a tool call is
   refused only when it would pass the limit, so the tree stops within the last
   one or two of them, not at a lease's end.

Why the lower bound holds for an honest ledger: a token or cost request is refused
only when the budget's settled usage plus the request's minimum (its input plus
``min_output_tokens``) passes the limit, so when the tree stops, spent > limit -
(largest input + 16). A lease on a host that refuses while the driver's budget has
room would stop the tree below it.

``test_budgets_on_hosts_...`` runs one drawn case of each kind per tree on both
kinds of hosts (Ray hosts take a second or more to start, so few trees: a wide one
on four hosts given, two drawn);
``test_every_budget_on_local_hosts_...`` runs every field on both places, generous and
scarce, over more trees on ``LocalHosts``; ``test_..._without_hosts`` is the control:
the same generous cases with no hosts at all (no lease: the reference the shared
fields are held to).
Every check of an example is gathered before the one assertion, so a failure shows
every broken property of that example with its numbers.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st

from fractor.actors import LocalHosts, RemoteHosts, Result, collect_trace_tree
from fractor.runtime import Budget, MemoryStore, OutputSharing, Runtime, TreeSnapshot, Usage

from .conftest import MakeHosts
from .lease_trees import MODEL, PRICE, Plan, lead, plan

FIELDS = ("tokens", "output_tokens", "cost", "requests", "tool_calls")
PLACES = ("lead", "runtime")
#: Seconds one runtime may take (Ray hosts start in it), hangs included.
RUN_TIMEOUT = 60
#: The runtimes' ``min_output_tokens`` (the default, 256, is more than a tenth of the
#: demand of most trees: see the module's docstring).
MIN_OUTPUT = 16
#: Extra tokens the scarce bound allows beyond 1.5 x the largest request.
SLACK_TOKENS = 300
#: Extra requests or tool calls the scarce bound allows.
SLACK_COUNT = 2
SUPPRESSED = [HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large]
#: Few seeded examples, no shrinking (each example runs whole trees for real).
QUICK = settings(
    deadline=None,
    derandomize=True,
    database=None,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=SUPPRESSED,
)
#: The tests that run on Ray too (``make_hosts``) run their fixed trees (``@example``)
#: in the suite; ``make stress`` (``FRACTOR_STRESS=1``) draws random trees beside
#: them. Each run of a tree starts its hosts (a Ray actor each: about a second), and
#: random trees on LocalHosts and without hosts are drawn by the tests below anyway.
ON_HOSTS = settings(
    QUICK,
    phases=[Phase.explicit, Phase.generate]
    if os.environ.get("FRACTOR_STRESS")
    else [Phase.explicit],
)


# -- random trees ------------------------------------------------------------------------


@dataclass(frozen=True)
class Tree:
    hosts: int
    plans: tuple[Plan, ...]

    def __repr__(self) -> str:
        return f"Tree(hosts={self.hosts}, workers=[{', '.join(p.task() for p in self.plans)}])"


@st.composite
def plans(draw: st.DrawFn, name: str, delay: int = 0) -> Plan:
    return Plan(
        name=name,
        steps=draw(st.integers(0, 3)),
        # Long replies first: the simplest example hypothesis draws has them.
        reply=draw(st.sampled_from([600, 900, 300, 60, 15, 2])),
        helper=draw(st.one_of(st.none(), st.sampled_from([400, 150, 10]))),
        delay=delay,
    )


@st.composite
def trees(draw: st.DrawFn, delay: int = 0) -> Tree:
    """A tree of 2 to 12 workers on 2 to 4 hosts; with ``delay``, its model calls
    take up to that many ms each."""
    count = draw(st.integers(2, 12))
    return Tree(
        hosts=draw(st.integers(2, 4)),
        plans=tuple(draw(plans(f"w{index}", delay)) for index in range(count)),
    )


@dataclass(frozen=True)
class Case:
    """One budget: its field, where it is placed, and (scarce) the share of demand."""

    field: str
    place: str
    percent: int = 110


def cases(percents: st.SearchStrategy[int]) -> st.SearchStrategy[Case]:
    return st.builds(Case, st.sampled_from(FIELDS), st.sampled_from(PLACES), percents)


GENEROUS = cases(st.just(110))
SCARCE = cases(st.integers(30, 90))


# -- running a tree ------------------------------------------------------------------------

Hosts = Callable[[int], RemoteHosts] | None


@dataclass(frozen=True)
class Run:
    result: Result
    tree: TreeSnapshot
    #: What the budget's node spent: the lead's, or the runtime's root's.
    spent: Usage


async def run(
    tree: Tree,
    hosts: Hosts,
    *,
    place: str = "lead",
    budget: Budget | None = None,
    store: MemoryStore | None = None,
    sharing: OutputSharing = "fair",
) -> Run:
    """Ask the tree's lead "go" in a runtime of its own, the budget on ``place``."""
    with anyio.fail_after(RUN_TIMEOUT):
        async with Runtime(
            hosts=hosts(tree.hosts) if hosts is not None else None,
            prices={MODEL: PRICE},
            min_output_tokens=MIN_OUTPUT,
            budget=budget if place == "runtime" else None,
            store=store,
            output_sharing=sharing,
        ) as rt:
            ref = await rt.spawn(lead(list(tree.plans), budget if place == "lead" else None))
            result = await ref.ask("go")
            snapshot = rt.tree()
    node = snapshot.node(result.execution_id if place == "lead" else "root")
    return Run(result, snapshot, node.usage)


@dataclass(frozen=True)
class Demand:
    usage: Usage
    #: The largest single request of the run, field by field.
    largest: dict[str, float]


async def demand(tree: Tree, hosts: Hosts) -> Demand:
    """The tree's usage with no budget, and its largest request (from the traces,
    remote ones included: one step is one request when nothing is cut)."""
    store = MemoryStore()
    free = await run(tree, hosts, store=store)
    assert free.result.status == "completed", free.result.stop_reason
    if hosts is not None:  # the workers ran on every host, each helper beside its worker
        on = {node.id: node.host for node in free.tree.nodes}
        workers = [node for node in free.tree.nodes if node.name == "worker"]
        assert all(on[node.id] for node in workers)
        assert len(set(on.values()) - {""}) == min(tree.hosts, len(tree.plans))
        helpers = [node for node in free.tree.nodes if node.name == "helper"]
        assert all(on[node.id] == on[node.parent_id or ""] for node in helpers)
    steps = [
        step.usage
        for trace in await collect_trace_tree(store, free.result.execution_id)
        for step in trace.steps
    ]
    assert sum(step.requests for step in steps) == free.result.usage.requests
    largest = {
        "tokens": max(step.total_tokens for step in steps),
        "output_tokens": max(step.output_tokens for step in steps),
        "cost": max(step.cost for step in steps),
    }
    return Demand(free.result.usage, largest)


def spent_on(usage: Usage, field: str) -> float:
    return {
        "tokens": usage.total_tokens,
        "output_tokens": usage.output_tokens,
        "cost": usage.cost,
        "requests": usage.requests,
        "tool_calls": usage.tool_calls,
    }[field]


#: Fields whose headroom the admission shares among the requests in flight, as
#: output caps: under a tight limit a reply longer than its share is cut and asked
#: again, spending more than the demand, with or without hosts.
SHARED = ("output_tokens", "cost")


def limit_of(need: Demand, case: Case) -> float:
    """``case.percent`` % of the demand on its field (whole for a count); a generous
    one holds at least the demand and one request's minimum output more."""
    field = case.field
    wanted = spent_on(need.usage, field) * case.percent / 100
    if case.percent > 100 and field in ("tokens", "output_tokens"):
        wanted = max(wanted, spent_on(need.usage, field) + MIN_OUTPUT)
    elif case.percent > 100 and field == "cost":
        wanted = max(wanted, need.usage.cost + PRICE.cost(0, MIN_OUTPUT))
    return wanted if field == "cost" else math.floor(wanted)


def budget_of(field: str, limit: float) -> Budget:
    values: dict[str, Any] = {field: limit if field == "cost" else int(limit)}
    return Budget(**values)


def shown(usage: Usage) -> str:
    return (
        f"requests={usage.requests} tokens={usage.total_tokens} "
        f"(in {usage.input_tokens}, out {usage.output_tokens}) "
        f"tool_calls={usage.tool_calls} cost={usage.cost:.6f}"
    )


# -- the checks --------------------------------------------------------------------------


def exact(run: Run, need: Demand) -> bool:
    """Whether ``run`` completed spending exactly the demand."""
    counts = ("requests", "input_tokens", "output_tokens", "tool_calls")
    spent, wanted = run.spent, need.usage
    return (
        run.result.status == "completed"
        and [getattr(spent, c) for c in counts] == [getattr(wanted, c) for c in counts]
        and spent.cost == pytest.approx(wanted.cost, rel=1e-9)
    )


async def generous(
    tree: Tree, hosts: Hosts, need: Demand, case: Case, sharing: OutputSharing = "fair"
) -> list[str]:
    """1. A budget of 1.1 x the demand completes, spending exactly the demand (on a
    field the admission shares among requests in flight, ``SHARED``: whenever it
    does so without hosts)."""
    limit = limit_of(need, case)
    budget = budget_of(case.field, limit)
    where = f"generous {case.field}={limit:g} on the {case.place}"
    problems = []
    bound = case.field not in SHARED or sharing == "whole"
    done = await run(tree, hosts, place=case.place, budget=budget, sharing=sharing)
    over = limit * (1 + 1e-9) if case.field == "cost" else limit
    if spent_on(done.spent, case.field) > over:
        problems.append(f"{where}: overshoot, spent {shown(done.spent)}")
    if bound and done.result.status != "completed":
        problems.append(f"{where}: {done.result.status}: {done.result.stop_reason}")
    spent, wanted = done.spent, need.usage
    if bound and not exact(done, need):
        problems.append(f"{where}: spent {shown(spent)}; demand {shown(wanted)}")
    if done.result.usage != done.tree.node(done.result.execution_id).usage:
        problems.append(f"{where}: result.usage {done.result.usage} is not the lead's usage")
    return problems


async def scarce(tree: Tree, hosts: Hosts, need: Demand, case: Case) -> list[str]:
    """2. A budget below the demand stops the tree with zero overshoot, having spent
    all of it but the last request's worth (slack: see the module's docstring)."""
    field = case.field
    limit = limit_of(need, case)
    done = await run(tree, hosts, place=case.place, budget=budget_of(field, limit))
    if field in ("requests", "tool_calls"):
        slack: float = SLACK_COUNT
    elif field == "cost":
        slack = 1.5 * need.largest["cost"] + PRICE.cost(0, SLACK_TOKENS)
    else:
        slack = 1.5 * need.largest[field] + SLACK_TOKENS
    where = f"scarce {field}={limit:g} ({case.percent}% of demand) on the {case.place}"
    problems = []
    over = limit * (1 + 1e-9) if field == "cost" else limit
    for source, usage in (("tree", done.spent), ("result", done.result.usage)):
        if spent_on(usage, field) > over:
            problems.append(f"{where}: overshoot, {source} spent {shown(usage)}")
    spent = spent_on(done.spent, field)
    if spent < limit - slack:
        problems.append(
            f"{where}: stopped early, spent {spent:g} < limit - slack = {limit - slack:g} "
            f"(slack {slack:g}); spent {shown(done.spent)}; demand {shown(need.usage)}"
        )
    reason = done.result.stop_reason
    if done.result.status != "budget_exceeded" or not reason.startswith(f"{field} limit of"):
        problems.append(f"{where}: {done.result.status}: {reason!r}; spent {shown(done.spent)}")
    return problems


async def check(
    tree: Tree, hosts: Hosts, generous_cases: list[Case], scarce_cases: list[Case]
) -> None:
    need = await demand(tree, hosts)
    problems = []
    for case in generous_cases:
        problems += await generous(tree, hosts, need, case)
    for case in scarce_cases:
        if spent_on(need.usage, case.field) > 0:  # else no limit is below the demand
            problems += await scarce(tree, hosts, need, case)
    assert not problems, "\n".join([f"{tree!r}: demand {shown(need.usage)}", *problems])


# -- the tests -----------------------------------------------------------------------------


#: A wide tree on four hosts, every kind of worker in it (the two examples hypothesis
#: draws first are small trees on two hosts).
WIDE = Tree(
    hosts=4,
    plans=tuple(
        plan(task)
        for task in (
            "w0 s0 r600 h-",
            "w1 s1 r900 h150",
            "w2 s3 r15 h400",
            "w3 s2 r300 h-",
            "w4 s0 r2 h10",
            "w5 s1 r600 h400",
            "w6 s3 r60 h-",
            "w7 s0 r900 h-",
            "w8 s2 r300 h150",
        )
    ),
)


#: The wide tree as the suite runs it on Ray: every kind of worker on two hosts (each
#: run of a tree starts its hosts, Ray actors); on four under ``make stress``.
ON_RAY = WIDE if os.environ.get("FRACTOR_STRESS") else replace(WIDE, hosts=2)


# (A generous budget and a scarce one, each a test of its own: together, three runs
# of the tree on its hosts took 10-12 s of the suite's time.)


@example(tree=ON_RAY, honest=Case("output_tokens", "runtime"))
@settings(ON_HOSTS, max_examples=1)
@given(tree=trees(), honest=GENEROUS)
async def test_generous_budgets_on_hosts_spend_the_demand(
    make_hosts: MakeHosts, tree: Tree, honest: Case
) -> None:
    await check(tree, make_hosts, [honest], [])


@example(tree=ON_RAY, short=Case("cost", "lead", 50))
@settings(ON_HOSTS, max_examples=1)
@given(tree=trees(), short=SCARCE)
async def test_scarce_budgets_on_hosts_spend_nearly_all_of_the_limit(
    make_hosts: MakeHosts, tree: Tree, short: Case
) -> None:
    await check(tree, make_hosts, [], [short])


EVERY_CASE = [Case(field, place) for field in FIELDS for place in PLACES]


@settings(QUICK, max_examples=6)
@given(tree=trees(), percent=st.integers(30, 90))
async def test_every_budget_on_local_hosts_spends_the_demand_or_nearly_all_of_the_limit(
    tree: Tree, percent: int
) -> None:
    short = [Case(case.field, case.place, percent) for case in EVERY_CASE]
    await check(tree, LocalHosts, EVERY_CASE, short)


@settings(QUICK, max_examples=6)
@given(tree=trees())
async def test_a_generous_budget_without_hosts_spends_the_demand(tree: Tree) -> None:
    await check(tree, None, EVERY_CASE, [])


#: The fields whose headroom caps a request's output.
CAPPING = ("tokens", *SHARED)


@example(tree=ON_RAY, field="output_tokens", place="runtime")
@settings(ON_HOSTS, max_examples=1)
@given(tree=trees(), field=st.sampled_from(CAPPING), place=st.sampled_from(PLACES))
async def test_whole_output_sharing_spends_the_demand_of_output_and_cost_limits(
    make_hosts: MakeHosts, tree: Tree, field: str, place: str
) -> None:
    # With Runtime(output_sharing="whole") a request reserves all it wants or waits
    # for requests in flight (here and, through its lease, on hosts): no reply is cut
    # by sharing, so 1.1 x the demand of tokens, output tokens or cost completes
    # exactly, at home and on hosts.
    need = await demand(tree, make_hosts)
    case = Case(field, place)
    problems = await generous(tree, None, need, case, "whole")
    problems += await generous(tree, make_hosts, need, case, "whole")
    assert not problems, "\n".join([f"{tree!r}: demand {shown(need.usage)}", *problems])


#: ``WIDE`` with models that take up to 3 ms a call.
WIDE_TIMED = Tree(hosts=ON_RAY.hosts, plans=tuple(replace(p, delay=3) for p in WIDE.plans))


@example(tree=WIDE_TIMED, field="tokens", place="runtime")
@settings(ON_HOSTS, max_examples=1)
@given(tree=trees(delay=3), field=st.sampled_from(CAPPING), place=st.sampled_from(PLACES))
async def test_with_models_that_take_time_whole_sharing_spends_the_demand_exactly(
    make_hosts: MakeHosts, tree: Tree, field: str, place: str
) -> None:
    # Models that take time (up to 3 ms a call here) make siblings' requests overlap
    # as timing decides: under fair sharing a long reply is then cut at its share and
    # asked again at home as on hosts (the module's docstring). With whole sharing no
    # reply is cut by sharing however they overlap: every field that caps a request's
    # output at 1.1 x the demand completes exactly, without hosts and on them (every
    # field on LocalHosts, the drawn one on Ray, whose hosts take a second to start).
    need = await demand(tree, make_hosts)
    fields = CAPPING if make_hosts is LocalHosts else (field,)
    problems = []
    for name in fields:
        for hosts in (None, make_hosts):
            problems += await generous(tree, hosts, need, Case(name, place), "whole")
    assert not problems, "\n".join([f"{tree!r}: demand {shown(need.usage)}", *problems])
