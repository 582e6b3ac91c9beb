"""Scale-out on Ray: one fan-out across 2 Ray hosts, beside raw Ray actors.

The workload starts a Ray instance of its own on this machine (127.0.0.1, 8 CPUs,
no dashboard) and shuts it down when it is done.

- Fan-out: a lead agent whose one step calls 400 ``worker`` subagents at once (200
  per host), then answers; each worker makes one step of 10 zero-latency async tool
  calls, then answers (``CycleModel`` scripts: 10 input and 5 output tokens a
  request). fractor places the workers round-robin on the hosts of ``RayHosts(2)``,
  started once: only the lead's ask is timed. The baseline is what one writes by
  hand: 2 async Ray actors; the driver sends 400 calls (200 to each), each running
  the same worker loop (``raw_execution``: the same turns, argument decoding, task
  group and history), and awaits every answer. Wall of each, medians of
  interleaved rounds after a warm-up; target (DESIGN.md section 6): throughput at
  least 0.8 x the raw Ray actors.
- Host startup: ``Runtime(hosts=RayHosts(2))`` entered, against 2 raw Ray actors
  created and answering: reported, not judged (a runtime pays it once).
- Budgeted: the same fan-out in a runtime with a ``MemoryStore``, the lead under
  ``Budget(tokens=...)`` worth 60% of the tree's demand D (what an unbudgeted ask
  spends). What was spent is read from the stored traces of the ask's executions
  (every step's usage, the hosts' included): a record kept apart from the ledger's
  count. Reported: lease round trips (asks the driver's ledger answered, counted as
  below) per second of the ask's wall, beside the raw actors' calls per second;
  utilization (tokens spent over the budget). Judged: overshoot, how far what was
  spent or what the lead's ``Result`` counts went past the budget on any of its
  fields (target 0); and that the lead's ``Result`` counts what its tree spent, on
  every ask of this workload (D for an unbudgeted one). A budgeted ask that does not answer within
  ``HUNG_SECONDS`` is cancelled and reported as hung; no later one is run.
- Ledger round trips per 1,000 remote requests (issue 28), counted on the asks the
  Budgeted runtime makes anyway (no fan-out is run for them): the round trips from
  the host subtrees to the driver's ledger during an ask (the difference of
  ``rt.supervisor.ledger.asks`` around it: every ask the ledger answered, granted
  or refused, once the ledger counts refusals; a ledger that counts only the asks
  it granted undercounts a scarce run by its refusals), over the model requests the
  ask's remote workers spent (every traced step of an execution other than the
  lead's, which runs on the driver), x 1,000. Two rows: "no budget", the
  unbudgeted ask that measures D (target 0: no field is limited and the workers
  spawn nothing, so not even the agents cap needs a lease); "at 60% budget", every
  budgeted ask (median, min and max; target at most 2,000, 2 round trips a request,
  judged on the worst ask). The figure beside each is its target, and the ratio is
  1 when it holds, else 0.
- Cancel: a lead whose workers (100 a host, 20 when quick) each wait in a tool for a
  minute on their hosts; the lead's node is cancelled, and the time until the lead
  answers is measured: it answers once every remote worker has answered its stop
  (with its usage and traces). Target (DESIGN.md section 6): under 100 ms. Beside
  it, raw Ray: as many async actor calls sleeping a minute, each ``ray.cancel``-ed,
  until every one has ended.
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from dataclasses import dataclass
from typing import Any

import anyio
import ray
import sniffio

from fractor.actors import Agent, AgentRef, ModelResponse, ToolCall, collect_trace_tree, tool
from fractor.actors.integrations.ray import RayHosts
from fractor.runtime import Budget, MemoryStore, Runtime, Usage

from ._common import _USAGE, CycleModel, fanout_turns, raw_execution
from ._harness import Row, compare, judged, single, summarize

__all__ = ["run"]

HOSTS = 2
#: Tool calls in each worker's one step.
TOOL_CALLS = 10
#: Throughput target against the raw Ray actors (DESIGN.md section 6).
TARGET = 0.8
#: The budgeted tree's budget, as a share of its demand.
BUDGET_SHARE = 0.6
#: Target of the ledger round trips per 1,000 remote requests with no budget: none
#: (no field is limited, and the workers spawn nothing, so the agents cap needs none).
TRIPS_FREE = 0
#: Target of the ledger round trips per 1,000 remote requests at ``BUDGET_SHARE``:
#: at most 2 a request.
TRIPS_SCARCE = 2_000
#: A budgeted ask still unanswered after this long is cancelled and reported hung.
HUNG_SECONDS = 15.0
#: The Ray instance this workload starts for itself.
RAY_INIT: dict[str, Any] = {
    "num_cpus": 8,
    "include_dashboard": False,
    "address": "local",
    "_node_ip_address": "127.0.0.1",
    "log_to_driver": False,
    "logging_level": logging.ERROR,
}
_TASK = "Cover every part."


async def _echo(x: int) -> int:
    return x


#: The workers' tool: a module-level function, so Ray ships it by reference.
echo = tool(_echo, name="echo")


async def _nap(x: int) -> int:
    await anyio.sleep(NAP_SECONDS)
    return x


#: The cancelled workers' tool: waits a minute (unless cancelled).
nap = tool(_nap, name="nap")
#: How long a cancelled worker's tool would wait.
NAP_SECONDS = 60.0
#: Target of the time from cancelling a tree to its answer, remote subtrees included.
CANCEL_TARGET = 0.100

_WORKER_TURNS = fanout_turns("echo", TOOL_CALLS)


def _delegating(children: int) -> list[ModelResponse]:
    """One step calling ``children`` workers at once, then an answer."""
    calls = tuple(
        ToolCall(id=f"call_0_{i}", name="worker", arguments=f'{{"task": "part {i}"}}')
        for i in range(children)
    )
    return [
        ModelResponse(tool_calls=calls, usage=_USAGE, finish_reason="tool_calls"),
        ModelResponse(text="merged", usage=_USAGE),
    ]


def _lead(worker: Agent, children: int, budget: Budget | None = None) -> Agent:
    return Agent(
        "lead",
        CycleModel(_delegating(children)),
        subagents=[worker],
        tool_concurrency=children,
        budget=budget,
    )


class _RawHost:
    """The baseline's Ray actor: each call runs one worker's loop as plain code."""

    async def ready(self) -> None:
        return None

    async def work(self, task: str) -> str:
        return await raw_execution(_WORKER_TURNS, _echo, [], task)

    async def nap(self) -> None:
        await anyio.sleep(NAP_SECONDS)


_RawRayHost: Any = ray.remote(_RawHost)


async def _gather(refs: list[Any]) -> list[Any]:
    """Every answer: awaited on asyncio (Ray's refs are awaitable there), fetched in a
    worker thread on trio (as ``RayHosts`` does)."""
    if sniffio.current_async_library() == "asyncio":
        return [await ref for ref in refs]
    answers: list[Any] = await anyio.to_thread.run_sync(ray.get, refs)
    return answers


async def _raw_hosts() -> tuple[list[Any], float]:
    """The baseline's actors, made as ``RayHosts`` makes its own; and how long they
    took to answer."""
    began = time.perf_counter()
    hosts = [
        _RawRayHost.options(num_cpus=1, max_concurrency=100_000).remote() for _ in range(HOSTS)
    ]
    await _gather([host.ready.remote() for host in hosts])
    return hosts, time.perf_counter() - began


def _remote_requests(traces: Any, execution_id: str) -> int:
    """The model requests the workers of the ask ``execution_id`` spent: those of
    every execution of ``traces`` but the lead's own (the lead runs on the driver,
    every worker on a host)."""
    return sum(
        step.usage.requests
        for trace in traces
        if trace.execution_id != execution_id
        for step in trace.steps
    )


def _spent(traces: Any) -> Usage:
    """What the executions of ``traces`` spent: their steps' usage, and the calls of
    the workers' tool they ran (calls of subagents are no tool calls)."""
    total = Usage()
    for trace in traces:
        for step in trace.steps:
            calls = sum(outcome.call.name == echo.name for outcome in step.outcomes)
            total = total + step.usage + Usage(tool_calls=calls)
    return total


def _overshoot(spent: Usage, budget: Budget) -> float:
    """How far ``spent`` went past ``budget`` on its worst field, as a share of it."""
    used = {
        "tokens": spent.total_tokens,
        "input_tokens": spent.input_tokens,
        "output_tokens": spent.output_tokens,
        "requests": spent.requests,
        "tool_calls": spent.tool_calls,
        "cost": spent.cost,
    }
    worst = 0.0
    for name, value in used.items():
        limit = getattr(budget, name)
        if limit is not None:
            worst = max(worst, (value - limit) / limit if limit else float(value > 0))
    return worst


@dataclass(frozen=True, slots=True)
class _Ask:
    """One ask of the ``MemoryStore`` runtime: its wall, the round trips its host
    subtrees made to the driver's ledger, what its tree spent (per the traces), the
    model requests its remote workers spent (per their traces) and what the lead's
    ``Result`` counts."""

    seconds: float
    asks: int
    spent: Usage
    remote_requests: int
    counted: Usage

    def trips(self) -> float:
        """Ledger round trips per 1,000 remote requests (a run of none counts as
        one, so round trips without any request still show)."""
        return 1000 * self.asks / max(self.remote_requests, 1)


async def _fanout(
    lead: Agent, raw: list[Any], children: int, repeats: int
) -> tuple[Row, float, list[Usage]]:
    """The fan-out row, the hosts' startup, and what each of fractor's asks counted."""
    counted: list[Usage] = []
    began = time.perf_counter()
    async with Runtime(hosts=RayHosts(HOSTS)) as rt:
        startup = time.perf_counter() - began
        ref = await rt.spawn(lead)

        async def fractor() -> None:
            result = await ref.ask(_TASK)
            if result.status != "completed":
                raise RuntimeError(f"the fan-out ended {result.status!r}: {result.stop_reason}")
            counted.append(result.usage)

        async def baseline() -> None:
            refs = [raw[i % HOSTS].work.remote(f"part {i}") for i in range(children)]
            answers = await _gather(refs)
            if answers != ["done"] * children:
                raise RuntimeError(f"the raw fan-out answered {set(answers)!r}")

        row = await compare(
            f"Scale-out: {HOSTS} hosts x {children // HOSTS} agents x {TOOL_CALLS} tools",
            fractor=fractor,
            baseline=baseline,
            operations=1,
            repeats=repeats,
            better="lower",
            min_ratio=TARGET,
        )
    row = judged(row, f"throughput >= {TARGET:g} x raw Ray", row.ratio >= TARGET)
    return row, startup, counted


async def _budgeted(
    worker: Agent, children: int, repeats: int
) -> tuple[_Ask, Budget, list[_Ask], int, float]:
    """The unbudgeted ask (its spend is the demand D), the budget, the budgeted asks
    that answered, how many hung, and the hosts' startup."""
    store = MemoryStore()
    began = time.perf_counter()
    async with Runtime(hosts=RayHosts(HOSTS), store=store) as rt:
        startup = time.perf_counter() - began
        free = await rt.spawn(_lead(worker, children))
        unbudgeted = await _budgeted_ask(rt, free, store, complete=True)
        if unbudgeted is None:
            raise RuntimeError(f"the unbudgeted fan-out hung > {HUNG_SECONDS:g} s")
        budget = Budget(tokens=int(BUDGET_SHARE * unbudgeted.spent.total_tokens))
        lead = await rt.spawn(_lead(worker, children, budget))
        asks: list[_Ask] = []
        hung = 0
        for _ in range(repeats):
            done = await _budgeted_ask(rt, lead, store)
            if done is None:
                hung += 1
                break  # the ledger is stuck: a next ask would wait behind this one
            asks.append(done)
    return unbudgeted, budget, asks, hung, startup


async def _budgeted_ask(
    rt: Runtime, lead: AgentRef, store: MemoryStore, *, complete: bool = False
) -> _Ask | None:
    """One ask of ``lead``, with the ledger's count of round trips around it (what
    ``Ledger.asks`` counts: see the module docstring); None if it hung. With
    ``complete``, an ask that does not complete raises."""
    ledger = rt.supervisor.ledger
    before = ledger.asks
    began = time.perf_counter()
    with anyio.move_on_after(HUNG_SECONDS):
        result = await lead.ask(_TASK)
        seconds = time.perf_counter() - began
        trips = ledger.asks - before
        if complete and result.status != "completed":
            raise RuntimeError(f"the unbudgeted fan-out ended {result.status!r}")
        traces = await collect_trace_tree(store, result.execution_id)
        remote = _remote_requests(traces, result.execution_id)
        return _Ask(seconds, trips, _spent(traces), remote, result.usage)
    return None


def _rows(
    fanout: Row,
    startups: list[float],
    raw_startup: float,
    unbudgeted: _Ask,
    counted: list[Usage],
    budget: Budget,
    asks: list[_Ask],
    hung: int,
    children: int,
) -> list[Row]:
    share = f"at {BUDGET_SHARE:.0%} budget"
    started = summarize(
        f"  host startup, {HOSTS} Ray hosts", "s", startups, [raw_startup], better="lower"
    )
    rows = [fanout, judged(started, "reported, paid once", True)]
    stuck = f"; {hung} ask hung > {HUNG_SECONDS:g} s" if hung else ""
    raw_calls = children / fanout.baseline
    if asks:
        leases = summarize(
            f"  lease asks/s {share} / raw calls/s",
            "ops/s",
            [ask.asks / ask.seconds for ask in asks],
            [raw_calls],
            better="higher",
        )
        limit = budget.tokens or 1
        used = summarize(
            f"  utilization {share}",
            "x",
            [ask.spent.total_tokens / limit for ask in asks],
            [1.0],
            better="higher",
        )
        rows += [judged(leases, f"reported{stuck}", not hung), judged(used, "reported", True)]
    else:
        rows.append(_single(f"  lease asks/s {share} / raw calls/s", "ops/s", 0.0, raw_calls))
        rows[-1] = judged(rows[-1], f"every budgeted ask hung > {HUNG_SECONDS:g} s", False)
    rows += _trips(unbudgeted, asks, hung)
    over = [max(_overshoot(a.spent, budget), _overshoot(a.counted, budget)) for a in asks]
    worst = max(over, default=0.0)
    overshoot = _single(f"  overshoot {share}", "x", worst, 0.0, ratio=float(worst <= 0))
    rows.append(judged(overshoot, "== 0, spent and counted", worst <= 0))
    # What the lead's Result counts, against what its tree spent: D for each
    # unbudgeted ask, the traced spend for each budgeted one.
    demand = unbudgeted.spent
    pairs = [(usage, demand) for usage in counted] + [(a.counted, a.spent) for a in asks]
    shares = [usage.total_tokens / spent.total_tokens for usage, spent in pairs]
    exact = sum(usage == spent for usage, spent in pairs)
    worst_share = max(shares, key=lambda share: abs(share - 1), default=1.0)
    share_row = _single("  usage counted / spent, worst ask", "x", worst_share, 1.0)
    rows.append(
        judged(share_row, f"== 1 on every field ({exact}/{len(pairs)} asks)", exact == len(pairs))
    )
    return rows


def _trips(unbudgeted: _Ask, asks: list[_Ask], hung: int) -> list[Row]:
    """The two rows of ledger round trips per 1,000 remote requests: the unbudgeted
    ask's (target ``TRIPS_FREE``) and the budgeted asks' (median, min and max over
    the asks; target ``TRIPS_SCARCE``, judged on the worst ask). The figure beside
    each is its target; the ratio is 1 when it holds, else 0."""
    free = unbudgeted.trips()
    rows = [
        _trips_row(
            "no budget",
            [free],
            TRIPS_FREE,
            f"== {TRIPS_FREE:,} (no worker spawns: no agents to lease)",
        )
    ]
    stuck = f"; {hung} ask hung > {HUNG_SECONDS:g} s" if hung else ""
    if asks:
        scarce = [ask.trips() for ask in asks]
        target = f"<= {TRIPS_SCARCE:,} (2 a request), every ask{stuck}"
        rows.append(_trips_row(f"at {BUDGET_SHARE:.0%} budget", scarce, TRIPS_SCARCE, target))
    else:
        missed = f"every budgeted ask hung > {HUNG_SECONDS:g} s"
        row = _trips_row(f"at {BUDGET_SHARE:.0%} budget", [0.0], TRIPS_SCARCE, missed)
        rows.append(judged(row, missed, False))
    return rows


def _trips_row(when: str, samples: list[float], target: int, says: str) -> Row:
    """A row of round trips per 1,000 remote requests, judged on its worst sample."""
    holds = max(samples) <= target
    return Row(
        workload=f"  ledger round trips per 1,000 remote requests, {when}",
        unit="x",
        fractor=statistics.median(samples),
        baseline=float(target),
        fractor_min=min(samples),
        fractor_max=max(samples),
        baseline_min=float(target),
        baseline_max=float(target),
        ratio=float(holds),
        target=says,
        holds=holds,
    )


def _single(
    workload: str, unit: str, ours: float, raw: float, *, ratio: float | None = None
) -> Row:
    """A row of one figure a side (unjudged); ``ratio`` is ours / raw unless given."""
    if ratio is None:
        ratio = ours / raw if raw else 1.0
    return single(workload, unit, ours, raw, ratio=ratio)


async def _scaleout(children: int, repeats: int) -> list[Row]:
    worker = Agent("worker", CycleModel(_WORKER_TURNS), tools=[echo])
    raw, raw_startup = await _raw_hosts()
    try:
        fanout, startup, counted = await _fanout(_lead(worker, children), raw, children, repeats)
    finally:
        for host in raw:
            ray.kill(host, no_restart=True)
    unbudgeted, budget, asks, hung, startup_store = await _budgeted(worker, children, repeats)
    return _rows(
        fanout,
        [startup, startup_store],
        raw_startup,
        unbudgeted,
        counted,
        budget,
        asks,
        hung,
        children,
    )


async def _cancel_fractor(children: int) -> float:
    """Seconds from cancelling a lead to its answer, its workers napping on hosts."""
    worker = Agent("worker", CycleModel(fanout_turns("nap", 1)), tools=[nap])
    async with Runtime(hosts=RayHosts(HOSTS)) as rt:
        lead = await rt.spawn(_lead(worker, children))
        seconds = 0.0
        async with anyio.create_task_group() as tg:
            answered = anyio.Event()

            async def ask() -> None:
                await lead.ask(_TASK)
                answered.set()

            tg.start_soon(ask)
            with anyio.fail_after(60):
                while not _napping(rt, children):  # noqa: ASYNC110 (other processes' state)
                    await anyio.sleep(0.02)
            await anyio.sleep(0.2)  # every tool is waiting on its host
            node = next(n for n in rt.tree().nodes if n.name == "lead")
            began = time.perf_counter()
            rt.supervisor.cancel(node.id)
            await answered.wait()
            seconds = time.perf_counter() - began
    return seconds


def _napping(rt: Runtime, children: int) -> bool:
    """Whether every worker runs on its host, its tool started (a snapshot came)."""
    tree = rt.tree()
    workers = [n for n in tree.nodes if n.name == "worker"]
    return len(workers) == children and all(n.usage.tool_calls for n in workers)


async def _cancel_raw(children: int) -> float:
    """Seconds from cancelling as many raw Ray calls to their all having ended."""
    hosts, _ = await _raw_hosts()
    try:
        refs = [hosts[i % HOSTS].nap.remote() for i in range(children)]
        await anyio.sleep(0.4)
        began = time.perf_counter()
        for ref in refs:
            ray.cancel(ref)
        for ref in refs:
            with contextlib.suppress(
                ray.exceptions.TaskCancelledError, ray.exceptions.RayTaskError
            ):
                await _gather([ref])
        return time.perf_counter() - began
    finally:
        for host in hosts:
            ray.kill(host, no_restart=True)


async def _cancel(children: int, repeats: int) -> Row:
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(repeats):
        ours.append(await _cancel_fractor(children))
        raw.append(await _cancel_raw(children))
    row = summarize(
        f"  cancel {children} remote agents, to the answer", "s", ours, raw, better="lower"
    )
    return judged(row, "< 100 ms", row.fractor < CANCEL_TARGET)


async def run(*, quick: bool = False) -> list[Row]:
    """The rows: 2 hosts x 200 agents (20 when quick)."""
    children = HOSTS * (20 if quick else 200)
    repeats = 3 if quick else 7
    await anyio.to_thread.run_sync(lambda: ray.init(**RAY_INIT))
    try:
        with anyio.fail_after(600):
            rows = await _scaleout(children, repeats)
            rows.insert(2, await _cancel(HOSTS * (20 if quick else 100), 3))
            return rows
    finally:
        await anyio.to_thread.run_sync(ray.shutdown)
