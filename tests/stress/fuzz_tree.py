"""One fuzz tree run for real, and its invariants checked as it goes (DESIGN.md 5).

``TreeRun(plan).run()`` opens a ``Runtime`` (with the plan's budget, caps, token
settings and store), spawns the top-level agents, then for each round of the plan
starts its operations at once: asks (plain, under a cancel scope that expires, with
an ask timeout), tells, conversation snapshots, the cancellation of a running
execution through the supervisor or of a whole actor. After each round it waits
until nothing runs and checks every top-level agent's conversation, traces and
stored state, and respawns a cancelled agent (from the store, if it persists). A
probe ask on every agent ends the run. When the runtime's block is left, it checks
the final tree, every ``Result``, every request every model received, the stored
traces, and that nothing is left running, waiting or pending, no task included.

Tree snapshots are also checked at every model request and, when the plan observes
the tree's events, at every ``execution_end``; every event is round-tripped.

**Across hosts** (``Plan.hosts``): the runtime places the children of its top-level
executions on ``LocalHosts``, and every check above holds of the whole tree as the
driver sees it, plus what hosts add: each host's own tree keeps the invariants too
(its subtrees' tops within their leases), settled usage plus what leases hold stays
within every limit here, a placed subtree stays whole on its host, and once the
runtime ends no lease is live and all they still hold is what lost hosts took. When
the plan kills a host (``Plan.kill``), each subtree running there answers ``failed``
with "host '<name>' lost" in its reason, unless its agent's restart policy placed it
again on the other host (or its answer was already on its way); a lost subtree's
nodes stay in the driver's tree as their host last sent them.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import anyio
import anyio.abc

from fractor.actors import (
    Agent,
    Compaction,
    ExecutionTrace,
    FunctionModel,
    RestartPolicy,
    Result,
    RetryPolicy,
    StepRecord,
    Task,
)
from fractor.actors._hosts._host import AgentHost
from fractor.actors._messages import safe_text
from fractor.actors._observation._events import WireEvent
from fractor.runtime import (
    ActorStopped,
    AskTimeout,
    Budget,
    Event,
    MemoryStore,
    Price,
    Runtime,
    SQLiteStore,
    Store,
)

from .fuzz_checks import check_held, check_tree, marker, remote_tops, round_trip
from .fuzz_faults import MODEL, PROBE, TOOLS, FaultyModel, Hosts, Script
from .fuzz_faults import _hit as hit
from .fuzz_final import SECONDS_SLACK, check_after
from .fuzz_memory import (
    SUMMARIZER,
    Summarizer,
)
from .fuzz_plan import ASKS, Kill, Op, Plan, Spec
from .fuzz_tops import Top, check_top, look, respawn, spawn

if TYPE_CHECKING:
    from fractor.actors._hosts._remote import RemoteChild

__all__ = ["PRICE", "SECONDS_SLACK", "TreeReport", "TreeRun"]

PRICE = Price(input_per_million=1_000, output_per_million=4_000)


@dataclass
class TreeReport:
    seed: int
    backend: str
    violations: list[str]
    executions: int = 0
    asks: int = 0
    snapshots: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    #: The limits that stopped an execution (a budget's field, or a cap's).
    limits: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


class TreeRun:
    """Runs one plan and collects what it breaks."""

    def __init__(self, plan: Plan, backend: str, skip: frozenset[str] = frozenset()) -> None:
        self.plan = plan
        #: Model and garbage faults not to inject (to look past a known violation).
        self.skip = skip
        self.report = TreeReport(seed=plan.seed, backend=backend, violations=[])
        self.violations = self.report.violations
        self.faults = self.report.faults
        self.specs = {spec.name: spec for top in plan.tops for spec in top.walk()}
        self.ancestors: dict[str, frozenset[str]] = {}
        for top in plan.tops:
            self._note_ancestors(top, frozenset())
        self.models: dict[str, FunctionModel] = {}
        self.rt: Runtime | None = None
        self.store: Store | None = None
        self.tops: list[Top] = []
        #: (top, the ask's budget, its Result): checked against the final tree.
        self.results: list[tuple[Spec, Budget | None, Result]] = []
        self.hosts: Hosts | None = None
        #: The host the plan killed ("" until it is), and the stand-ins of the subtrees
        #: that ran on it then, by node id.
        self.killed = ""
        self.doomed: dict[str, RemoteChild] = {}
        #: Every event seen (when the plan observes them).
        self.events: list[Event] = []
        #: The separate summarizers' models, by agent name.
        self.summarizers: dict[str, FunctionModel] = {}
        #: Every top-level trace seen, by execution id (checked after the runtime).
        self.seen: dict[str, ExecutionTrace] = {}

    def _note_ancestors(self, spec: Spec, above: frozenset[str]) -> None:
        self.ancestors[spec.name] = above
        for child in spec.children:
            self._note_ancestors(child, above | {spec.name})

    def violate(self, found: Sequence[str]) -> None:
        self.violations.extend(found)

    def at_request(self) -> None:
        """Invariant 4 on the tree as it is when a model request is served."""
        if self.rt is not None:
            self.snapshot("a snapshot at a model request")

    def snapshot(self, where: str) -> None:
        """Invariant 4 on the tree as the driver sees it, on what leases hold here, and
        on each live host's own tree."""
        rt = self.rt
        assert rt is not None
        self.report.snapshots += 1
        tree = rt.tree()
        # A subtree's top here is charged by every report; its nodes below are as
        # their host last sent them: the top may be ahead of them.
        lagging = {node.id for node in remote_tops(tree)}
        self.violate(
            check_tree(
                tree,
                caps=self.plan.caps,
                seconds_slack=SECONDS_SLACK,
                where=where,
                lagging=lagging,
            )
        )
        if self.hosts is None:
            return
        self.violate(check_held(list(rt.supervisor.nodes.values()), where))
        for name, host in self.live_hosts():
            assert host.runtime is not None
            self.violate(
                check_tree(
                    host.runtime.tree(),
                    caps=None,
                    seconds_slack=SECONDS_SLACK,
                    where=f"{where}, on host {name!r}",
                )
            )

    def live_hosts(self) -> list[tuple[str, AgentHost]]:
        """The hosts of the tree that were not killed, by name."""
        if self.hosts is None:
            return []
        found = []
        for link in self.hosts.links:
            host = getattr(link, "host", None)
            if isinstance(host, AgentHost) and link.name != self.killed:
                found.append((link.name, host))
        return found

    def build(self, spec: Spec) -> Agent:
        script = Script(spec, self.plan, skip=self.skip, on_request=self.at_request)
        model = self.models[spec.name] = FunctionModel(script, name=MODEL)
        stop_after = spec.stop_after

        def stop_when(record: StepRecord) -> bool:
            return stop_after is not None and record.index + 1 >= stop_after

        memory = None
        if spec.memory is not None:
            summarizer = None
            if spec.memory.separate:
                function = Summarizer(
                    self.plan.seed, spec.name, deadline=spec.deadline, on_request=self.at_request
                )
                summarizer = FunctionModel(function, name=SUMMARIZER)
                self.summarizers[spec.name] = summarizer
            memory = Compaction(
                threshold=spec.memory.threshold,
                keep=spec.memory.keep,
                model=summarizer,
                clear_results=spec.memory.clear,
            )
        return Agent(
            spec.name,
            FaultyModel(model),
            tools=[TOOLS[name] for name in spec.tools],
            instructions=f"You are {marker(spec.name)}.",
            subagents=[self.build(child) for child in spec.children],
            budget=spec.budget,
            description="Works for its parent.",
            tool_concurrency=spec.tool_concurrency,
            stop_when=stop_when if stop_after is not None else None,
            max_tokens=spec.max_tokens,
            retry=RetryPolicy(retries=spec.retries, initial_delay=0.001, max_delay=0.004),
            restart=RestartPolicy(max_restarts=spec.restarts, digest=spec.digest),
            escalate=spec.escalate,
            memory=memory,
        )

    async def run(self) -> None:
        plan = self.plan
        before = {task.id for task in anyio.get_running_tasks()}
        if plan.store == "sqlite":
            async with (
                anyio.TemporaryDirectory() as directory,
                SQLiteStore(os.path.join(directory, "fuzz.db")) as store,
            ):
                await self._run(store, before)
        elif plan.store == "memory":
            async with MemoryStore() as memory:
                await self._run(memory, before)
        else:
            await self._run(None, before)

    async def _run(self, store: Store | None, before: set[int]) -> None:
        plan = self.plan
        if store is not None:
            hit(f"store_{plan.store}")
        self.store = store
        if plan.hosts:
            hit("hosts")
            self.hosts = Hosts(plan.hosts)
        rt = self.rt = Runtime(
            hosts=self.hosts,
            budget=plan.runtime_budget,
            prices={MODEL: PRICE, SUMMARIZER: PRICE},
            grace=1.0,
            store=store,
            min_output_tokens=plan.min_output,
            default_max_tokens=plan.default_max_tokens,
            caps=plan.caps,
        )
        async with rt, anyio.create_task_group() as tg:
            if plan.observe:
                await tg.start(self._watch)
            if self.hosts is not None and plan.kill is not None:
                tg.start_soon(self._kill, self.hosts, plan.kill)
            await self._drive()
            tg.cancel_scope.cancel()
        await check_after(self, rt, before)

    async def _watch(self, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        """Invariants 6 on every event and 4 on the tree at every ``execution_end``;
        every event is kept, to be checked against the final tree."""
        assert self.rt is not None
        async with self.rt.events(10_000) as events:
            task_status.started()
            async for event in events:
                hit("events")
                self.events.append(event)
                # As the agent layer decodes it: its detail typed by its kind (invariant 6)
                self.violate(round_trip(event, WireEvent, f"a {event.kind} event"))
                if event.kind == "execution_end":
                    self.snapshot("a snapshot at an execution_end event")

    async def _kill(self, hosts: Hosts, kill: Kill) -> None:
        """Kill one host at the plan's moment, as a crash would (first, if the plan
        says so, wait until enough subtrees were placed there)."""
        name = f"default-{kill.host}"
        link = await hosts.wait_placed(name, kill.placed)
        await anyio.sleep(kill.delay)
        self.doomed = {child.node.id: child for child in link.runs.values()}
        self.killed = name
        hit("host_kill")
        hosts.kill(name)

    # -- from outside ------------------------------------------------------------------------

    async def _drive(self) -> None:
        for index, spec in enumerate(self.plan.tops):
            top = await spawn(self, index, spec)
            if top.start.messages or top.start.summary:
                self.violate([f"2: {spec.name} resumed {top.start!r:.200} from a new store"])
            self.tops.append(top)
        for number, ops in enumerate(self.plan.rounds):
            if sum(op.kind in ASKS for op in ops) > 1:
                hit("concurrent_asks")
            replies: list[int] = []
            async with anyio.create_task_group() as tg:
                for index, op in enumerate(ops):
                    tg.start_soon(self._op, number, index, op, replies)
            asked = [index for index, op in enumerate(ops) if op.kind in ASKS]
            if sorted(replies) != asked:
                self.violate([f"5: round {number}: asks {asked} got replies {sorted(replies)}"])
            await self._settle(f"after round {number}")
            await respawn(self)
        for top in self.tops:
            text = f"{marker(top.spec.name)} {PROBE}"
            try:
                result = await top.ref.ask(text)
            except Exception as exc:
                self.violate([f"5: the probe of {top.spec.name} raised {_described(exc)}"])
                continue
            self._keep(top, None, result)
            if (
                self.plan.runtime_budget is None
                and top.spec.budget is None
                and (result.status, result.text)
                != ("completed", f"{marker(top.spec.name)} probe answer")
            ):
                self.violate([f"5: the probe of {top.spec.name} answered {result!r:.300}"])
        await self._settle("after the probes")

    async def _op(self, number: int, index: int, op: Op, replies: list[int]) -> None:
        top = self.tops[op.top]
        rt = self.rt
        assert rt is not None
        if op.kind in ("look", "cancel_node", "cancel_actor"):
            await anyio.sleep(op.delay)
            if op.kind == "cancel_node":
                running = sorted(
                    n.id for n in rt.tree().nodes if n.status == "running" and n.id != "root"
                )
                if running:
                    hit("node_cancel")
                    rt.supervisor.cancel(running[int(op.pick * len(running))])
            elif op.kind == "cancel_actor":
                if not top.cancelled:
                    hit("actor_cancel")
                    top.cancelled = True
                    top.ref.cancel()
            else:
                await look(self, top)
            return
        me = marker(top.spec.name)
        text = f"{me} task {number}.{index}" + (" \ud800" if op.surrogate else "")
        if op.resume:
            top.resumes.add(safe_text(text))
        if op.surrogate:
            hit("ask_surrogate")
        if op.kind == "tell":
            hit("tell")
            try:
                await top.ref.tell(text, budget=op.budget)
            except ActorStopped:
                if not top.cancelled:
                    self.violate([f"5: a tell to the live {top.spec.name} was refused"])
            return
        self.report.asks += 1
        result: Result | None = None
        try:
            if op.kind == "ask":
                result = await top.ref.ask(text, budget=op.budget, resume=op.resume)
            elif op.kind == "scope":
                with anyio.move_on_after(op.delay) as scope:
                    result = await top.ref.ask(text, budget=op.budget, resume=op.resume)
                if scope.cancelled_caught:
                    hit("ask_cancel_scope")
            else:
                task = Task(text=text, budget=op.budget, resume=op.resume)
                self.violate(round_trip(task, Task, "a Task"))
                answer: object = await top.ref.actor.ask(task, timeout=op.delay)
                if not isinstance(answer, Result):
                    self.violate([f"5: an ask to {top.spec.name} answered {answer!r:.200}"])
                else:
                    result = answer
        except AskTimeout:
            hit("ask_timeout")
        except ActorStopped:
            if not top.cancelled:
                self.violate([f"5: an ask to the live {top.spec.name} raised ActorStopped"])
        except Exception as exc:
            self.violate([f"5: an ask to {top.spec.name} raised {_described(exc)}"])
        replies.append(index)
        if result is not None:
            self._keep(top, op.budget, result)

    def _keep(self, top: Top, budget: Budget | None, result: Result) -> None:
        self.violate(round_trip(result, Result, "a Result"))
        self.results.append((top.spec, budget, result))
        if result.execution_id:
            top.results[result.execution_id] = result
        else:
            hit("refused_turn")

    async def _settle(self, where: str) -> None:
        """Wait until nothing runs (abandoned children unwind, withdrawn asks finish in
        their actors), then check each live top-level agent's conversation and store."""
        rt = self.rt
        assert rt is not None
        quiet = 0
        while quiet < 2:
            await anyio.sleep(0.002)
            quiet = quiet + 1 if self._quiet() else 0
        statistics = rt.statistics()
        if statistics.pending_asks or statistics.budget_waiting:
            self.violate([f"5: {where}: {statistics!r}"])
        for name, host in self.live_hosts():
            assert host.runtime is not None
            statistics = host.runtime.statistics()
            if statistics.pending_asks or statistics.budget_waiting:
                self.violate([f"5: {where}, on host {name!r}: {statistics!r}"])
        for top in self.tops:
            if not top.cancelled:
                await check_top(self, top)

    def _quiet(self) -> bool:
        rt = self.rt
        assert rt is not None
        if len(rt.supervisor.nodes) > 1:
            return False
        live = [top for top in self.tops if not top.cancelled]
        if rt.statistics().live_actors != len(live):
            return False
        for _, host in self.live_hosts():
            assert host.runtime is not None
            if host.load or host.runtime.statistics().live_actors:
                return False
        return all(top.ref.statistics().queued == 0 for top in live)


def _described(exc: BaseException) -> str:
    """An unexpected exception and where it was raised: its last three frames."""
    frames = traceback.extract_tb(exc.__traceback__)[-3:]
    where = "; ".join(f"{os.path.basename(f.filename)}:{f.lineno} {f.name}" for f in frames)
    return f"{type(exc).__name__}: {exc!r:.300} (at {where})"
